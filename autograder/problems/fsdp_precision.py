"""Mixed precision under FSDP: a learner's ``shard_layers(model, param_dtype=torch.bfloat16,
reduce_dtype=torch.float32)``, the policy of FSDP2's ``MixedPrecisionPolicy``, trained on
N ranks, graded on the bytes each collective moves and on one process's losses under the
same policy.

``fsdp/precision`` calls the learner's function on every rank of a gloo group with the
policy's two dtypes, then trains the sharded model for three AdamW steps in the grader's
loop, as ``fsdp/zero3`` does (``fsdp.py``: the same inputs, model and loop). Graded, the
exact evidence first:

* the master weights: the parameters returned for the optimizer are fp32, a shard of each
  block a rank, and AdamW's state after training holds two fp32 moments of them, to the
  byte;
* the calls of each step, from every rank's record, as ``fsdp/zero3`` grades them (one
  all-gather a block in forward and one in backward, one reduce-scatter a block, their
  sizes in elements, at most two blocks whole at once); and their dtypes and bytes: every
  all-gather moves the block's shard in bf16, 2 bytes an element, every reduce-scatter
  its whole padded gradient in fp32, 4;
* the compute: as each layer of each block (its Linears and LayerNorms) runs, in every
  step, its weight and its input are bf16;
* the numbers: each step's loss (the mean over ranks) and gradient norm against one
  process under the same policy (``reference``), which keeps fp32 master weights, runs
  each rank's slice on a bf16 copy of them and averages the gradients in fp32. Within
  ``RELATIVE``, fsdp/zero3's bar: the same bf16 arithmetic on the same numbers, so in
  practice they are equal;
* the memory a rank holds between steps, as ``fsdp/zero3`` bounds it.

FSDP2's own ``fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
reduce_dtype=torch.float32))`` passes: its parameters are DTensors, fp32 and sharded, and
its collectives move what the course's do. Every block's parameters split evenly over N
here (each dimension a multiple of N), so that FSDP2's shards, padded parameter by
parameter, and the course's, padded block by block, are the same size.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist

from ..device import one_cpu_thread
from ..evidence.compare import CaseResult, Comparison
from ..evidence.live_memory import freeze, local_part, storage_bytes
from ..problem import Case, Cost, register
from ..ranks import RanksProblem, record
from ..ranks.problem import world_size
from ..ranks.record import RankLog
from ..ranks.report import forged_marks
from .fsdp import (
    ALL_GATHERS,
    LR,
    REDUCE_SCATTERS,
    account_memory,
    block_sizes,
    calls_cause,
    cut_step,
    inputs_maker,
    make_model,
    memory_bound,
    memory_cause,
    rank_case,
    relative_error,
    train_step,
    watch_blocks,
)

PARAM_DTYPE, REDUCE_DTYPE, MASTER_DTYPE = torch.bfloat16, torch.float32, torch.float32
STEPS = 3  # enough for the optimizer's steps to show in the losses; each costs the ranks
# Measured on 20 draws each (2 and 3 ranks): the course's sharding and FSDP2's agree with
# the reference to 3e-16 (the same bf16 arithmetic on the same numbers, one thread each;
# the fp32 sum of a few bf16 gradients is exact but for rare pairs of far-apart exponents,
# so the order of the ranks does not show). The bar is fsdp/zero3's. The slips land at
# 2e-5 and above: a block partly in fp32, 2e-5 at the first step; blocks computed in fp32,
# 1e-3; bf16 master weights, 7e-4 at the second step; gradients reduce-scattered in bf16,
# 1e-4 to 5e-4 over three steps.
RELATIVE = 1e-6
HARNESS_MARKS = ("invalid", "master", "compute", "state")


# A block holds 12·dim² + 13·dim parameters, 7224 at dim 24: every dimension of every
# parameter a multiple of N, so no layout pads.
CASES = [rank_case(2, dim=24, layers=3), rank_case(3, dim=24, layers=2)]


def make_inputs(case: Case, generator: torch.Generator, device: torch.device) -> list[tuple]:
    """fsdp/zero3's inputs (the weights' seed, each rank's slices of the batches), for the
    first ``STEPS`` steps."""
    return [(setup, x[:STEPS], y[:STEPS])
            for setup, x, y in inputs_maker(False)(case, generator, device)]


# --- on each rank: the grader's training loop ---------------------------------------------------


def _params_wrong(params: object, sizes: list[int], world: int) -> str:
    if not isinstance(params, (list, tuple)) or not params or not all(
            isinstance(p, torch.Tensor) and p.requires_grad for p in params):
        return (f"shard_layers returned {type(params).__name__}: return the parameters the "
                "optimizer steps, a list of nn.Parameter")
    held = sum(local_part(p).numel() for p in params)
    want = sum(math.ceil(size / world) for size in sizes)
    if held != want:
        return (f"the parameters returned for the optimizer hold {held:,} elements on this "
                f"rank; sharded over {world} ranks, each rank keeps ⌈numel/N⌉ of every "
                f"block's, {want:,} in all")
    return ""


def _watch_compute(model: torch.nn.Module) -> list[dict]:
    """As each layer of each block computes, in every forward: the dtypes of its weight and
    of its input (hooked after the learner's hooks on the block, which gather the weights
    and cast the input). One entry a block: each layer's name, and the dtypes it was seen
    with, "weight/input"."""
    seen: list[dict] = [{} for _ in model.blocks]

    def note(index: int, name: str):
        def hook(module, args) -> None:
            x = args[0] if args else None
            pair = f"{_name(module.weight.dtype)}/" + (
                _name(x.dtype) if isinstance(x, torch.Tensor) else "none")
            dtypes = seen[index].setdefault(name, [])
            if pair not in dtypes:
                dtypes.append(pair)
        return hook

    for index, block in enumerate(model.blocks):
        for name, layer in block.named_modules():
            if isinstance(layer, (torch.nn.Linear, torch.nn.LayerNorm)):
                layer.register_forward_pre_hook(note(index, name))
    return seen


def train(candidate, setup: tuple, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Shard the model with the learner's function under the policy and train it for
    len(x) steps: per step, this rank's loss and its shards' squared gradient norm. Marks
    what the grader sees on the way: the dtypes of what the optimizer steps, the memory
    held between steps, the dtypes each layer computed in, AdamW's state after training."""
    from rooflab.kernels.fsdp import loss_fn

    sentinel = freeze()
    dim, heads, layers, seed, _ = setup
    model = make_model(dim, heads, layers, seed)
    sizes = block_sizes(model)
    params = candidate(model, param_dtype=PARAM_DTYPE, reduce_dtype=REDUCE_DTYPE)
    wrong = _params_wrong(params, sizes, dist.get_world_size())
    if wrong:
        record.mark("invalid", why=wrong)
        return torch.empty(0)
    record.mark("master", dtypes=sorted({str(p.dtype)[6:] for p in params}))
    watch_blocks(model, prefetch=False)
    computed = _watch_compute(model)
    optimizer = torch.optim.AdamW(params, lr=LR)
    seen = []
    account_memory(candidate, sentinel, "before the first step")
    for step in range(len(x)):
        seen.append(train_step(model, params, optimizer, loss_fn, x[step], y[step], step))
        account_memory(candidate, sentinel, f"after step {step}")
    record.mark("compute", blocks=computed)
    moments = [local_part(value) for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor) and value.dim()]
    record.mark("state", held=storage_bytes(moments),
                dtypes=sorted({str(m.dtype)[6:] for m in moments}))
    return torch.tensor(seen, dtype=torch.float64)


