"""Tensor and sequence parallelism: a learner's split of a transformer block, run forward
and backward on N ranks, graded against one process.

``tp/block`` calls the learner's ``parallelize(block)`` on every rank of a gloo group and
``tp/sequence`` its ``parallelize_sequence(block)``; then the grader's harness (``run``)
runs the block forward on an input and backward from an output gradient, on every rank.
With sequence parallelism, rank r gets tokens [r·s/t, (r + 1)·s/t) of both. Graded:

* the numbers, against one process running the whole block in float64: each rank's
  output and input gradient (its slice of the sequence, with SP), each split weight's
  gradient (the slice of the whole weight's gradient that the rank holds), each
  LayerNorm parameter's gradient (whole on every rank, or, with SP, whole or summing to
  the whole over the ranks, as Megatron leaves it before its gradient all-reduce and
  DTensor leaves it ``Partial``);
* the weights: q, k, v and up split by output features, out and down by input features,
  1/t each; every tensor reachable from the block and the learner's function, at most
  1/t of the block's matrices and its LayerNorms (nothing whole kept aside);
* the calls, from every rank's record of its torch.distributed calls (the functional
  collectives DTensor issues included). Megatron's counts: without SP one all-reduce of
  the b × s × h activation in each half's forward and one in its backward; with SP each
  all-reduce becomes an all-gather of the rank's b × s/t × h slice and a reduce-scatter
  of the whole, in forward and in backward (backward may gather the saved input again,
  as Megatron does, and all-reduce the LayerNorms' gradients); nothing else;
* with SP, the activations: what the rank holds after forward, beyond what it held
  before (``evidence/live_memory.py``), at most what splitting every activation along
  the sequence leaves, plus the gathered inputs of the two halves.

``tp/plan`` counts, per GPU and step, what data parallelism, FSDP and tensor + sequence
parallelism (and their combination) hold and send, on named cases and on sizes drawn
from the seed.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.distributed as dist

from ..device import one_cpu_thread
from ..evidence.compare import CaseResult, Comparison
from ..evidence.live_memory import (
    freeze,
    live,
    local_part,
    reachable_buffers,
    refrozen,
    storage_bytes,
)
from ..problem import Case, Cost, Problem, register
from ..ranks import RanksProblem, record
from ..ranks.problem import world_size
from ..ranks.record import Call, RankLog
from ..ranks.report import forged_marks
from .roofline import RTOL, close_count, real_number, told_apart

BATCH = 2
ATOL = RTOL_GRADS = 1e-5  # float32 ranks against a float64 process, over a few hundred terms
# How each weight is split: by output features ("column") or by input features ("row").
SPLITS = {"attention.q": "column", "attention.k": "column", "attention.v": "column",
          "attention.out": "row", "mlp.up": "column", "mlp.down": "row"}
NORMS = ("attention_norm.weight", "attention_norm.bias", "mlp_norm.weight", "mlp_norm.bias")
ALL_GATHERS = ("all_gather_into_tensor", "all_gather")
REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter")
SLACK_BYTES = 1024  # a device mesh's table of ranks, and the like


def _case(ranks: int, dim: int, heads: int, length: int, note: str = "") -> Case:
    return Case({"ranks": ranks, "dim": dim, "heads": heads, "length": length},
                torch.float32, note=note)


# Heads, hidden units and tokens divide by the ranks; 3 ranks shows a split hard-wired to
# a power of two.
CASES = [
    _case(2, dim=32, heads=4, length=8),
    _case(3, dim=48, heads=6, length=12),
    _case(4, dim=32, heads=4, length=8),
]


def make_block(dim: int, heads: int, seed: int) -> torch.nn.Module:
    """The block every rank and the reference start from: the same weights everywhere."""
    from rooflab.kernels.tensor_parallel import Block

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = Block(dim, heads)
        with torch.no_grad():  # LayerNorms that are not the identity: their gradients show
            for name in NORMS:
                block.get_parameter(name).add_(0.1 * torch.randn(dim))
        return block


def _inputs(sequence: bool):
    def make_inputs(case: Case, generator: torch.Generator,
                    device: torch.device) -> list[tuple]:
        n, dim = world_size(case), case.sizes["dim"]
        setup = (dim, case.sizes["heads"],
                 int(torch.randint(0, 2**31, (1,), generator=generator)), sequence)
        x = torch.randn(BATCH, case.sizes["length"], dim, generator=generator)
        grad = torch.randn(BATCH, case.sizes["length"], dim, generator=generator)
        return [(setup, x, grad) for _ in range(n)]
    return make_inputs


def _weight(block: torch.nn.Module, name: str) -> torch.Tensor | None:
    try:
        layer = block.get_submodule(name)
    except AttributeError:
        return None
    weight = getattr(layer, "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None


# --- on each rank: the grader's harness ----------------------------------------------------------


def run(candidate, setup: tuple, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Split a block with the learner's function, run it forward on ``x`` and backward
    from ``grad`` (this rank's slice of the sequence of each, with SP). Returns, flat in
    float64: the output, the input's gradient, the split weights' gradients and the
    LayerNorms'. Marks in the rank's log: the weights' shapes and the bytes the block
    holds; where forward and backward begin; the activations forward left."""
    dim, heads, seed, sequence = setup
    rank, world = dist.get_rank(), dist.get_world_size()
    sentinel = freeze()
    block = make_block(dim, heads, seed)
    returned = candidate(block)
    if isinstance(returned, torch.nn.Module):
        block = returned
    weights = {name: _weight(block, name) for name in SPLITS}
    missing = [name for name, weight in weights.items() if weight is None]
    if missing:
        record.mark("invalid", why=f"the block has no {missing[0]}.weight after the split: "
                    "keep each layer where it was, with its slice as .weight")
        return torch.empty(0)
    wrong = _shape_cause(weights, dim, world)
    if wrong:
        record.mark("invalid", why=wrong)
        return torch.empty(0)
    record.mark("weights", held=storage_bytes(reachable_buffers(block, candidate)))
    if sequence:
        share = x.shape[1] // world
        x, grad = (t[:, rank * share:(rank + 1) * share].contiguous() for t in (x, grad))
    x = x.clone().requires_grad_()
    before = live("cpu").bytes
    record.mark("forward")
    try:
        output = block(x)
        record.mark("backward", activations=live("cpu").bytes - before)
        local_part(output).backward(grad)
    except Exception as error:  # noqa: BLE001 (judged with the calls that led to it)
        record.mark("raised", error=f"{type(error).__name__}: {str(error)[:300]}")
        return torch.empty(0)
    record.mark("after", frozen=refrozen(sentinel))
    parts = [local_part(output), x.grad, *(local_part(weights[name].grad) for name in SPLITS),
             *(local_part(_parameter(block, name).grad) for name in NORMS)]
    record.mark("returned", sizes=[-1 if p is None else p.numel() for p in parts])
    return torch.cat([p.detach().reshape(-1).double() for p in parts if p is not None])


