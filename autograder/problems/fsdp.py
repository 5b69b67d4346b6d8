"""FSDP: a learner's ZeRO-3 sharding, trained for a few steps on N ranks, graded against
one process.

``fsdp/zero3`` and ``fsdp/prefetch`` call the learner's ``shard_layers(model)`` (with
``prefetch=True`` for the second) on every rank of a gloo process group, then train the
sharded model for a few AdamW steps here, in the grader's loop (``train``), each rank on
its slice of the batch. Graded:

* the numbers: each step's loss (the mean over ranks) and gradient norm (over every
  shard of every rank) equal those of one process that trains the whole model on the
  whole batch, to 1e-6 relative. That process computes the loss and gradient slice by
  slice, as the ranks do, so the only difference left is the order of the ranks' sum;
* the shards: one flat parameter per block, ⌈numel/N⌉ elements, on every rank;
* the calls of each step, from the record of every rank's torch.distributed calls:
  one all-gather per block in forward, one per block in backward, one reduce-scatter per
  block in backward, and nothing else (no other collective, no message, in forward,
  backward or the optimizer's step); each all-gather sends the shard, each
  reduce-scatter the padded whole;
* memory the blocks show: at most two blocks whole at once in forward (weights or
  gradients), three in backward, none after backward;
* memory the rank holds: before the first step and after each, every tensor storage and
  byte buffer alive in the rank (``evidence/live_memory.py``) that was made since the
  grader's loop began or is reachable from the learner's function, at most what the
  contract allows one rank: its shard of the parameters, of their gradients and of
  AdamW's state, and one gathered block of slack (two with prefetch);
* with ``prefetch``, the next block's all-gather is issued, asynchronously, before a
  block computes, and waited for only after it has computed (the recorded times of the
  wait and of the block's compute show it), in forward and in backward.

``fsdp/plan`` counts, for a job on many nodes, what a GPU holds and sends under FSDP and
under HSDP (shard within a node, replicate across nodes), on named cases and on sizes
drawn from the seed.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..device import one_cpu_thread
from ..evidence.compare import CaseResult, Comparison
from ..evidence.live_memory import freeze, live, local_part, reachable_buffers, refrozen
from ..problem import Case, Cost, Problem, register
from ..ranks import RanksProblem, record
from ..ranks.problem import world_size
from ..ranks.record import Call, Mark, RankLog
from .roofline import RTOL, close_count, real_number, told_apart

STEPS, BATCH, LENGTH, LR = 5, 2, 8, 1e-3  # a rank's batch: 2 sequences of 8
RELATIVE = 1e-6
ALL_GATHERS = ("all_gather_into_tensor", "all_gather_single", "all_gather")
REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter")


def rank_case(ranks: int, dim: int, layers: int, heads: int = 4, note: str = "") -> Case:
    return Case({"ranks": ranks, "dim": dim, "layers": layers, "heads": heads},
                torch.float32, note=note)


# A block holds 12·dim² + 13·dim parameters: 5060 at dim 20, 7224 at 24. N = 3 and N = 4
# at dim 24 (7224 = 4·1806) and N = 3 at 20 need padding or not: both show.
CASES = [
    rank_case(2, dim=24, layers=3),
    rank_case(3, dim=20, layers=3, note="the shards need padding"),
    rank_case(4, dim=24, layers=4),
]


def make_model(dim: int, heads: int, layers: int, seed: int = 0) -> torch.nn.Module:
    """The model every rank and the reference start from: the same weights everywhere,
    drawn from ``seed``."""
    from rooflab.kernels.fsdp import TinyTransformer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyTransformer(dim, heads, layers)


def inputs_maker(prefetch: bool):
    def make_inputs(case: Case, generator: torch.Generator,
                    device: torch.device) -> list[tuple]:
        n, dim = world_size(case), case.sizes["dim"]
        # (dim, heads, layers, the weights' seed, prefetch): what the harness builds.
        setup = (dim, case.sizes["heads"], case.sizes["layers"],
                 int(torch.randint(0, 2**31, (1,), generator=generator)), prefetch)
        x = torch.randn(STEPS, n * BATCH, LENGTH, dim, generator=generator)
        y = torch.randn(STEPS, n * BATCH, LENGTH, dim, generator=generator)
        # Rank r trains on sequences [r·BATCH, (r + 1)·BATCH) of every step's batch.
        return [(setup, x[:, r * BATCH:(r + 1) * BATCH].clone(),
                 y[:, r * BATCH:(r + 1) * BATCH].clone()) for r in range(n)]
    return make_inputs


def block_sizes(model: torch.nn.Module) -> list[int]:
    return [sum(p.numel() for p in block.parameters()) for block in model.blocks]


# --- on each rank: the grader's training loop ---------------------------------------------------


def _whole(block: torch.nn.Module) -> bool:
    """Whether the block holds whole weights or whole gradients: the memory that ZeRO-3
    gives back between a block's uses. A plain tensor is whole while its storage is
    filled (the course's parameters are views of a vector freed to 0 bytes); a DTensor
    (FSDP2's parameters and gradients, views of flat buffers shared by a block) while its
    local part is not a shard of it."""
    return any(t is not None and _held_whole(t)
               for p in block.parameters() for t in (p, p.grad))


def _held_whole(tensor: torch.Tensor) -> bool:
    local = local_part(tensor)
    if local is not tensor:  # a DTensor: whole unless its local part is a shard
        return local.numel() >= tensor.numel() > 0
    return tensor.untyped_storage().nbytes() > 0


def _shards_wrong(shards: object, sizes: list[int], world: int) -> str:
    if not isinstance(shards, (list, tuple)) or not all(
            isinstance(s, torch.nn.Parameter) for s in shards):
        return (f"shard_layers returned {type(shards).__name__}: return the list of shards, "
                "one nn.Parameter per block, for the optimizer")
    if len(shards) != len(sizes):
        return f"shard_layers returned {len(shards)} shards for {len(sizes)} blocks: one each"
    for index, (shard, size) in enumerate(zip(shards, sizes, strict=True)):
        want = math.ceil(size / world)
        if shard.numel() != want:
            return (f"block {index}'s shard has {shard.numel():,} elements; with {size:,} "
                    f"parameters on {world} ranks each holds ⌈{size:,}/{world}⌉ = {want:,}")
    return ""


def account_memory(candidate: object, sentinel: list, when: str) -> None:
    """Note in the rank's log the bytes of every storage and buffer alive that the grader
    did not hold before the learner's sharding ran: what the sharding keeps, and the
    optimizer's state."""
    if refrozen(sentinel):
        record.mark("memory", when=when, frozen=True)
        return
    record.mark("memory", when=when, held=_live_with(reachable_buffers(candidate)))


def _live_with(reachable: list[object]) -> int:
    """The bytes ``live`` finds while ``reachable``, a list made now, holds what it holds:
    each storage once, however many views and aliases."""
    return live("cpu").bytes


_backward_of: dict[str, int | None] = {"block": None}  # the block whose backward began last


def watch_blocks(model: torch.nn.Module, prefetch: bool) -> None:
    """Marks in the rank's log as each block begins and ends its forward and its backward,
    with how many blocks are whole: after the learner's hooks that gather, before those
    that free or wait."""
    def whole_blocks() -> int:
        return sum(_whole(block) for block in model.blocks)

    def backward_mark(index: int):
        def mark(grad: torch.Tensor) -> None:
            _backward_of["block"] = index
            record.mark("backward block", block=index, whole=whole_blocks())
        return mark

    def note_backward(output: object, index: int) -> None:
        # A hook on the block's output fires as its backward begins: after the learner's
        # backward pre-hooks, which act on the output autograd sees further down.
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(backward_mark(index))

    for index, block in enumerate(model.blocks):  # after the learner's hooks: they gather
        block.register_forward_pre_hook(
            lambda module, args, index=index: record.mark("forward", block=index,
                                                          whole=whole_blocks()))
        block.register_forward_hook(
            lambda module, args, output, index=index: record.mark("forward computed",
                                                                  block=index),
            prepend=True)  # before the learner's own: they free, or wait for a prefetch
        block.register_forward_hook(
            lambda module, args, output, index=index: note_backward(output, index))
        if prefetch and index != 0:
            # Fires once the block has computed its input's gradient, the last thing its
            # backward computes; before the learner's own such hooks, which may wait.
            # (Block 0's input needs no gradient: its hook would fire as it begins.)
            block.register_full_backward_hook(
                lambda module, grad_input, grad_output, index=index: record.mark(
                    "backward computed", block=index), prepend=True)


def train(candidate, setup: tuple, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Shard the model with the learner's function and train it for len(x) steps; per
    step, this rank's loss and the squared norm of its shards' gradients. What the grader
    sees along the way goes into the rank's log as marks: the memory the rank holds
    before the first step and after each."""
    from rooflab.kernels.fsdp import loss_fn

    sentinel = freeze()
    dim, heads, layers, seed, prefetch = setup
    model = make_model(dim, heads, layers, seed)
    sizes = block_sizes(model)
    shards = candidate(model, prefetch=True) if prefetch else candidate(model)
    wrong = _shards_wrong(shards, sizes, dist.get_world_size())
    if wrong or not all(any(True for _ in block.parameters()) for block in model.blocks):
        record.mark("invalid", why=wrong or "a block has no parameters left: keep each "
                    "block's parameters, as views of its gathered vector")
        return torch.empty(0)
    watch_blocks(model, prefetch)
    optimizer = torch.optim.AdamW(shards, lr=LR)
    seen = []
    saved = activation_bytes(make_model(dim, heads, layers, seed), loss_fn, x[0], y[0])
    account_memory(candidate, sentinel, "before the first step")
    for step in range(len(x)):
        seen.append(train_step(model, shards, optimizer, loss_fn, x[step], y[step], step,
                               sentinel=sentinel, activations=saved))
        account_memory(candidate, sentinel, f"after step {step}")
    return torch.tensor(seen, dtype=torch.float64)


def activation_bytes(model: torch.nn.Module, loss_fn, x: torch.Tensor,
                     y: torch.Tensor) -> int:
    """The bytes a forward of ``model``, whole and unsharded, leaves alive for its backward:
    the activations autograd saves (its weights were alive before). A sharded model's
    forward may hold these and a gathered block, no more."""
    before = live("cpu").bytes
    loss = loss_fn(model, x, y)
    held = live("cpu").bytes - before
    del loss
    return held


def train_step(model: torch.nn.Module, shards: list[torch.Tensor], optimizer, loss_fn,
               x: torch.Tensor, y: torch.Tensor, step: int, sentinel: list | None = None,
               activations: int | None = None) -> list[float]:
    """One training step, marked; this rank's loss, its shards' squared gradient norm, and
    how many shards have no gradient. Nothing of it outlives the call but the numbers.
    With ``activations`` (what the unsharded model's forward saves), the bytes the
    forward left alive are marked too: the weights a forward's graph keeps count there,
    not only the parameters' own storages."""
    record.mark("step", step=step)
    at_start = live("cpu").bytes if activations is not None else 0
    loss = loss_fn(model, x, y)
    if activations is not None:
        frozen = sentinel is not None and refrozen(sentinel)
        record.mark("forward memory", held=0 if frozen else live("cpu").bytes - at_start,
                    activations=activations)
    record.mark("backward", whole=sum(_whole(block) for block in model.blocks))
    _backward_of["block"] = None
    try:
        loss.backward()
    except RuntimeError as error:
        freed = _backward_of["block"]
        if freed is None or _whole(model.blocks[freed]) or "storage of size 0" not in str(
                error):
            raise
        # Autograd read a weight it saved in forward, a view of the freed vector: no
        # line of the learner's is on the stack, so the grader says what it saw.
        raise RuntimeError(
            f"block {freed}'s backward ran with its weights freed (their storage holds 0 "
            "bytes, as after its forward), and autograd could not read them: gather each "
            "block's weights again before its backward, in a backward pre-hook "
            "(register_full_backward_pre_hook), as its forward pre-hook does") from None
    record.mark("optimizer", whole=sum(_whole(block) for block in model.blocks))
    # This rank's part alone: a DTensor's own norm would be a collective of the grader's.
    square = sum(float(local_part(s.grad).double().square().sum()) for s in shards
                 if s.grad is not None)
    missing = sum(s.grad is None for s in shards)
    optimizer.step()
    optimizer.zero_grad()
    return [loss.item(), square, missing]


# --- in the grader: the reference and the verdict ------------------------------------------------


def reference(setup: tuple, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> torch.Tensor:
    """Per step, the loss and gradient norm of one process training the whole model on
    the whole batch: each rank's slice in turn, the gradients summed in rank order, then
    divided by N, the losses likewise."""
    from rooflab.kernels.fsdp import loss_fn

    dim, heads, layers, seed, _ = setup
    with one_cpu_thread():
        return _trained(make_model(dim, heads, layers, seed), loss_fn, xs, ys)




def _trained(model: torch.nn.Module, loss_fn, xs: list[torch.Tensor],
             ys: list[torch.Tensor]) -> torch.Tensor:
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    n, seen = len(xs), []
    for step in range(len(xs[0])):
        total, losses = None, 0.0
        for x, y in zip(xs, ys, strict=True):
            model.zero_grad()
            loss = loss_fn(model, x[step], y[step])
            loss.backward()
            losses += loss.item()
            grads = [p.grad.clone() for p in model.parameters()]
            total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
        for p, grad in zip(model.parameters(), total, strict=True):
            p.grad = grad / n
        norm = math.sqrt(sum(float(p.grad.double().square().sum()) for p in model.parameters()))
        seen.append([losses / n, norm])
        optimizer.step()
    return torch.tensor(seen, dtype=torch.float64)


def cost(case: Case) -> Cost:
    """Bytes on the wire a rank, a step, as a ring sends them: (N − 1)/N of two
    all-gathers and one reduce-scatter of every padded block."""
    n, dim, layers = world_size(case), case.sizes["dim"], case.sizes["layers"]
    padded = layers * n * math.ceil((12 * dim * dim + 13 * dim) / n)
    return Cost(0, 3 * (n - 1) / n * padded * 4 * STEPS)


def relative_error(got: float, want: float) -> float:
    return abs(got - want) / max(abs(want), 1e-30)


def numbers_cause(got: torch.Tensor, want: torch.Tensor, n: int) -> str:
    """Why the trained numbers differ from one process's, or ""."""
    for step in range(len(want)):
        loss, norm = float(got[step, 0]), float(got[step, 1])
        want_loss, want_norm = float(want[step, 0]), float(want[step, 1])
        if bool(got[step, 2] > 0):
            return (f"step {step}: {int(got[step, 2])} shards have no gradient after "
                    "backward: reduce-scatter each block's gradients into its shard's .grad")
        head = ""
        if not relative_error(loss, want_loss) <= RELATIVE:  # NaN too
            head = (f"step {step}: the loss is {loss:.9g}, one process gets {want_loss:.9g} "
                    f"({relative_error(loss, want_loss):.1e} relative)")
            if step == 0:
                return head + (": the first forward already differs, so the weights the "
                               "blocks computed with are not the model's: gather every "
                               "rank's shard, in rank order")
            return head + (": the first steps agree, so the optimizer's updates do not "
                           "reach the weights the blocks use: gather from the shard the "
                           "optimizer steps, every step")
        if not relative_error(norm, want_norm) <= RELATIVE:  # NaN too
            ratio = norm / want_norm
            head = (f"step {step}: the gradient norm is {norm:.9g}, one process gets "
                    f"{want_norm:.9g}")
            if abs(ratio - n) < 1e-3 * n:
                return head + (f": {n} times too large. The reduce-scatter sums the ranks' "
                               f"gradients; the mean over the whole batch divides by N = {n}")
            return head + (f" ({ratio:.4g} times)" if math.isfinite(ratio) else "")
    return ""


def _kept_whole_cause(logs: list[RankLog], wrong: str) -> str:
    """Where the numbers first part at a step after the first, and some rank's blocks were
    still whole after the step before's backward: that, named (a gather skips a block
    already whole, so the next forward computes with the weights of before the update);
    else ""."""
    found = re.match(r"step (\d+): the loss", wrong)
    if not found or int(found.group(1)) == 0:
        return ""
    before = int(found.group(1)) - 1
    for log in logs:
        steps = [i for i, mark in enumerate(log.marks) if mark.label == "step"]
        if before >= len(steps):
            continue
        end = steps[before + 1] if before + 1 < len(steps) else len(log.marks)
        kept = [m.data.get("whole", 0) for m in log.marks[steps[before]:end]
                if m.label == "optimizer"]
        if kept and kept[0]:
            head = wrong.split(": the first steps agree")[0]
            return (f"{head}; after step {before}'s backward rank {log.rank} still held "
                    f"{kept[0]} blocks whole: their next forward computed with the "
                    "weights of before the optimizer's step (a gather does nothing for a "
                    "block already whole). "
                    "Free each block once its gradients are reduce-scattered")
    return ""


def _between(log: RankLog, first: Mark, last: Mark | None) -> list[Call]:
    end = last.calls if last is not None else len(log.calls)
    return [call for call in log.calls if first.calls <= call.seq < end]


def _named(calls: list[Call], ops: tuple[str, ...]) -> list[Call]:
    return [call for call in calls if call.op in ops]


CONTRACT = ("a step makes one all-gather a block in forward, one all-gather and one "
            "reduce-scatter a block in backward, and nothing else")


def _others_cause(calls: list[Call], allowed: tuple[str, ...], phase: str) -> str:
    """The calls of a phase that the contract does not list for it, named, or ""."""
    others = [call for call in calls if call.op not in allowed]
    if not others:
        return ""
    counts = Counter(call.op for call in others)
    listed = ", ".join(f"{op} {count} times" if count > 1 else f"{op} once"
                       for op, count in counts.items())
    return f"{phase} called {listed} (the first: {others[0].describe()}): {CONTRACT}"


def calls_cause(case: Case, log: RankLog, sizes: list[int], prefetch: bool) -> str:
    """Why rank ``log.rank``'s calls are not FSDP's, or ""."""
    steps = [mark for mark in log.marks if mark.label == "step"]
    waits = _first_waits(log) if prefetch else None
    for step, start in enumerate(steps):
        following = steps[step + 1] if step + 1 < len(steps) else None
        cause = _step_cause(case, log, sizes, waits, start, following)
        if cause:
            return f"rank {log.rank}, step {step}: {cause}"
    return ""


@dataclass
class _Step:
    """One step of a rank's log, cut in phases at the grader's marks."""

    marks: list[Mark]  # from the step's start to the next step's
    forward: list[Call]
    backward: list[Call]
    after: list[Call]  # from the end of backward to the next step: the optimizer's step

    def labelled(self, label: str, before: str | None = None) -> list[Mark]:
        end = next((i for i, m in enumerate(self.marks) if m.label == before), None)
        return [m for m in self.marks[:end] if m.label == label]


def cut_step(log: RankLog, start: Mark, following: Mark | None) -> _Step:
    marks = log.marks[log.marks.index(start):]
    if following is not None:
        marks = marks[:marks.index(following)]
    backward = next(m for m in marks if m.label == "backward")
    optimizer = next(m for m in marks if m.label == "optimizer")
    return _Step(marks, _between(log, start, backward), _between(log, backward, optimizer),
                 _between(log, optimizer, following))


def _step_cause(case: Case, log: RankLog, sizes: list[int], waits: dict[int, float] | None,
                start: Mark, following: Mark | None) -> str:
    """Why one step's calls are not FSDP's, or ""; with ``waits`` (when each prefetch was
    first waited for), its prefetches judged too."""
    step = cut_step(log, start, following)
    shards = sorted(math.ceil(size / world_size(case)) for size in sizes)
    return (_forward_cause(step, shards) or _backward_cause(step, shards, world_size(case))
            or (_prefetch_cause(step, len(sizes), waits) if waits is not None else ""))


def _forward_cause(step: _Step, shards: list[int]) -> str:
    gathered = _named(step.forward, ALL_GATHERS)
    others = _others_cause(step.forward, ALL_GATHERS, "forward")
    if others:
        return others
    if len(gathered) != len(shards):
        return (f"forward made {len(gathered)} all-gathers for {len(shards)} blocks: one a "
                "block, before its forward (and free it after)")
    sizes_wrong = _sizes_cause(gathered, shards, "the forward's all-gathers sent",
                               "each sends its block's shard")
    if sizes_wrong:
        return sizes_wrong
    worst = max((m.data.get("whole", 0) for m in step.labelled("forward", "backward")),
                default=0)
    if worst > 2:
        return (f"{worst} blocks were whole at once in forward, at most two may be: free "
                "a block's gathered vector after its forward (untyped_storage().resize_(0))")
    return ""


def _backward_cause(step: _Step, shards: list[int], n: int) -> str:
    reduced = _named(step.backward, REDUCE_SCATTERS)
    regathered = _named(step.backward, ALL_GATHERS)
    if _named(step.backward, ("all_reduce",)) and not reduced:
        return ("backward all-reduced the gradients: each rank needs only the sum of its "
                "own slice, which a reduce-scatter gives for half the bytes")
    others = _others_cause(step.backward, ALL_GATHERS + REDUCE_SCATTERS, "backward") or \
        _others_cause(step.after, (), "the optimizer's step")
    if others:
        return others
    if len(reduced) != len(shards):
        return (f"backward made {len(reduced)} reduce-scatters for {len(shards)} blocks: "
                "one a block, once its gradients are all there")
    if len(regathered) != len(shards):
        return (f"backward made {len(regathered)} all-gathers for {len(shards)} blocks: "
                "each block's weights are freed after its forward, so its backward gathers "
                "them again")
    sizes_wrong = _sizes_cause(
        regathered, shards, "the backward's all-gathers sent",
        "each sends its block's shard") or _sizes_cause(
        reduced, [n * count for count in shards], "the reduce-scatters were handed",
        "each takes its block's whole padded gradient")
    if sizes_wrong:
        return sizes_wrong
    worst = max((m.data.get("whole", 0)
                 for m in step.labelled("backward block", "optimizer")), default=0)
    if worst > 3:
        return (f"{worst} blocks held whole weights or gradients at once in backward, at "
                "most three may: free each block once its gradients are reduce-scattered")
    whole = step.labelled("optimizer")[0].data.get("whole", 0)
    if whole:
        return (f"{whole} blocks still held whole weights or gradients after backward: "
                "free both once a block's gradients are reduce-scattered")
    return ""


def _prefetch_cause(step: _Step, layers: int, waits: dict[int, float]) -> str:
    late = _not_prefetched(step.labelled("forward", "backward")[:-1],
                           step.labelled("forward computed"), _named(step.forward, ALL_GATHERS),
                           waits, lambda b: b + 2, lambda b: b + 1, "forward")
    return late or _not_prefetched(step.labelled("backward block", "optimizer")[:-1],
                                   step.labelled("backward computed"),
                                   _named(step.backward, ALL_GATHERS), waits,
                                   lambda b: layers - b + 1, lambda b: b - 1, "backward")


def _sizes_cause(calls: list[Call], want: list[int], what: str, rule: str) -> str:
    """"" when the calls' sizes, in any order, are ``want``; else what they were."""
    if sorted(call.elements for call in calls) == want:
        return ""
    return f"{what} {[call.elements for call in calls]} elements; {rule}, {want}"


def _first_waits(log: RankLog) -> dict[int, float]:
    """When each request's first wait() returned, by call: ``Call.ended`` is its last,
    and a second wait() after the block computed would hide a first one before."""
    first: dict[int, float] = {}
    for line in log.text.split("\n"):
        try:
            event = json.loads(line)
        except ValueError:  # a torn last line, or the empty string after the last newline
            continue
        if isinstance(event, dict) and event.get("e") == "waited":
            for seq in event.get("seqs", ()):
                first.setdefault(seq, event.get("t"))
    return first


def _not_prefetched(begun: list[Mark], computed: list[Mark], gathers: list[Call],
                    waits: dict[int, float], needed: Callable[[int], int],
                    next_block: Callable[[int], int], phase: str) -> str:
    """Whether the next block's all-gather overlapped each block's ``phase``: issued
    asynchronously before the block began to compute (``needed(block)`` gathers by then,
    the next block's the last of them), and first waited for once it had computed."""
    done = {mark.data["block"]: mark for mark in computed}
    for mark in begun:
        block, coming = mark.data["block"], next_block(mark.data["block"])
        issued = [c for c in gathers if c.seq < mark.calls]
        if len(issued) < needed(block) or gathers[needed(block) - 1].blocking:
            return (f"when block {block} began its {phase}, block {coming}'s all-gather had "
                    "not been issued asynchronously (async_op=True): issue it before this "
                    "block computes, wait for it before the next")
        gather, end = gathers[needed(block) - 1], done.get(block)
        waited = waits.get(gather.seq)
        if end is None:  # the grader's own hook did not fire: nothing to judge it by
            return (f"block {block}'s {phase} never ended where the grader could see it: "
                    "keep the block a module called on its input")
        if waited is None:
            return (f"block {coming}'s all-gather, issued as block {block} began its "
                    f"{phase}, was never waited for: call wait() on its handle before block "
                    f"{coming} computes")
        if waited < end.at:
            return (f"block {coming}'s all-gather overlapped nothing: issued as block "
                    f"{block} began its {phase}, it was waited for "
                    f"{(waited - gather.started) * 1e3:.2f} ms later, "
                    f"{(end.at - waited) * 1e3:.2f} ms before block {block} had computed. "
                    f"Wait for it when block {coming} begins, not in the hook that issues it")
    return ""


# --- memory between steps: what the contract allows a rank ---------------------------------------

SLACK_BLOCKS = 1  # gathered blocks a rank may hold beyond its shards; twice that with prefetch


def memory_bound(sizes: list[int], world: int, element_bytes: int, prefetch: bool,
                 slack_blocks: int = SLACK_BLOCKS) -> dict[str, int]:
    """Bytes one rank may hold between steps, by what for: its shard of each block's
    parameters, of their gradients, AdamW's two moments and step count for each shard,
    and whole gathered blocks of slack (the largest block, padded)."""
    shards = [math.ceil(size / world) * element_bytes for size in sizes]
    return {"parameters": sum(shards), "gradients": sum(shards),
            "optimizer": sum(2 * shard + element_bytes for shard in shards),
            "slack": slack_blocks * (2 if prefetch else 1) * world * max(shards)}


def memory_cause(log: RankLog, bound: dict[str, int], steps: int) -> str:
    """Why rank ``log.rank`` held more than ``bound`` between steps, or ""."""
    marks = [mark for mark in log.marks if mark.label == "memory"]
    if len(marks) != steps + 1:
        return (f"rank {log.rank}: the grader measured its memory {len(marks)} times, not "
                f"{steps + 1} (before the first step and after each): its training loop "
                "did not run as written")
    allowed = sum(bound.values())
    for mark in marks:
        where = f"rank {log.rank}, {mark.data.get('when', 'between steps')}"
        if "frozen" in mark.data:
            return (f"{where}: objects were frozen (gc.freeze), out of the garbage "
                    "collector's sight and the grader's: leave the collector's generations "
                    "alone")
        held = mark.data.get("held")
        if not isinstance(held, int):
            return f"{where}: the grader's measurement of the rank's memory is missing"
        if held > allowed:
            return (f"{where}: the rank held {held:,} B beyond the grader's own, "
                    f"{held - allowed:,} B over the {allowed:,} B one rank may hold between "
                    f"steps (its shard of the parameters {bound['parameters']:,} B, of "
                    f"their gradients {bound['gradients']:,} B, AdamW's state "
                    f"{bound['optimizer']:,} B, and {bound['slack']:,} B of slack for "
                    "gathered blocks). Between steps nothing whole may stay: no gathered "
                    "vector, no full-size gradient buffer, no autograd graph that saved "
                    "them")
    return ""


def _grade(prefetch: bool, slack_blocks: int = SLACK_BLOCKS):
    """The verdict on a case of fsdp/zero3 (fsdp/prefetch with ``prefetch``); memory
    judged with ``slack_blocks`` gathered blocks of slack (twice that with prefetch)."""
    def grade(case: Case, inputs: list[tuple], outputs: list[object],
              logs: list[RankLog]) -> CaseResult:
        n = world_size(case)
        for log in logs:
            invalid = next((m for m in log.marks if m.label == "invalid"), None)
            if invalid is not None:
                return CaseResult(case, Comparison(False, cause=f"rank {log.rank}: "
                                                   f"{invalid.data['why']}"))
        setup = inputs[0][0]
        want = reference(setup, [i[1] for i in inputs], [i[2] for i in inputs])
        got = torch.stack([out for out in outputs]) if all(
            isinstance(out, torch.Tensor) and out.shape == (len(want), 3) for out in outputs) \
            else None
        if got is None:
            return CaseResult(case, Comparison(False, cause="the training loop returned "
                                               "nothing: a rank's run was cut short"))
        trained = torch.stack([got[:, :, 0].mean(0), got[:, :, 1].sum(0).sqrt(),
                               got[:, :, 2].sum(0)], dim=1)
        wrong = numbers_cause(trained, want, n)
        # The worst relative error of any step's loss or gradient norm: a few numbers, so
        # no worst element of an array (0/0, for a norm of zero, counts as no error).
        error = max(relative_error(got, right) if got != right else 0.0 for got, right in
                    zip(trained[:, :2].reshape(-1).tolist(), want.reshape(-1).tolist(),
                        strict=True))
        wrong = _kept_whole_cause(logs, wrong) or wrong
        seen = Comparison(not wrong, rel_error=error, cause=wrong)
        if wrong:
            return CaseResult(case, seen)
        model = make_model(*setup[:4])
        sizes = block_sizes(model)
        bound = memory_bound(sizes, n, next(model.parameters()).element_size(), prefetch,
                             slack_blocks)
        for log in logs:
            cause = calls_cause(case, log, sizes, prefetch)
            if cause:
                return CaseResult(case, seen, error=cause)
        for log in logs:
            cause = memory_cause(log, bound, len(want)) or forward_memory_cause(
                log, math.ceil(max(sizes) / n) * n * next(model.parameters()).element_size())
            if cause:
                return CaseResult(case, seen, error=cause)
        return CaseResult(case, seen)
    return grade


# Whole blocks a rank may hold as its forward ends, beyond the activations: the last
# block, which an FSDP may keep for the backward that begins with it, and the buffers of
# the last all-gather, which gloo's process group holds a while after it completes.
FORWARD_SLACK_BLOCKS = 2


def forward_memory_cause(log: RankLog, block: int) -> str:
    """Why rank ``log.rank``'s forward held more than the activations and
    ``FORWARD_SLACK_BLOCKS`` blocks of ``block`` bytes (one whole padded block), or ""."""
    for step, mark in enumerate(m for m in log.marks if m.label == "forward memory"):
        beyond = mark.data["held"] - mark.data["activations"]
        if beyond > FORWARD_SLACK_BLOCKS * block:
            return (f"rank {log.rank}, step {step}: as its forward ended the rank held "
                    f"{beyond:,} bytes beyond the activations the model saves for backward "
                    f"({mark.data['activations']:,} B, measured on the model unsharded), "
                    f"{beyond / block:.1f} whole blocks' worth: blocks' gathered weights were "
                    "still alive after their forward. A tensor autograd saved in forward "
                    "(a view of a weight) keeps its storage: rebinding .data to a new tensor "
                    "leaves the old one alive; give the storage itself back "
                    "(untyped_storage().resize_(0)) and refill the same one")
    return ""


HINTS = ("Each block's parameters become one flat vector, padded to a multiple of N, and "
         "each parameter a view of it; keep the rank's slice as an nn.Parameter. The "
         "vector's storage is freed (resize_(0)) and refilled (resize_ back, then "
         "all_gather_into_tensor) in forward pre-hooks, forward hooks and backward "
         "pre-hooks; the gradients go through reduce_scatter_tensor once the block's are "
         "all accumulated (register_post_accumulate_grad_hook: a full backward hook fires "
         "too early on the first block, whose input needs no gradient).",
         "gather: full.untyped_storage().resize_(full.numel() * full.element_size()); "
         "self.gathering = dist.all_gather_into_tensor(full.data, shard.detach(), "
         "async_op=async_op). free: full.untyped_storage().resize_(0). reduce: flat = cat "
         "of the grads, padded; reduce_scatter_tensor(mine, flat); mine /= N (or op=ReduceOp.AVG, "
         "where the backend has it); shard.grad = mine.")
PREFETCH_HINTS = ("In block i's forward pre-hook: gather block i and wait for it, then "
                  "start block i + 1's gather with async_op=True and return. Block i + 1's "
                  "pre-hook then finds its vector on the way: gather() does nothing, wait() "
                  "waits for the handle. Backward: the same with block i − 1.",
                  "before_forward(i): units[i].gather(); units[i].wait(); if prefetch and "
                  "i + 1 < L: units[i + 1].gather(async_op=True). before_backward(i): the "
                  "same with i − 1 and i > 0.")

for _prefetch, _id, _title in ((False, "fsdp/zero3", "FSDP (ZeRO-3) from scratch"),
                               (True, "fsdp/prefetch", "FSDP with the next block prefetched")):
    register(RanksProblem(
        id=_id,
        title=_title,
        signature=("shard_layers(model: TinyTransformer"
                   + (", prefetch=True" if _prefetch else "")
                   + ") -> list[nn.Parameter], on every rank: one shard a block, for the "
                     "optimizer; afterwards forward and backward work as before"),
        make_inputs=inputs_maker(_prefetch),
        reference=reference,
        cost=cost,
        cpu_cases=CASES,
        gpu_cases=CASES,  # gloo processes in both worlds
        grade=_grade(_prefetch),
        harness=train,
        preload=("torch._dynamo", "rooflab.kernels.fsdp"),
        solution="rooflab.kernels.fsdp:shard_layers",
        # Five steps of a small model on 4 ranks: a second or two; a hang shows at once.
        time_limit_s=30.0,
        hints=PREFETCH_HINTS if _prefetch else HINTS,
        answer_in=("ShardedLayer", "shard_layers"),
    ))


# === fsdp/plan: FSDP or HSDP on many nodes, counted ===============================================

PLAN_FIELDS = ("bytes held", "bytes sent over NVLink", "bytes sent over the network")


def _plan_case(params: float, nodes: int, gpus: int, hybrid: bool, note: str = "") -> Case:
    return Case({"params": int(params), "nodes": nodes, "gpus_per_node": gpus,
                 "hybrid": int(hybrid)}, torch.float64, note=note)


DRAWN = "sizes drawn from the seed"


def _drawn_plan_case(hybrid: bool) -> Case:
    """A case whose sizes ``_plan_inputs`` draws from the check's seed: no table of the
    named cases' answers passes it."""
    return Case({"hybrid": int(hybrid)}, torch.float64, note=DRAWN)


# The named cases show the classic slips (HSDP held as if sharded over every GPU, a flat
# ring over the network, one node sending nothing over it); the drawn ones, any sizes.
PLAN_CASES = [
    _plan_case(8e9, 8, 8, False, note="FSDP over 64 GPUs"),
    _plan_case(8e9, 8, 8, True, note="HSDP: 8 replicas of 8-way sharding"),
    _plan_case(70e9, 1, 8, False, note="one node"),
    _plan_case(70e9, 1, 8, True, note="one node"),
    _drawn_plan_case(False),
    _drawn_plan_case(True),
]


def _plan_inputs(case: Case, generator: torch.Generator, device: torch.device) -> tuple:
    sizes = case.sizes
    if "params" in sizes:
        return (float(sizes["params"]), sizes["nodes"], sizes["gpus_per_node"],
                bool(sizes["hybrid"]))
    # Ψ from 10⁸ to 10¹² (any integer), 2 to 48 nodes of 2 to 8 GPUs: every count of
    # parameters, nodes and GPUs that does not divide evenly.
    exponent = 8 + 4 * float(torch.rand((), generator=generator, dtype=torch.float64))
    nodes = int(torch.randint(2, 49, (), generator=generator))
    gpus = int(torch.randint(2, 9, (), generator=generator))
    return float(round(10 ** exponent)), nodes, gpus, bool(sizes["hybrid"])


def _plan_reference(params: float, nodes: int, gpus_per_node: int, hybrid: bool) -> dict:
    from rooflab.kernels.fsdp import ADAM_MIXED_BYTES

    # The state is sharded over one node (HSDP) or over every GPU (FSDP). Each collective
    # runs in two levels: (g - 1)/g of it on NVLink, (n - 1)/n of a 1/g share on the network.
    shards = gpus_per_node * (1 if hybrid else nodes)
    weights = 2 * params  # bf16 bytes, gathered twice and reduce-scattered once a step
    on_network = (nodes - 1) / nodes * weights / gpus_per_node
    return {"want": (ADAM_MIXED_BYTES * params / shards,
                     3 * weights * (gpus_per_node - 1) / gpus_per_node,
                     (2 if hybrid else 3) * on_network),
            "params": params, "nodes": nodes, "gpus_per_node": gpus_per_node,
            "hybrid": hybrid}


def compare_plan(output: object, reference: dict) -> str:
    want = reference["want"]
    if not isinstance(output, (tuple, list)) or len(output) != 3:
        return f"return three numbers ({', '.join(PLAN_FIELDS)}); got {output!r}"
    got = [real_number(value) for value in output]
    if any(value is None for value in got):
        return f"return three numbers ({', '.join(PLAN_FIELDS)}); got {output!r}"
    wrong = [i for i in range(3) if not close_count(got[i], want[i])]
    if not wrong:
        return ""
    shown = "; ".join("{} {}, expected {}".format(PLAN_FIELDS[i], *told_apart(got[i], want[i]))
                      for i in wrong)
    setting = (f"for Ψ = {reference['params']:,.0f} on {reference['nodes']} nodes of "
               f"{reference['gpus_per_node']} GPUs, {'HSDP' if reference['hybrid'] else 'FSDP'}: ")
    return setting + shown + _plan_cause(got, reference, wrong)


def _plan_cause(got: list[float], reference: dict, wrong: list[int]) -> str:
    params, nodes, g = reference["params"], reference["nodes"], reference["gpus_per_node"]
    gpus = nodes * g
    if 0 in wrong:
        if reference["hybrid"] and math.isclose(got[0], 16 * params / gpus, rel_tol=RTOL):
            return (": HSDP shards only within a node and keeps a replica on every node, "
                    "so a GPU holds 16Ψ/g, not 16Ψ/G")
        for per, what in ((12, "without the bf16 weight and gradient"),
                          (8, "fp32 moments only"), (4, "the fp32 weight only")):
            if any(math.isclose(got[0], per * params / k, rel_tol=RTOL) for k in (g, gpus)):
                return (f": that is {per} bytes a parameter ({what}); mixed-precision Adam "
                        "holds 16: bf16 weight and gradient, fp32 master weight, m and v")
    if 2 in wrong and reference["hybrid"] and math.isclose(
            got[2], 2 * (nodes - 1) / nodes * 2 * params, rel_tol=RTOL):
        return (": each GPU all-reduces only its gradient shard across nodes, 2Ψ/g bytes, "
                "not the whole gradient")
    if 2 in wrong and not reference["hybrid"] and math.isclose(
            got[2], 3 * (gpus - 1) / gpus * 2 * params, rel_tol=RTOL):
        return (": that is every byte of a flat ring over all GPUs. Across nodes the "
                "collectives run in two levels: only the GPUs of one local rank exchange "
                "over the network, each 1/g of the data, (n − 1)/n of it")
    return ""


register(Problem(
    id="fsdp/plan", title="FSDP or HSDP on many nodes: memory and traffic per GPU",
    signature=("sharding_plan(params, nodes, gpus_per_node, hybrid) -> (bytes held, bytes "
               "sent over NVLink, bytes sent over the network), per GPU and step"),
    make_inputs=_plan_inputs, reference=_plan_reference, cost=lambda case: Cost(0, 0),
    kernel=None, timed=False, compare=compare_plan,
    cpu_cases=PLAN_CASES, gpu_cases=PLAN_CASES,
    solution="rooflab.kernels.fsdp:sharding_plan",
    hints=("Held: 16 bytes a parameter, divided by the number of GPUs the state is sharded "
           "over: all of them for FSDP, one node's for HSDP. Sent: in two levels, an "
           "all-gather or reduce-scatter of S sends (g − 1)/g·S over NVLink and (n − 1)/n·"
           "S/g over the network; an all-reduce twice that.",
           "Both send 3·(g − 1)/g·2Ψ over NVLink. Network: FSDP 3·(n − 1)/n·2Ψ/g (its three "
           "collectives' cross-node level), HSDP 2·(n − 1)/n·2Ψ/g (one all-reduce of the "
           "gradient shard)."),
    answer_in=("sharding_plan",),
))