# --- in the grader: the reference and the verdict ------------------------------------------------


def reference(setup: tuple, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> torch.Tensor:
    """Per step, the loss and gradient norm of one process under the policy: fp32 master
    weights and AdamW; each rank's slice in turn on a bf16 copy of the weights, its input
    cast to bf16; the bf16 gradients cast to fp32, summed in rank order, divided by N."""
    from rooflab.kernels.fsdp import loss_fn

    dim, heads, layers, seed, _ = setup
    with one_cpu_thread():
        master = make_model(dim, heads, layers, seed)
        optimizer = torch.optim.AdamW(master.parameters(), lr=LR)
        n, seen = len(xs), []
        for step in range(len(xs[0])):
            compute = copy.deepcopy(master).to(PARAM_DTYPE)
            total, losses = None, 0.0
            for x, y in zip(xs, ys, strict=True):
                compute.zero_grad()
                loss = loss_fn(compute, x[step].to(PARAM_DTYPE), y[step])
                loss.backward()
                losses += loss.item()
                grads = [p.grad.to(REDUCE_DTYPE) for p in compute.parameters()]
                total = grads if total is None else [a + b for a, b in
                                                     zip(total, grads, strict=True)]
            for p, grad in zip(master.parameters(), total, strict=True):
                p.grad = (grad / n).to(MASTER_DTYPE)
            norm = math.sqrt(sum(float(p.grad.double().square().sum())
                                 for p in master.parameters()))
            seen.append([losses / n, norm])
            optimizer.step()
            optimizer.zero_grad()
    return torch.tensor(seen, dtype=torch.float64)


def cost(case: Case) -> Cost:
    """Bytes on the wire a rank, a step, as a ring sends them: (N − 1)/N of two bf16
    all-gathers and one fp32 reduce-scatter of every block."""
    n, dim, layers = world_size(case), case.sizes["dim"], case.sizes["layers"]
    padded = layers * n * math.ceil((12 * dim * dim + 13 * dim) / n)
    return Cost(0, (n - 1) / n * padded * (2 * 2 + 4) * STEPS)


def _name(dtype: torch.dtype) -> str:
    return str(dtype)[6:]


def _bytes(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def master_cause(log: RankLog, shard_bytes: int) -> str:
    """Why the weights the optimizer steps, or its state, are not fp32, or ""."""
    master = next((m for m in log.marks if m.label == "master"), None)
    dtypes = master.data.get("dtypes") if master is not None else None
    if dtypes != [_name(MASTER_DTYPE)]:
        return (f"rank {log.rank}: the parameters returned for the optimizer are "
                f"{', '.join(map(str, dtypes or ['missing']))}: the policy keeps them, the "
                "master weights, in fp32 (so AdamW's moments are fp32 too); only the "
                "gathered copy the blocks compute with is bf16. Keep the shard in the "
                "model's dtype")
    state = next((m for m in log.marks if m.label == "state"), None)
    held = state.data.get("held") if state is not None else None
    want = 2 * shard_bytes  # two moments of every shard, as the shards' own dtype
    if held != want:
        return (f"rank {log.rank}: after training, AdamW's state holds {held} B in "
                f"{', '.join(state.data.get('dtypes', [])) if state else '?'}; two fp32 "
                f"moments of the rank's shards hold 2 × {shard_bytes:,} = {want:,} B")
    return ""


def dtypes_cause(log: RankLog, shards: list[int], n: int) -> str:
    """Why the collectives of a step did not move the policy's bytes, or "": each
    all-gather the block's shard in bf16, each reduce-scatter its whole gradient in fp32.
    The counts and sizes in elements are ``calls_cause``'s to judge, before this."""
    steps = [mark for mark in log.marks if mark.label == "step"]
    for index, start in enumerate(steps):
        following = steps[index + 1] if index + 1 < len(steps) else None
        step = cut_step(log, start, following)
        where = f"rank {log.rank}, step {index}"
        for call in [c for c in step.forward + step.backward if c.op in ALL_GATHERS]:
            if call.dtype != _name(PARAM_DTYPE):
                return (f"{where}: an all-gather moved its {call.elements:,}-element shard in "
                        f"{call.dtype}, {call.bytes:,} B, where bf16 moves "
                        f"{2 * call.elements:,} B. Gathered {call.dtype}: the policy "
                        "gathers bf16 (param_dtype). Cast the fp32 shard to bf16, then "
                        "all-gather it into a bf16 vector")
        for call in [c for c in step.backward if c.op in REDUCE_SCATTERS]:
            if call.dtype != _name(REDUCE_DTYPE):
                lost = (f": summing {n} {call.dtype} gradients loses bits, the policy "
                        "reduces in fp32 (reduce_dtype). Cast the gradients to fp32 before "
                        "the reduce-scatter" if call.dtype in ("bfloat16", "float16") else
                        ": the policy reduces in fp32 (reduce_dtype)")
                return (f"{where}: a reduce-scatter was handed the block's "
                        f"{call.elements:,}-element gradient in {call.dtype}, "
                        f"{call.bytes:,} B, where fp32 takes {4 * call.elements:,} B. "
                        f"Gradients reduce-scattered in {call.dtype}" + lost)
    return ""


def compute_cause(log: RankLog, layers: int) -> str:
    """Why a block did not compute in bf16, from every layer's weight and input as it ran
    in every step, or ""."""
    mark = next((m for m in log.marks if m.label == "compute"), None)
    blocks = mark.data.get("blocks") if mark is not None else None
    blocks = blocks if isinstance(blocks, list) and len(blocks) == layers else [{}] * layers
    want = _name(PARAM_DTYPE)
    for block, seen in enumerate(blocks):
        if not isinstance(seen, dict) or not seen:
            return (f"rank {log.rank}: block {block}'s layers never ran where the grader "
                    "could see them: keep each block a module called on its input")
        for layer, pairs in seen.items():
            for pair in pairs if isinstance(pairs, list) else []:
                weight, _, given = str(pair).partition("/")
                if weight != want:
                    return (f"rank {log.rank}: block {block}'s {layer} computed with {weight} "
                            "weights: the policy computes in bf16 (param_dtype). Use the "
                            "gathered bf16 weights as they are; casting them back to fp32 "
                            "spends the memory and time bf16 saves")
                if given != want:
                    return (f"rank {log.rank}: block {block}'s {layer} was given a {given} "
                            f"input, its weights {want}: cast each block's input to bf16 as "
                            "it begins")
    return ""


def numbers_cause(got: torch.Tensor, want: torch.Tensor, n: int) -> str:
    """Why the trained numbers are not one process's under the policy, or "". The calls,
    their dtypes and every layer's compute dtypes were already the policy's: a number that
    differs says where in the step it parted, not why."""
    for step in range(len(want)):
        if bool(got[step, 2] > 0):
            return (f"step {step}: {int(got[step, 2])} shards have no gradient after "
                    "backward: reduce-scatter each block's gradients into its shard's .grad")
        for column, what in ((0, "loss"), (1, "gradient norm")):
            value, right = float(got[step, column]), float(want[step, column])
            if column == 1 and step == 0 and abs(value / right - n) < 1e-3 * n:
                return (f"step 0: the gradient norm is {value:.9g}, {n} times one process's "
                        f"{right:.9g}: the reduce-scatter sums the ranks' gradients; the "
                        f"mean over the whole batch divides by N = {n}")
            if not relative_error(value, right) <= RELATIVE:  # NaN too
                return (f"step {step}: the {what} is {value:.9g}, one process under the "
                        f"policy gets {right:.9g} ({relative_error(value, right):.1e} relative, "
                        f"more than {RELATIVE:g}). " + _where(step, column))
    return ""


def _where(step: int, column: int) -> str:
    """What the first number that differs depends on: its step's forward alone at step 0,
    then backward and the reduction, then the optimizer's steps on the master weights."""
    if step == 0 and column == 0:
        return ("Before any step the loss depends on the forward alone: the model's own "
                "weights, cast to bf16, and what each layer computed with them (every "
                "layer's weights and inputs were bf16)")
    if step == 0:
        return ("The first loss was right, so the forward was: the gradients differ, in "
                "backward or in their reduction (the fp32 sum of the ranks' gradients, "
                "divided by N, into each shard's .grad)")
    return ("The steps before matched: the difference came in with the optimizer's step, on "
            "the master weights (the fp32 shards) and the gradients it was given")


def grade(case: Case, inputs: list[tuple], outputs: list[object],
          logs: list[RankLog]) -> CaseResult:
    """The verdict on a case of fsdp/precision: the exact evidence (dtypes, bytes) first,
    then the numbers, then memory."""
    n = world_size(case)
    for log in logs:
        forged = forged_marks(log, HARNESS_MARKS)
        if forged:
            return CaseResult(case, Comparison(False, cause=forged))
        invalid = next((m for m in log.marks if m.label == "invalid"), None)
        if invalid is not None:
            return CaseResult(case, Comparison(False, cause=f"rank {log.rank}: "
                                               f"{invalid.data.get('why', '')}"))
    setup = inputs[0][0]
    model = make_model(*setup[:4])
    sizes = block_sizes(model)
    shards = sorted(math.ceil(size / n) for size in sizes)
    element = _bytes(MASTER_DTYPE)
    for log in logs:
        cause = (master_cause(log, sum(shards) * element)
                 or calls_cause(case, log, sizes, prefetch=False)
                 or dtypes_cause(log, shards, n) or compute_cause(log, len(sizes)))
        if cause:
            return CaseResult(case, Comparison(False, cause=cause))
    want = reference(setup, [i[1] for i in inputs], [i[2] for i in inputs])
    if not all(isinstance(out, torch.Tensor) and out.shape == (len(want), 3)
               for out in outputs):
        return CaseResult(case, Comparison(False, cause="the training loop returned "
                                           "nothing: a rank's run was cut short"))
    got = torch.stack(outputs)
    trained = torch.stack([got[:, :, 0].mean(0), got[:, :, 1].sum(0).sqrt(),
                           got[:, :, 2].sum(0)], dim=1)
    wrong = numbers_cause(trained, want, n)
    error = max(relative_error(value, right) if value != right else 0.0 for value, right in
                zip(trained[:, :2].reshape(-1).tolist(), want.reshape(-1).tolist(),
                    strict=True))
    seen = Comparison(not wrong, rel_error=error, cause=wrong)
    if wrong:
        return CaseResult(case, seen)
    bound = memory_bound(sizes, n, element, prefetch=False)
    # The block of slack is a gathered one, in bf16: half its bytes in fp32.
    bound["slack"] = bound["slack"] * _bytes(PARAM_DTYPE) // element
    for log in logs:
        cause = memory_cause(log, bound, len(want))
        if cause:
            return CaseResult(case, seen, error=cause)
    return CaseResult(case, seen)


register(RanksProblem(
    id="fsdp/precision",
    title="FSDP in mixed precision: gather in bf16, reduce in fp32",
    signature=("shard_layers(model: TinyTransformer, param_dtype=torch.bfloat16, "
               "reduce_dtype=torch.float32) -> list[nn.Parameter], on every rank: the fp32 "
               "shards for the optimizer; the blocks gather and compute in bf16, their "
               "gradients are reduce-scattered in fp32"),
    make_inputs=make_inputs,
    reference=reference,
    cost=cost,
    cpu_cases=CASES,
    gpu_cases=CASES,  # gloo processes in both worlds
    grade=grade,
    harness=train,
    preload=("torch._dynamo", "rooflab.kernels.fsdp"),
    solution="rooflab.kernels.fsdp:shard_layers",
    time_limit_s=30.0,
    hints=("The shard stays fp32: it is the master the optimizer steps. The whole vector "
           "is allocated in param_dtype, so the parameters (views of it) and their "
           "gradients are bf16; gather sends shard.to(param_dtype). reduce_gradients casts "
           "the flat gradient to reduce_dtype before the reduce-scatter, and the mean back "
           "to the shard's dtype. The blocks' input must be bf16 too: a forward pre-hook "
           "may return new args.",
           "ShardedLayer: full = torch.empty_like(padded, dtype=param_dtype or "
           "padded.dtype); gather: sent = shard.detach().to(full.dtype); "
           "all_gather_into_tensor(full.data, sent). reduce: F.pad(flat.to(reduce_dtype), "
           "…); mine = torch.empty(s, dtype=reduce_dtype); reduce_scatter_tensor; mine /= N; "
           "shard.grad = mine.to(shard.dtype). before_forward: return tuple(a.to(param_dtype) "
           "for a in args)."),
    answer_in=("ShardedLayer", "shard_layers"),
))
