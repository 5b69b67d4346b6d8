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
  as Megatron does, and all-reduce the LayerNorms' gradients); nothing else. Where a
  count is wrong, each backward call's autograd node (``Call.node``), placed in the graph
  the harness reads after backward (``_graph``: the layers that feed it and read it),
  says whether g's backward or one f too many made it; where a collective raised, the
  shapes it was handed (``Call.shape``, ``Call.into``) against those that move the
  sequence;
* what the collectives carried, from the digest of what each rank handed each one
  (``Call.digest``): each all-reduce (with SP each reduce-scatter) the rank's own
  partial sum, which summed over the ranks is one process's output of the half's
  row-parallel projection in forward and the gradient at the half's input in backward;
  with SP each all-gather the rank's slice of the half's input in forward, and in
  backward of the gradient at a half's output (or of its input, gathered again).
  Answers that reached the ranks another way (a file) while the collectives carried
  zeros or junk fail (``carried_cause``);
* with SP, the order: what each half was handed (the harness's forward pre-hooks, after
  the learner's), row by row against one process's: the right rows in another order
  (slices gathered out of rank order, tokens interleaved) is said so;
* with SP, the activations: what the rank holds after forward, beyond what it held
  before (``evidence/live_memory.py``), at most what splitting every activation along
  the sequence leaves, plus the gathered inputs of the two halves.

``tp/plan`` counts, per GPU and step, what data parallelism, FSDP and tensor + sequence
parallelism (and their combination) hold and send, on named cases and on sizes drawn
from the seed.
"""

from __future__ import annotations

import math
import re
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
    # Everything made from here on, wherever it is kept (a module of the library's, say,
    # which the walk from the block and the learner's code does not enter), is counted
    # against the rank's share of the weights as well.
    before_block = live("cpu").bytes
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
    record.mark("weights", held=max(storage_bytes(reachable_buffers(block, candidate)),
                                    live("cpu").bytes - before_block))
    if sequence:
        share = x.shape[1] // world
        x, grad = (t[:, rank * share:(rank + 1) * share].contiguous() for t in (x, grad))
    x = x.clone().requires_grad_()
    watching = _watch_halves(block) if sequence else []
    before = live("cpu").bytes
    record.mark("forward")
    try:
        output = block(x)
        for handle in watching:
            handle.remove()
        record.mark("backward", activations=live("cpu").bytes - before)
        local_part(output).backward(grad)
    except Exception as error:  # noqa: BLE001 (judged with the calls that led to it)
        record.mark("raised", error=f"{type(error).__name__}: {str(error)[:300]}")
        return torch.empty(0)
    finally:
        for handle in watching:
            handle.remove()
    try:
        graph = _graph(local_part(output), block)
    except Exception:  # noqa: BLE001 (a graph it cannot read: where the calls ran is unknown)
        graph = None
    record.mark("graph", nodes=graph)
    record.mark("after", frozen=refrozen(sentinel))
    parts = [local_part(output), x.grad, *(local_part(weights[name].grad) for name in SPLITS),
             *(local_part(_parameter(block, name).grad) for name in NORMS)]
    record.mark("returned", sizes=[-1 if p is None else p.numel() for p in parts])
    return torch.cat([p.detach().reshape(-1).double() for p in parts if p is not None])


HALVES = ("attention", "mlp")


def rows_digest(tensor: torch.Tensor) -> list[list[float]]:
    """Each row of the last dimension (a token's activation) in three numbers: the sum of
    its values, their sum weighted by place (1, 2, 3, …) and the sum of their magnitudes."""
    rows = tensor.detach().reshape(-1, tensor.shape[-1]).double()
    place = torch.arange(1, rows.shape[1] + 1, dtype=torch.float64)
    return torch.stack([rows.sum(1), (rows * place).sum(1), rows.abs().sum(1)], 1).tolist()


def _watch_halves(block: torch.nn.Module) -> list:
    """Forward pre-hooks on the block's attention and MLP, run after the learner's own:
    each marks, the first time, the shape of what that half is handed and the digest of
    each of its rows (``rows_digest``), which the grader sets against one process's."""
    handles, marked = [], set()
    for half in HALVES:
        module = getattr(block, half, None)
        if not isinstance(module, torch.nn.Module):
            continue

        def seen(module, args, half=half):
            if half in marked:
                return
            marked.add(half)
            given = local_part(args[0]) if args and isinstance(args[0], torch.Tensor) \
                else None
            if given is None or given.dim() == 0:
                record.mark(f"{half} input", shape=None)
                return
            record.mark(f"{half} input", shape=list(given.shape),
                        rows=rows_digest(given) if given.numel() <= 1 << 16 else None)

        handles.append(module.register_forward_pre_hook(seen))
    return handles


def _graph(output: torch.Tensor, block: torch.nn.Module) -> list[list] | None:
    """The autograd graph from the block's output, as [sequence number, name, the layers
    whose output feeds the node, the layers that read its output] a node: a layer is a
    module with parameters (attention.q, attention_norm), found as the node that takes a
    parameter's gradient, and each list holds the nearest ones. A collective made in
    backward names its node (``record.Call.node``): this says where that node sits."""
    root = getattr(output, "grad_fn", None)
    if root is None:
        return None
    names = {id(p): name.rpartition(".")[0] for name, p in block.named_parameters()}

    def layers(node) -> set[str]:
        found = set()
        for step, _ in node.next_functions:
            for _ in range(3):  # through a transpose or a view to the parameter
                if step is None:
                    break
                variable = getattr(step, "variable", None)
                if variable is not None:
                    if id(variable) in names:
                        found.add(names[id(variable)])
                    break
                if len(step.next_functions) != 1:
                    break
                step = step.next_functions[0][0]
        return found

    nodes, consumers, order = {}, {}, [root]
    while order and len(nodes) < 5000:
        node = order.pop()
        if node in nodes:
            continue
        nodes[node] = layers(node) if getattr(node, "variable", None) is None else None
        for step, _ in node.next_functions:
            if step is not None:
                consumers.setdefault(step, []).append(node)
                order.append(step)

    def nearest(start, edges) -> list[str]:
        found, seen, order = set(), set(), list(edges(start))
        while order:
            node = order.pop()
            if node in seen or nodes.get(node) is None:
                continue
            seen.add(node)
            if nodes[node]:
                found |= nodes[node]
            else:
                order.extend(edges(node))
        return sorted(found)

    def feeding(node):
        return [step for step, _ in node.next_functions if step is not None]

    def reading(node):
        return consumers.get(node, [])

    return [[int(node._sequence_nr()), node.name(), nearest(node, feeding),
             nearest(node, reading)] for node, own in nodes.items() if own is not None]


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
    parameter's gradient; and what the collectives must carry: each half's input, its
    input's gradient and its output's, the input of each row-parallel layer, the
    gradient at the output of each column-parallel layer and every split weight
    (``carried_cause`` splits them into each rank's partial sums)."""
    dim, heads, seed, _ = setup
    halves: dict[str, torch.Tensor] = {}

    def seen(half: str):
        def hook(module, args) -> None:  # returns None: the input goes on as it is
            if f"{half} input" in halves:
                return
            halves[f"{half} input"] = args[0].detach().clone()
            if args[0].requires_grad:
                args[0].register_hook(kept(f"{half} input grad"))
        return hook

    def kept(name: str):
        def hook(grad: torch.Tensor) -> None:
            halves.setdefault(name, grad.detach().clone())
        return hook

    def row_input(name: str):
        def hook(module, args) -> None:
            halves.setdefault(f"{name} input", args[0].detach().clone())
        return hook

    def half_output(half: str):
        def hook(module, args, output) -> None:
            if output.requires_grad and f"{half} output grad" not in halves:
                output.register_hook(kept(f"{half} output grad"))
        return hook

    def column_output(name: str):
        def hook(module, args, output) -> None:
            if output.requires_grad and f"{name} output grad" not in halves:
                output.register_hook(kept(f"{name} output grad"))
        return hook

    with one_cpu_thread():
        block = make_block(dim, heads, seed).double()
        for half in HALVES:
            block.get_submodule(half).register_forward_pre_hook(seen(half))
            block.get_submodule(half).register_forward_hook(half_output(half))
        for name in ROW_LAYERS:
            block.get_submodule(name).register_forward_pre_hook(row_input(name))
        for name in COLUMN_LAYERS:
            block.get_submodule(name).register_forward_hook(column_output(name))
        x = x.double().requires_grad_()
        output = block(x)
        output.backward(grad.double())
    found = {"output": output.detach(), "input": x.grad}
    found.update(halves)
    found.update((name, _weight(block, name).grad) for name in SPLITS)
    found.update((f"{name} weight", _weight(block, name).detach()) for name in SPLITS)
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


def _sequence_order(perm: list[int], batch: int, length: int, n: int) -> str:
    """In words, where the tokens of a (batch × length) sequence went: ``perm[i]`` is the
    row (batch·length + token) that row i holds."""
    share = length // n
    moved = [(i // length, i % length, j // length, j % length) for i, j in enumerate(perm)]
    crossed = next((m for m in moved if m[0] != m[2]), None)
    if crossed is not None:
        return (f"token {crossed[1]} of sequence {crossed[0]} in the batch holds token "
                f"{crossed[3]} of sequence {crossed[2]}: the batch and the sequence are "
                "mixed")
    sources = [j % length for j in perm[:length]]
    same = all(perm[b * length + p] % length == sources[p] for b in range(batch)
               for p in range(length))
    chunks = [sources[k * share] // share for k in range(n)] if share else []
    if same and share and all(sources[k * share + i] == chunks[k] * share + i
                              for k in range(n) for i in range(share)):
        return (f"the ranks' slices in the order {', '.join(map(str, chunks))}, where the "
                f"sequence is rank 0's {share} tokens, then rank 1's, and so on")
    shown = min(length, 2 * n)
    return (f"its first {shown} tokens are the sequence's {', '.join(map(str, sources[:shown]))}"
            f", not 0 to {shown - 1}")


def order_cause(case: Case, want: dict[str, torch.Tensor], logs: list[RankLog]) -> str:
    """With SP, "" or why a half of the block computed on the wrong sequence: the rows it
    was handed (the harness's mark of each row's digest) are one process's, each of them,
    but in another order. Only a half handed the whole (b, s, h) sequence is judged."""
    n = world_size(case)
    for log in logs:
        for half in HALVES:
            mark = next((m for m in log.marks if m.label == f"{half} input"), None)
            right = want.get(f"{half} input")
            if mark is None or right is None or mark.data.get("shape") != list(right.shape):
                continue
            try:
                got = torch.tensor(mark.data.get("rows"), dtype=torch.float64)
            except (TypeError, ValueError, RuntimeError):
                continue
            wanted = torch.tensor(rows_digest(right), dtype=torch.float64)
            if got.shape != wanted.shape:
                continue
            scale = wanted[:, 2:].clamp(min=1.0) * torch.tensor([1.0, right.shape[-1], 1.0])
            same = ((got[:, None, :] - wanted[None, :, :]).abs()
                    <= 1e-4 * scale[None, :, :]).all(-1)
            if bool(same.diagonal().all()):
                continue  # in order
            perm: list[int] = []
            for i in range(same.shape[0]):
                options = [j for j in same[i].nonzero().flatten().tolist() if j not in perm]
                if not options:
                    break
                perm.append(i if i in options else options[0])
            if len(perm) != same.shape[0]:
                break  # rows that are not one process's: no order to speak of
            batch, length = right.shape[0], right.shape[1]
            return (f"rank {log.rank}: block.{half} was handed the whole sequence, every "
                    "token's row as one process has it, but out of order: "
                    f"{_sequence_order(perm, batch, length, n)}. So the block's output "
                    f"differs: rank r's slice belongs at tokens [{length // n}·r, "
                    f"{length // n}·(r + 1)) of what each half is handed")
    return ""


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


MARKS = ("weights", "forward", "backward", "after", "returned", "raised", "invalid", "graph",
         *(f"{half} input" for half in HALVES))


def _phase(log: RankLog, label: str, until: str | None) -> list[Call]:
    start = next((m for m in log.marks if m.label == label), None)
    end = next((m for m in log.marks if m.label == until), None) if until else None
    if start is None:
        return []
    last = end.calls if end is not None else len(log.calls)
    return [call for call in log.calls if start.calls <= call.seq < last]


ROW_LAYERS = tuple(name for name, split in SPLITS.items() if split == "row")
COLUMN_LAYERS = tuple(name for name, split in SPLITS.items() if split == "column")


def graph_nodes(log: RankLog) -> dict[int, tuple[str, list[str], list[str]]]:
    """The rank's autograd graph as the harness marked it (``_graph``): by sequence
    number, the node's name, the layers that feed it and those that read it."""
    mark = next((m for m in log.marks if m.label == "graph"), None)
    nodes = mark.data.get("nodes") if mark is not None else None
    table: dict[int, tuple[str, list[str], list[str]]] = {}
    for entry in nodes if isinstance(nodes, list) else ():
        if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], int) and \
                isinstance(entry[1], str) and all(isinstance(e, list) for e in entry[2:]):
            table[entry[0]] = (entry[1], [str(e) for e in entry[2]], [str(e) for e in entry[3]])
    return table


def _written_name(name: str) -> str:
    """A node's name as the learner wrote it: an autograd Function's class (the node of
    ``ReduceFromParallel`` is ``ReduceFromParallelBackward``), or torch's own node."""
    return name.removesuffix("Backward") or name


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _where_cause(log: RankLog, reduces: list[Call]) -> str:
    """Why backward's all-reduces are not f's two, from where each ran: the autograd node
    whose backward made it (``Call.node``) and where that node sits in the block's graph:
    g (it sums a row-parallel layer's output), f (column-parallel layers read its output)
    or neither. "" when no call's node is known."""
    table = graph_nodes(log)
    placed: dict[str, list[tuple[int, str, list[str], list[str]]]] = {"g": [], "f": [], "": []}
    for call in reduces:
        if call.node is None or call.node[1] not in table:
            continue
        name, feeds, reads = table[call.node[1]]
        role = "g" if set(feeds) & set(ROW_LAYERS) else \
            "f" if set(reads) & set(COLUMN_LAYERS) else ""
        placed[role].append((call.node[1], _written_name(name), feeds, reads))
    known = sum(len(calls) for calls in placed.values())
    if not known:
        return ""
    parts = []
    if placed["g"]:
        functions = _and(sorted({name for _, name, _, _ in placed["g"]}))
        summed = _and([layer + "'s" for layer in sorted(
            {layer for _, _, feeds, _ in placed["g"] for layer in feeds if layer in ROW_LAYERS})])
        parts.append(f"{len(placed['g'])} ran in the backward of {functions} (g, which sums "
                     f"{summed} partial outputs), which "
                     "passes its gradient through unchanged")
    if placed["f"]:
        functions = _and(sorted({name for _, name, _, _ in placed["f"]}))
        distinct = {seq: reads for seq, _, _, reads in placed["f"]}
        text = f"{len(placed['f'])} ran in the backward of {functions} (f)"
        halves = [sum(any(layer.startswith(half + ".") for layer in reads)
                      for reads in distinct.values()) for half in HALVES]
        if len(distinct) > 2 or max(halves) > 1:
            readers = list(distinct.values())
            readers.sort(key=lambda r: min(list(SPLITS).index(layer) if layer in SPLITS
                                           else len(SPLITS) for layer in r) if r else 0)
            text += (f", {len(distinct)} separate ones: " + (
                f"one for each of {_and([r[0] for r in readers])}"
                if all(len(r) == 1 for r in readers) else
                "read by " + "; ".join(_and(r) for r in readers)))
            if halves[0] > 1:
                text += ". q, k and v read one input: one f for the three, where the " \
                        "attention begins"
            elif halves[1] > 1:
                text += ". One f where the MLP begins"
        elif len(placed["f"]) > len(distinct):
            text += (f", {len(placed['f'])} times from {len(distinct)}: each f's backward "
                     "all-reduces once")
        else:
            text += ", one where each half begins, as they should"
        parts.append(text)
    if placed[""]:
        functions = _and(sorted({name for _, name, _, _ in placed[""]}))
        feeds = sorted({layer for _, _, f, _ in placed[""] for layer in f})
        reads = sorted({layer for _, _, _, r in placed[""] for layer in r})
        parts.append(f"{len(placed[''])} ran in the backward of {functions}, between "
                     f"{_and(feeds) if feeds else 'the input'} and "
                     f"{_and(reads) if reads else 'the output'}: neither f nor g")
    if known < len(reduces):
        parts.append(f"{len(reduces) - known} where the grader cannot tell")
    return "; ".join(parts)


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
                # In backward, where each ran says why; where that is not known, the count.
                ran = _where_cause(log, reduces) if phase == "backward" else ""
                return (f"{where}'s {phase} made {len(reduces)} all-reduces, not 2 "
                        f"(of {sorted(c.elements for c in reduces)} elements): "
                        + (ran or contract))
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


# --- what the collectives carried -----------------------------------------------------------------

# float32 ranks against a float64 process: a digest's sums may be off by this much of the
# magnitudes summed into them (rounding in another order, over a few hundred terms).
CARRIED_RTOL = 1e-4


def _partials(want: dict[str, torch.Tensor], half: str, forward: bool,
              n: int) -> list[torch.Tensor]:
    """Each rank's partial sum, in one process's numbers: forward, what its columns of the
    half's row-parallel layer make of its slice of that layer's input; backward, what its
    rows of the half's column-parallel layers make of its slice of their output's
    gradient (the gradient at the half's input, before f sums it)."""
    parts = []
    for rank in range(n):
        if forward:
            name = ROW_LAYERS[HALVES.index(half)]
            weight = _slice(want[f"{name} weight"], "row", rank, n)
            columns = weight.shape[1]
            given = want[f"{name} input"][..., rank * columns:(rank + 1) * columns]
            parts.append(given @ weight.t())
            continue
        total = None
        for name in COLUMN_LAYERS:
            if not name.startswith(half + "."):
                continue
            weight = _slice(want[f"{name} weight"], "column", rank, n)
            rows = weight.shape[0]
            grad = want[f"{name} output grad"][..., rank * rows:(rank + 1) * rows]
            total = grad @ weight if total is None else total + grad @ weight
        parts.append(total)
    return parts


def _layouts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The orders a (b, s, h) tensor may be handed to a collective in, flattened: as it
    is, or with the sequence first (to gather or scatter along dimension 0)."""
    return [tensor.reshape(-1), tensor.movedim(1, 0).reshape(-1)]


def _sums(flat: torch.Tensor) -> torch.Tensor:
    """``record.digest``'s first two numbers, and what rounding may move each by: the sum
    of magnitudes, plain and weighted by place."""
    place = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
    size = flat.abs()
    return torch.stack([flat.sum(), (flat * place).sum(), size.sum(), (size * place).sum()])


def _carries(call: Call, part: torch.Tensor, times: int = 1) -> bool:
    """Whether the call (with a digest) was handed ``times`` ``part``, in one layout."""
    row = torch.tensor(call.digest[:2], dtype=torch.float64)
    return any(bool(((row - times * way[:2]).abs() <= abs(times) * CARRIED_RTOL * way[2:] +
                     1e-12).all()) for way in (_sums(flat) for flat in _layouts(part)))


def _own_cause(calls: list[Call], parts: list[torch.Tensor], head: str, partial: str,
               note: str = "") -> str:
    """"" if each rank's call (``calls[r]``, with a digest) carried its own ``parts[r]``,
    in one layout; else the first rank's that did not."""
    for rank, (call, part) in enumerate(zip(calls, parts, strict=True)):
        if _carries(call, part):
            continue
        expected, got = float(part.sum()), call.digest[0]
        times = round(got / expected) if expected else 0
        said = f"{times} times it" if times not in (0, 1) and _carries(call, part, times) \
            else f"their sum is {got:.6g}, one process's {expected:.6g}"
        return f"rank {rank}'s {head} was handed values that are not {partial}{note}: {said}"
    return ""


def _what_carried(calls: list[Call], parts: list[torch.Tensor], totals: list[torch.Tensor],
                  head: str, kind: str, meant: str, partial: str) -> str:
    """"" if the ranks' calls (one a rank, ``calls[r]`` handed ``parts[r]`` in one
    process's numbers) carried what they must: summed over the ranks, the digest of one
    of ``totals``, in one layout; each rank's own ``parts[r]`` where ``totals`` is empty.
    Else why not, the call named by ``head`` ("1st all-reduce in forward (…)")."""
    for rank, (call, part) in enumerate(zip(calls, parts, strict=True)):
        if call.digest is None:
            return (f"rank {rank}'s {head} has no record of what it was handed: the grader "
                    f"cannot see that it carried {partial}")
        if call.digest[2] == 0 and float(part.abs().sum()) > 0:
            return (f"rank {rank}'s {head} was handed only zeros, where it must carry "
                    f"{partial}: what the ranks returned did not come through it")
    if not totals:
        return _own_cause(calls, parts, head, partial)
    got = torch.tensor([call.digest[:2] for call in calls], dtype=torch.float64)
    summed = got.sum(0)

    def within(times: int) -> bool:
        """The sum over the ranks is ``times`` one of the totals, in some layout."""
        for layout in range(2):
            slack = CARRIED_RTOL * sum(_sums(_layouts(p)[layout])[2:] for p in parts)
            for total in totals:
                way = _sums(_layouts(total)[layout])
                room = abs(times) * (slack + CARRIED_RTOL * way[2:]) + 1e-12
                if bool(((summed - times * way[:2]).abs() <= room).all()):
                    return True
        return False

    if within(1):
        # And each rank its own: not one rank the whole sum, learnt another way.
        return _own_cause(calls, parts, head, partial, note=(
            f" (the ranks' sum is {meant}, but not shared as the split shares it)"))
    expected = float(_sums(totals[0].reshape(-1))[0])
    said = (f"their sum over the ranks is {float(summed[0]):.6g}, one process gives "
            f"{expected:.6g}")
    times = round(float(summed[0]) / expected) if expected else 0
    if times not in (0, 1) and within(times):
        said = f"their sum over the ranks is {times} times what one process gives"
    return (f"the {head} was handed values that do not sum over the ranks to {meant}: "
            f"{said}: each rank's {kind} must carry {partial}")


ROLES = {("forward", "attention"): ("g, after attention.out", "the attention's output"),
         ("forward", "mlp"): ("g, after mlp.down", "the MLP's output"),
         ("backward", "mlp"): ("f, where the MLP begins", "the gradient at the MLP's input"),
         ("backward", "attention"): ("f, where the attention begins",
                                     "the gradient at the attention's input")}


def carried_cause(case: Case, want: dict[str, torch.Tensor], logs: list[RankLog],
                  sequence: bool) -> str:
    """Why what the ranks handed their collectives is not what Megatron's split sends,
    or "": each all-reduce (with SP each reduce-scatter) carries the rank's own partial
    sum, so that over the ranks they sum to one process's output of the half (forward:
    the projection, before the residual add) or to the gradient at its input
    (backward); with SP each all-gather carries the rank's slice of the half's input
    (forward) or of what ``_gathered_back_cause`` lists (backward). The calls' counts
    and sizes are Megatron's (``calls_cause``) when this runs.
    Judged on each call's digest (``record.digest``): a candidate whose answers came
    another way (a file, say) while its collectives carried zeros or junk fails here."""
    n = world_size(case)
    reduces = REDUCE_SCATTERS if sequence else ("all_reduce",)
    kind = "reduce-scatter" if sequence else "all-reduce"
    for phase, until, halves in (("forward", "backward", HALVES),
                                 ("backward", "after", HALVES[::-1])):
        calls = [[c for c in _phase(log, phase, until) if c.op in reduces] for log in logs]
        if any(len(c) != len(halves) for c in calls):
            return ""  # counts are calls_cause's to judge
        for nth, half in enumerate(halves):
            role, meant = ROLES[(phase, half)]
            parts = _partials(want, half, phase == "forward", n)
            totals = [sum(parts[1:], parts[0]) if phase == "forward"
                      else want[f"{half} input grad"]]
            head = f"{_nth(nth + 1)} {kind} in {phase} ({role})"
            cause = _what_carried([c[nth] for c in calls], parts, totals, head, kind, meant,
                                  "its own partial sum")
            if cause:
                return cause
        if sequence and phase == "forward":
            gathers = [[c for c in _phase(log, phase, until) if c.op in ALL_GATHERS]
                       for log in logs]
            if any(len(c) != len(HALVES) for c in gathers):
                return ""
            for nth, half in enumerate(HALVES):
                parts = [_sequence_slice(want[f"{half} input"], rank, n) for rank in range(n)]
                named = {"attention": "the attention", "mlp": "the MLP"}[half]
                head = f"{_nth(nth + 1)} all-gather in forward (where {named} begins)"
                cause = _what_carried([c[nth] for c in gathers], parts, [], head,
                                      "all-gather", "", f"the rank's slice of {named}'s input")
                if cause:
                    return cause
        if sequence and phase == "backward":
            cause = _gathered_back_cause(want, logs, n)
            if cause:
                return cause
    return ""


def _gathered_back_cause(want: dict[str, torch.Tensor], logs: list[RankLog], n: int) -> str:
    """With SP, why an all-gather in backward did not carry what one carries there, or
    "": the rank's slice of the gradient at a half's output (where the half's
    reduce-scatter was, in forward), or, gathered again, of a half's input."""
    keys = [f"{half} output grad" for half in HALVES] + [f"{half} input" for half in HALVES]
    for log in logs:
        rank = log.rank
        parts = [_sequence_slice(want[key], rank, n) for key in keys]
        gathers = [c for c in _phase(log, "backward", "after") if c.op in ALL_GATHERS]
        for nth, call in enumerate(gathers, 1):
            head = f"rank {rank}'s {_nth(nth)} all-gather in backward"
            if call.digest is None:
                return (f"{head} has no record of what it was handed: the grader cannot see "
                        "what it carried")
            if any(_carries(call, part) for part in parts):
                continue
            if call.digest[2] == 0:
                return (f"{head} was handed only zeros, where it must carry the rank's slice "
                        "of the gradient at a half's output: what the ranks returned did "
                        "not come through it")
            return (f"{head} was handed values that are not the rank's slice of the "
                    "gradient at either half's output, nor of either half's input: it "
                    "carries the gradient at the output of the half whose reduce-scatter it "
                    "undoes (or, gathering the saved input again, the half's input)")
    return ""


def _dims(shape: list) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _nth(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else \
        {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def collective_shape_cause(case: Case, log: RankLog) -> str:
    """With SP, why the all-gather or reduce-scatter rank ``log.rank`` raised in could
    not run, from the shapes it was handed (``Call.shape``, ``Call.into``) against those
    that move the sequence; "" if it raised in neither, or their shapes are not known."""
    call = log.blocked_in
    gathers = call is not None and call.op in ALL_GATHERS
    if call is None or not (gathers or call.op in REDUCE_SCATTERS) or not call.shape or \
            not call.into:
        return ""
    n, batch, length, dim = world_size(case), BATCH, case.sizes["length"], case.sizes["dim"]
    share = length // n
    start = next((m.calls for m in log.marks if m.label == "backward"), None)
    phase = "backward" if start is not None and call.seq >= start else "forward"
    kind = ALL_GATHERS if gathers else REDUCE_SCATTERS
    nth = sum(1 for c in _phase(log, phase, "after" if phase == "backward" else "backward")
              if c.op in kind and c.seq <= call.seq)
    what = "all-gather" if gathers else "reduce-scatter"
    head = f"rank {log.rank}'s {_nth(max(nth, 1))} {what} in {phase}, {call.library()}, "
    flat = all(isinstance(d, int) for d in call.shape)
    into_flat = all(isinstance(d, int) for d in call.into)
    sequence_first = (f"The sequence is dimension 1 of the rank's {_dims([batch, share, dim])} "
                      f"slice ({share} of the {length} tokens): to gather it, put it first, a "
                      f"{_dims([share, batch, dim])} slice into {_dims([length, batch, dim])}, "
                      "and move it back after")
    if call.op == "all_gather_into_tensor" and flat and into_flat:
        needs = [n * call.shape[0], *call.shape[1:]]
        return (head + f"was handed the rank's slice as {_dims(call.shape)} and an output of "
                f"{_dims(call.into)}: it stacks the {n} ranks' tensors along their first "
                f"dimension, so that output would be {_dims(needs)}"
                + ("" if call.shape == [share, batch, dim] else ". " + sequence_first))
    if gathers and flat and not into_flat:
        return (head + f"was handed the rank's slice as {_dims(call.shape)} and "
                f"{len(call.into)} outputs of {', '.join(_dims(d) for d in call.into)}: it "
                f"takes {n} outputs, one a rank, each of the slice's shape; then "
                "concatenate them along the sequence, dimension 1")
    if call.op == "reduce_scatter_tensor" and flat and into_flat:
        first = call.shape[0] if call.shape else 0
        text = (head + f"was handed partial sums of {_dims(call.shape)} and an output of "
                f"{_dims(call.into)}: it splits its input's first dimension {n} ways, "
                + (f"so that output would be {_dims([first // n, *call.shape[1:]])}"
                   if first % n == 0 else f"and {first} does not split {n} ways"))
        if call.shape != [length, batch, dim]:
            text += (f". The partial sums are the {_dims([batch, length, dim])} activation: "
                     f"with the sequence first, {_dims([length, batch, dim])} into "
                     f"{_dims([share, batch, dim])}")
        if n * batch in call.shape and share in call.shape and length not in call.shape \
                and n * batch not in (share, length):
            text += (f". This one holds {n} × {batch} = {n * batch} along one dimension and "
                     f"{share} tokens along another: the ranks' slices were put together "
                     "along the batch, not the sequence")
        return text
    return ""


def gathered_batch_cause(case: Case, log: RankLog) -> str:
    """With SP, "" or the first all-gather in forward, by torch.distributed's function,
    that stacked the ranks' (b, s/t, h) slices along the batch: what a forward that then
    raised had gathered (an all-gather can do so rightly, and reorder after; told only
    when the block raised)."""
    n, batch, length, dim = world_size(case), BATCH, case.sizes["length"], case.sizes["dim"]
    share = length // n
    if batch == share:
        return ""  # the shapes cannot tell the batch from the sequence
    for nth, call in enumerate((c for c in _phase(log, "forward", "backward")
                                if c.op in ALL_GATHERS), 1):
        if call.op == "all_gather_into_tensor" and not call.via and \
                call.shape == [batch, share, dim] and call.into == [n * batch, share, dim]:
            return (f"its {_nth(nth)} all-gather in forward stacked the ranks' "
                    f"{_dims(call.shape)} slices along dimension 0, the batch, into "
                    f"{_dims(call.into)}. The sequence is dimension 1 ({share} tokens a "
                    f"rank): put it first, a {_dims([share, batch, dim])} slice into "
                    f"{_dims([length, batch, dim])}, and move it back after")
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


# The prefix torch's C++ logging puts before a failed check's words: which rank, a time
# stamp and a source line, different each run.
LOG_PREFIX = re.compile(r"\[rank\d+\]:\[[A-Z]\d{4} [\d:.]+ [^\]]*\] ")


def _error_words(error: object) -> str:
    return LOG_PREFIX.sub("", str(error)).strip()


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
                shapes = collective_shape_cause(case, log) if sequence else ""
                if shapes and not cause:
                    return CaseResult(case, Comparison(False, cause=(
                        f"{shapes}; it raised {_error_words(raised.data.get('error'))}")))
                if sequence and not cause and phase == "forward":
                    cause = gathered_batch_cause(case, log)
                return CaseResult(case, Comparison(False, cause=(
                    f"rank {log.rank} raised {_error_words(raised.data.get('error'))} in the "
                    "block's "
                    f"{phase}" + (f"; before it, {cause}" if cause else ""))))
        for log in logs:
            cause = weights_cause(case, log) or calls_cause(case, log, sequence)
            if cause:
                return CaseResult(case, Comparison(False, cause=cause))
        setup, x, grad = inputs[0]
        want = reference(setup, x, grad)
        wrong, error = numbers_cause(case, want, outputs, logs, sequence)
        if wrong and sequence:
            wrong = order_cause(case, want, logs) or wrong
        if not wrong and sequence:
            for log in logs:
                cause = activations_cause(case, log)
                if cause:
                    return CaseResult(case, Comparison(True, rel_error=error), error=cause)
        # Right answers, from collectives that carried them (or from a side channel).
        wrong = wrong or carried_cause(case, want, logs, sequence)
        return CaseResult(case, Comparison(not wrong, rel_error=error, cause=wrong))
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