def full_shapes(dim: int) -> dict[str, tuple[int, int]]:
    """Each split layer's whole weight, (out, in)."""
    return {"attention.q": (dim, dim), "attention.k": (dim, dim), "attention.v": (dim, dim),
            "attention.out": (dim, dim), "mlp.up": (4 * dim, dim), "mlp.down": (dim, 4 * dim)}


def _shape_cause(weights: dict[str, torch.Tensor], dim: int, world: int) -> str:
    for name, (rows, columns) in full_shapes(dim).items():
        split = SPLITS[name]
        want = [rows // world, columns] if split == "column" else [rows, columns // world]
        got = list(local_part(weights[name]).shape)
        if got != want:
            way = "output features (rows)" if split == "column" else "input features (columns)"
            return (f"{name}.weight is {got}; split by its {way} over {world} ranks it is "
                    f"{want}")
    return ""


def _parameter(block: torch.nn.Module, name: str) -> torch.Tensor:
    try:
        return block.get_parameter(name)
    except AttributeError:
        return torch.empty(0)


# --- in the grader: the reference and the verdict -------------------------------------------------


def reference(setup: tuple, x: torch.Tensor, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    """One process, in float64: the block's output, its input's gradient and every
    parameter's gradient."""
    dim, heads, seed, _ = setup
    with one_cpu_thread():
        block = make_block(dim, heads, seed).double()
        x = x.double().requires_grad_()
        output = block(x)
        output.backward(grad.double())
    found = {"output": output.detach(), "input": x.grad}
    found.update((name, _weight(block, name).grad) for name in SPLITS)
    found.update((name, block.get_parameter(name).grad) for name in NORMS)
    return found


def _slice(whole: torch.Tensor, split: str, rank: int, world: int) -> torch.Tensor:
    if split == "column":
        rows = whole.shape[0] // world
        return whole[rank * rows:(rank + 1) * rows]
    columns = whole.shape[1] // world
    return whole[:, rank * columns:(rank + 1) * columns]


def _sequence_slice(whole: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    share = whole.shape[1] // world
    return whole[:, rank * share:(rank + 1) * share]


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The worst element's error, relative to the largest magnitude wanted."""
    return float((got - want).abs().max()) / max(float(want.abs().max()), 1.0)


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and bool(torch.isfinite(got).all()) and \
        _error(got, want) <= RTOL_GRADS


def _split_outputs(output: torch.Tensor, sizes: list[int]) -> list[torch.Tensor | None]:
    parts, offset = [], 0
    for size in sizes:
        if size < 0:
            parts.append(None)
            continue
        parts.append(output[offset:offset + size])
        offset += size
    return parts


def numbers_cause(case: Case, want: dict[str, torch.Tensor], outputs: list[object],
                  logs: list[RankLog], sequence: bool) -> tuple[str, float]:
    """Why the ranks' numbers differ from one process's, or "", and the worst error."""
    n = world_size(case)
    names = ["output", "input", *SPLITS, *NORMS]
    worst = 0.0
    norms: dict[str, list[torch.Tensor]] = {name: [] for name in NORMS}
    for rank, (output, log) in enumerate(zip(outputs, logs, strict=True)):
        sizes = next((m.data.get("sizes") for m in log.marks if m.label == "returned"), None)
        if not isinstance(output, torch.Tensor) or not isinstance(sizes, list) or \
                sum(s for s in sizes if s > 0) != output.numel():
            return f"rank {rank}: the block's run was cut short", math.nan
        for name, got in zip(names, _split_outputs(output, sizes), strict=True):
            whole = want[name]
            if name in ("output", "input"):
                right = _sequence_slice(whole, rank, n) if sequence else whole
            elif name in SPLITS:
                right = _slice(whole, SPLITS[name], rank, n)
            else:
                right = whole
            what = {"output": "the block's output", "input": "the input's gradient"}.get(
                name, f"{name}'s gradient" if name in NORMS else f"{name}.weight's gradient")
            if got is None:
                return f"rank {rank}: {what} is missing (None after backward)", math.nan
            got = got.view(right.shape) if got.numel() == right.numel() else got
            if name in NORMS:
                norms[name].append(got)
                continue
            if got.shape != right.shape:
                return (f"rank {rank}: {what} has {got.numel()} elements, not "
                        f"{right.numel()}"), math.nan
            worst = max(worst, _error(got, right) if torch.isfinite(got).all() else math.inf)
            if not _close(got, right):
                return (f"rank {rank}: {what} differs from one process's "
                        f"({_error(got, right):.1e} of its largest value)"
                        + _numbers_advice(name, got, right, n, sequence)), worst
    for name, grads in norms.items():
        right = want[name]
        every = all(_close(g, right) for g in grads)
        summed = sequence and _close(torch.stack(grads).sum(0), right)
        if not (every or summed):
            return (f"{name}'s gradient is neither the whole gradient on every rank"
                    + (" nor, summed over the ranks, the whole" if sequence else "")), worst
    return "", worst


def _numbers_advice(name: str, got: torch.Tensor, right: torch.Tensor, n: int,
                    sequence: bool) -> str:
    """What the numbers alone show, or ""."""
    if name in SPLITS and _close(got, right * n):
        return (f": {n} times too large. The weights' gradients need no collective: each "
                "rank's slice saw every token")
    if name == "output" and not sequence:
        return (": the all-reduces are in place, so what they sum is not the block's: "
                "check which slice of each weight this rank keeps, and that f and g sit "
                "where each half begins and ends")
    return ""


MARKS = ("weights", "forward", "backward", "after", "returned", "raised", "invalid")


def _phase(log: RankLog, label: str, until: str | None) -> list[Call]:
    start = next((m for m in log.marks if m.label == label), None)
    end = next((m for m in log.marks if m.label == until), None) if until else None
    if start is None:
        return []
    last = end.calls if end is not None else len(log.calls)
    return [call for call in log.calls if start.calls <= call.seq < last]


def _listed(calls: list[Call]) -> str:
    counts = Counter(call.op for call in calls)
    return ", ".join(f"{op} {count} times" if count > 1 else f"{op} once"
                     for op, count in counts.items()) or "nothing"


def calls_cause(case: Case, log: RankLog, sequence: bool, forbidden_only: bool = False) -> str:
    """Why rank ``log.rank``'s forward and backward calls are not Megatron's, or "". With
    ``forbidden_only``, only a call the contract does not allow at all (the calls of a
    run cut short by an error)."""
    n, dim = world_size(case), case.sizes["dim"]
    whole = BATCH * case.sizes["length"] * dim
    forward = _phase(log, "forward", "backward")
    backward = _phase(log, "backward", "after")
    where = f"rank {log.rank}"
    if not sequence:
        contract = ("one all-reduce of the b × s × h activation in each half's forward (g) "
                    "and one in each half's backward (f)")
        for phase, calls in (("forward", forward), ("backward", backward)):
            reduces = [c for c in calls if c.op == "all_reduce"]
            others = [c for c in calls if c.op != "all_reduce"]
            if others:
                return (f"{where}'s {phase} called {_listed(others)} (the first: "
                        f"{others[0].describe()}): {contract}, nothing else")
            if forbidden_only:
                continue
            if len(reduces) != 2:
                activations = all(c.elements == whole for c in reduces)
                return (f"{where}'s {phase} made {len(reduces)} all-reduces, not 2 "
                        f"(of {sorted(c.elements for c in reduces)} elements): "
                        + ("q, k and v read one input: one f for the three, where the "
                           "attention begins" if phase == "backward" and len(reduces) == 4
                           and activations else contract))
            sizes = sorted(c.elements for c in reduces)
            if sizes != [whole, whole]:
                return (f"{where}'s {phase} all-reduced {sizes} elements; each is the "
                        f"{BATCH} × {case.sizes['length']} × {dim} activation, {whole:,}")
        return ""
    shard = whole // n
    contract = ("each half begins with an all-gather of the rank's b × s/t × h slice and "
                "ends with a reduce-scatter of the b × s × h partial sums, in forward; in "
                "backward their conjugates")
    for phase, calls in (("forward", forward), ("backward", backward)):
        gathers = [c for c in calls if c.op in ALL_GATHERS]
        scatters = [c for c in calls if c.op in REDUCE_SCATTERS]
        reduces = [c for c in calls if c.op == "all_reduce"]
        others = [c for c in calls if c not in gathers + scatters + reduces]
        if phase == "forward" and reduces and not scatters:
            return (f"{where}'s forward all-reduced: with sequence parallelism the "
                    "all-reduce becomes a reduce-scatter (each rank keeps its tokens) and "
                    "an all-gather where the next half begins")
        norms = 4 * dim
        if others or (phase == "forward" and reduces) or \
                sum(c.elements for c in reduces) > norms:
            extra = others or reduces
            return (f"{where}'s {phase} called {_listed(extra)} (the first: "
                    f"{extra[0].describe()}): {contract}"
                    + (", and backward may all-reduce the LayerNorms' gradients "
                       f"({norms:,} elements)" if phase == "backward" else ""))
        if forbidden_only:
            continue
        allowed = (2, 4) if phase == "backward" else (2,)  # Megatron gathers its input again
        if len(scatters) != 2 or len(gathers) not in allowed:
            return (f"{where}'s {phase} made {len(gathers)} all-gathers and "
                    f"{len(scatters)} reduce-scatters, not 2 and 2: {contract}")
        if {c.elements for c in gathers} != {shard}:
            return (f"{where}'s {phase} all-gathers sent {[c.elements for c in gathers]} "
                    f"elements; each sends the rank's slice, {shard:,}")
        if {c.elements for c in scatters} != {whole}:
            return (f"{where}'s {phase} reduce-scatters were handed "
                    f"{[c.elements for c in scatters]} elements; each takes the whole "
                    f"activation, {whole:,}")
    return ""


def weights_cause(case: Case, log: RankLog) -> str:
    """Why rank ``log.rank`` holds more than 1/t of the block, or ""."""
    n, dim = world_size(case), case.sizes["dim"]
    mark = next((m for m in log.marks if m.label == "weights"), None)
    if mark is None:
        return f"rank {log.rank}: the grader could not see the block's weights"
    full = full_shapes(dim)
    matrices = sum(r * c for r, c in full.values()) * 4 // n
    norms = 4 * dim * 4
    allowed = matrices + norms + SLACK_BYTES
    held = mark.data.get("held")
    if not isinstance(held, int):
        return f"rank {log.rank}: the grader's measurement of the block's memory is missing"
    if held > allowed:
        return (f"rank {log.rank}: the block and the learner's code hold {held:,} B of "
                f"tensors, more than 1/{n} of its matrices ({matrices:,} B) and its "
                f"LayerNorms ({norms:,} B): keep no whole weight once it is split")
    return ""


def activations_bound(case: Case) -> int:
    """The bytes of activations one rank may hold after forward, with SP: every activation
    of the block split t ways (16 of b × s × h, its output included), the two
    all-gathered inputs of the halves, which their first layers save for backward, and a
    quarter of one for the attention's and the LayerNorms' statistics. (At t = 2 that is
    what tensor parallelism alone holds; from t = 3 on, less.)"""
    n = world_size(case)
    activation = BATCH * case.sizes["length"] * case.sizes["dim"] * 4
    return 2 * activation + 16 * activation // n + activation // 4


def activations_cause(case: Case, log: RankLog) -> str:
    mark = next((m for m in log.marks if m.label == "backward"), None)
    held = mark.data.get("activations") if mark is not None else None
    bound = activations_bound(case)
    if not isinstance(held, int):
        return f"rank {log.rank}: the grader could not measure the activations"
    if held > bound:
        activation = BATCH * case.sizes["length"] * case.sizes["dim"] * 4
        return (f"rank {log.rank} held {held:,} B of activations after forward "
                f"({held / activation:.1f} tensors of b × s × h), more than the {bound:,} B "
                f"({bound / activation:.1f}) that sequence parallelism leaves: every "
                "activation split t ways, but the two gathered inputs. Run the LayerNorms "
                "and the residual on the rank's slice, gather the LayerNorm's output where "
                "each half begins, and hand its layers a contiguous tensor (they save their "
                "input; a strided view makes each save a copy)")
    return ""


def _grade(sequence: bool):
    def grade(case: Case, inputs: list[tuple], outputs: list[object],
              logs: list[RankLog]) -> CaseResult:
        for log in logs:
            forged = forged_marks(log, MARKS)
            if forged:
                return CaseResult(case, Comparison(False, cause=forged))
            invalid = next((m for m in log.marks if m.label == "invalid"), None)
            if invalid is not None:
                return CaseResult(case, Comparison(False, cause=f"rank {log.rank}: "
                                                   f"{invalid.data['why']}"))
            if any(m.label == "after" and m.data.get("frozen") for m in log.marks):
                return CaseResult(case, Comparison(False, cause=(
                    f"rank {log.rank}: objects were frozen (gc.freeze), out of the "
                    "grader's sight: leave the collector's generations alone")))
        for log in logs:
            raised = next((m for m in log.marks if m.label == "raised"), None)
            if raised is not None:
                # A call the contract forbids explains the error; a count cut short by it
                # does not.
                cause = calls_cause(case, log, sequence, forbidden_only=True)
                phase = "backward" if any(m.label == "backward" for m in log.marks) \
                    else "forward"
                return CaseResult(case, Comparison(False, cause=(
                    f"rank {log.rank} raised {raised.data.get('error')} in the block's "
                    f"{phase}" + (f"; before it, {cause}" if cause else ""))))
        for log in logs:
            cause = weights_cause(case, log) or calls_cause(case, log, sequence)
            if cause:
                return CaseResult(case, Comparison(False, cause=cause))
        setup, x, grad = inputs[0]
        wrong, error = numbers_cause(case, reference(setup, x, grad), outputs, logs,
                                     sequence)
        seen = Comparison(not wrong, rel_error=error, cause=wrong)
        if wrong or not sequence:
            return CaseResult(case, seen)
        for log in logs:
            cause = activations_cause(case, log)
            if cause:
                return CaseResult(case, seen, error=cause)
        return CaseResult(case, seen)
    return grade


def cost(case: Case) -> Cost:
    """Bytes on the wire a rank, as a ring sends them: four all-reduces of the activation
    (or their reduce-scatter and all-gather halves, the same bytes)."""
    n = world_size(case)
    activation = BATCH * case.sizes["length"] * case.sizes["dim"] * 4
    return Cost(0, 4 * 2 * (n - 1) / n * activation)


HINTS = ("Column-parallel: rank r keeps rows [r·out/t, (r + 1)·out/t) of the weight and "
         "needs no communication; row-parallel: columns [r·in/t, (r + 1)·in/t), its output "
         "a partial sum that g all-reduces. f (identity forward, all-reduce backward) goes "
         "once where each half begins: a forward pre-hook on block.attention and block.mlp.",
         "f and g as torch.autograd.Function: CopyToParallel.backward all-reduces the "
         "gradient; ReduceFromParallel.forward all-reduces a clone of the partial sum. "
         "Replace each Linear with setattr(parent, name, ColumnParallelLinear(linear)) "
         "and register half.register_forward_pre_hook(lambda m, args: "
         "(copy_to_parallel(args[0]),)).")
SEQUENCE_HINTS = ("The block gets and returns (b, s/t, h). Where a half begins, all-gather "
                  "the sequence (backward: reduce-scatter the gradient); where its "
                  "row-parallel projection ends, reduce-scatter the partial sums along the "
                  "sequence (backward: all-gather). all_gather_into_tensor and "
                  "reduce_scatter_tensor work on the first dimension: move the sequence "
                  "there and back (movedim).",
                  "gather: local = shard.movedim(1, 0).contiguous(); whole = "
                  "local.new_empty((t * local.shape[0], *local.shape[1:])); "
                  "dist.all_gather_into_tensor(whole, local); return "
                  "whole.movedim(0, 1).contiguous(). "
                  "reduce-scatter likewise, with reduce_scatter_tensor(mine, local).")

for _sequence, _id, _title, _function in (
        (False, "tp/block", "A transformer block split Megatron's way", "parallelize"),
        (True, "tp/sequence", "Sequence parallelism on top", "parallelize_sequence")):
    register(RanksProblem(
        id=_id,
        title=_title,
        signature=(f"{_function}(block: Block) -> Block, on every rank: the block split in "
                   "place over the ranks"
                   + (", taking and returning this rank's slice of the sequence"
                      if _sequence else "")),
        make_inputs=_inputs(_sequence),
        reference=reference,
        cost=cost,
        cpu_cases=CASES,
        gpu_cases=CASES,  # gloo processes in both worlds
        grade=_grade(_sequence),
        harness=run,
        preload=("rooflab.kernels.tensor_parallel", "torch.distributed.tensor.parallel"),
        solution=f"rooflab.kernels.tensor_parallel:{_function}",
        time_limit_s=30.0,
        hints=SEQUENCE_HINTS if _sequence else HINTS,
        answer_in=(("_gather_sequence", "_reduce_scatter_sequence", "parallelize_sequence")
                   if _sequence else ("CopyToParallel", "ReduceFromParallel",
                                      "ColumnParallelLinear", "RowParallelLinear",
                                      "parallelize")),
    ))


# === tp/plan: DP, FSDP, TP + SP and their combination, counted ====================================

PLAN_FIELDS = ("bytes held", "bytes sent")
STATE_BYTES, ACTIVATION_BYTES = 16, 34


def _plan_case(hidden: int, layers: int, seq_len: int, batch: int, gpus: int, tp: int,
               sharded: bool, note: str = "") -> Case:
    return Case({"h": hidden, "layers": layers, "seq_len": seq_len, "batch": batch,
                 "gpus": gpus, "tp": tp, "sharded": int(sharded)}, torch.float64, note=note)


DRAWN = "sizes drawn from the seed"

# The concept page's model (h 4096, 32 layers) on 8 GPUs, each way; a 2-D layout on 64;
# then sizes drawn from the seed, so that no table of the named answers passes.
PLAN_CASES = [
    _plan_case(4096, 32, 4096, 8, 8, 1, False, note="data parallel"),
    _plan_case(4096, 32, 4096, 8, 8, 1, True, note="FSDP"),
    _plan_case(4096, 32, 4096, 8, 8, 8, False, note="TP + SP over 8"),
    _plan_case(8192, 80, 8192, 64, 64, 8, True, note="TP + SP in a node, FSDP across 8"),
    Case({"drawn": 1}, torch.float64, note=DRAWN),
    Case({"drawn": 2}, torch.float64, note=DRAWN),
]


def _plan_inputs(case: Case, generator: torch.Generator, device: torch.device) -> tuple:
    sizes = case.sizes
    if "h" in sizes:
        return (sizes["h"], sizes["layers"], sizes["seq_len"], sizes["batch"],
                sizes["gpus"], sizes["tp"], bool(sizes["sharded"]))

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=generator))

    tp = 2 ** draw(0, 3)
    data = draw(2, 16)
    return (128 * draw(8, 96), draw(8, 96), 512 * draw(1, 32), data * draw(1, 8),
            tp * data, tp, bool(draw(0, 1)))


def _plan_reference(hidden: int, layers: int, seq_len: int, batch: int, gpus: int, tp: int,
                    sharded: bool) -> dict:
    params = 12 * hidden**2 * layers
    data = gpus // tp
    held = STATE_BYTES * params / (tp * (data if sharded else 1)) + \
        ACTIVATION_BYTES * seq_len * hidden * layers / tp
    weights = 2 * params / tp  # bf16: each data-parallel group's slice
    sent = (3 if sharded else 2) * (data - 1) / data * weights + \
        batch / data * layers * 4 * 2 * (tp - 1) / tp * 2 * seq_len * hidden
    return {"want": (held, sent), "setting": (hidden, layers, seq_len, batch, gpus, tp,
                                               sharded)}


def compare_plan(output: object, reference: dict) -> str:
    want = reference["want"]
    got = [real_number(v) for v in output] if isinstance(output, (tuple, list)) and \
        len(output) == 2 else None
    if got is None or any(v is None for v in got):
        return f"return two numbers ({', '.join(PLAN_FIELDS)}); got {output!r}"
    wrong = [i for i in range(2) if not close_count(got[i], want[i])]
    if not wrong:
        return ""
    hidden, layers, seq_len, batch, gpus, tp, sharded = reference["setting"]
    shown = "; ".join("{} {}, expected {}".format(PLAN_FIELDS[i], *told_apart(got[i], want[i]))
                      for i in wrong)
    setting = (f"for h {hidden}, {layers} layers, {batch} sequences of {seq_len} tokens a "
               f"step on {gpus} GPUs, TP over {tp}, "
               f"{'sharded' if sharded else 'replicated'} over {gpus // tp}: ")
    return setting + shown + _plan_cause(got, reference["setting"], wrong)


def _plan_cause(got: list[float], setting: tuple, wrong: list[int]) -> str:
    hidden, layers, seq_len, batch, gpus, tp, sharded = setting
    params, data = 12 * hidden**2 * layers, gpus // tp
    state = STATE_BYTES * params / (tp * (data if sharded else 1))
    activations = ACTIVATION_BYTES * seq_len * hidden * layers
    if 0 in wrong and tp > 1 and math.isclose(got[0], state + activations, rel_tol=RTOL):
        return (": the activations are whole there. Sequence parallelism splits every "
                "activation over the TP group: 34·s·h·L/t")
    if 0 in wrong and sharded and math.isclose(
            got[0], STATE_BYTES * params / tp + activations / tp, rel_tol=RTOL):
        return (": FSDP shards the state over the data-parallel GPUs too: 16Ψ/(t·d), "
                "d = G/t")
    if 1 in wrong and tp > 1:
        flat = (3 if sharded else 2) * (gpus - 1) / gpus * 2 * params
        tp_part = batch / data * layers * 4 * 2 * (tp - 1) / tp * 2 * seq_len * hidden
        if math.isclose(got[1], flat + tp_part, rel_tol=RTOL):
            return (": the data-parallel collectives run among the d = G/t GPUs that hold "
                    "the same slice, on that slice (2Ψ/t bytes), not over all G GPUs")
        data_part = (3 if sharded else 2) * (data - 1) / data * 2 * params / tp
        if math.isclose(got[1], data_part + tp_part / 2, rel_tol=RTOL):
            return (": the TP side is half: a ring all-reduce of S bytes sends "
                    "2·(t − 1)/t·S from each GPU (a reduce-scatter, then an all-gather)")
    return ""


register(Problem(
    id="tp/plan", title="DP, FSDP or TP + SP: memory and traffic per GPU",
    signature=("parallel_plan(hidden, layers, seq_len, batch, gpus, tp, sharded) -> "
               "(bytes held, bytes sent), per GPU and step"),
    make_inputs=_plan_inputs, reference=_plan_reference, cost=lambda case: Cost(0, 0),
    kernel=None, timed=False, compare=compare_plan,
    cpu_cases=PLAN_CASES, gpu_cases=PLAN_CASES,
    solution="rooflab.kernels.tensor_parallel:parallel_plan",
    hints=("Ψ = 12·h²·L. Held: 16Ψ split over the t GPUs of a TP group, and over the d = "
           "G/t groups too if sharded; one sequence's activations, 34·s·h·L bytes, split t "
           "ways by SP. Sent: the data-parallel collectives among d GPUs on a 2Ψ/t slice, "
           "and four all-reduces of 2·s·h bytes a layer for each of the group's B/d "
           "sequences.",
           "data side: (3 if sharded else 2)·(d − 1)/d·2Ψ/t; TP side: (B/d)·L·4·2·(t − 1)/t"
           "·2·s·h; an all-reduce of S bytes sends 2·(n − 1)/n·S."),
    answer_in=("parallel_plan",),
))
