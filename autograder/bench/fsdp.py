"""``rooflab bench fsdp``: the course's ZeRO-3 sharding against PyTorch's FSDP2, trained
on gloo ranks on this machine's CPU.

Four ranks (one torch thread each) train the same ``TinyTransformer`` from the same
initial weights on the same batches (rank r takes its slice of every step's batch), fp32,
AdamW, three ways side by side:

* ``fully_shard`` (FSDP2) applied to each block, then to the root, the usual way;
* the course's ``shard_layers(model)``;
* the course's ``shard_layers(model, prefetch=True)``.

A step is forward, backward and the optimizer's step; each rank times its own after a
barrier, and a step's time is its slowest rank's (the step is done when its last rank
is). The three take turns step by step, in an order that rotates, so that a shared
CPU's slow moments fall on all of them alike; after the warm-up steps, the median of
the timed ones is reported. Every step's loss (the mean over ranks) of each course run
must agree with FSDP2's to ``RELATIVE``: a sharding that computes something else stops
the benchmark.

Memory, per rank, after the last step (before its gradients are cleared), by kind, with
``memory_held``: the parameters a rank keeps (FSDP2's are DTensors: their local shards),
their gradients and AdamW's two moments, beside ZeRO's 16Ψ/N bytes (4 a parameter, 4 a
gradient, 8 for the moments, over N ranks). On one warm-up step, every ``nn.Module``
inside the blocks samples, as its forward begins and as its gradient arrives in backward,
the bytes of whole parameters alive at that moment: the distinct storages behind the
blocks' unsharded parameters (FSDP2's are plain tensors while unsharded, DTensors
otherwise; the course's are views of a vector freed between uses) and behind every
all-gather's output still referenced (FSDP2 gathers into a flat buffer and copies out of
it, and keeps that buffer a while; the course gathers into the parameters' own vector).
The largest sample is the peak of unsharded parameter bytes. Activations, the same
model's on all three, are not counted.

The lab's goals: the course's step at most ``GOAL``× FSDP2's, and its memory at most
``GOAL``× FSDP2's a rank (the state held after a step plus the peak of whole parameters).
The report says whether each holds, with the figures; as for every benchmark, the exit
status does not depend on them. The entry point has the signature of every benchmark on
ranks (``cpu_ranks`` starts the ranks and gates and writes the record):

    def main(*, json_path: str | None, baseline: str | None, tolerance: float) -> int

``run`` and ``record`` are for Python (tests call them on tiny models).
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ..device import cpu_name
from . import cpu_ranks

NAME = "fsdp"
WORLD = 4
STEPS, WARMUP = 15, 2  # timed steps after warm-up steps; the peak is sampled on the last warm-up
LR = 1e-3
GOAL = 1.1  # course / FSDP2, for the step time and for the memory
# Two fp32 runs of the same model that sum each gradient over the ranks in a different
# order differ by roundings, which AdamW's few steps keep around 1e-7; a wrong shard is off
# from the first step.
RELATIVE = 1e-5
RUN_LIMIT_S = 1800.0
FSDP2 = "FSDP2 fully_shard"
COURSE = "rooflab shard_layers"
PREFETCH = "rooflab shard_layers(prefetch)"


@dataclass(frozen=True)
class Setup:
    """The model and each rank's batch: ``batch`` sequences of ``length`` tokens."""

    dim: int = 256
    heads: int = 4
    layers: int = 4
    batch: int = 2
    length: int = 64

    def parameters(self) -> int:
        """Ψ: every parameter lives in a block (12·dim² + 13·dim each)."""
        return self.layers * (12 * self.dim ** 2 + 13 * self.dim)

    def label(self, world: int) -> str:
        return (f"dim {self.dim}, {self.layers} blocks, {world}×{self.batch}×{self.length} "
                "tokens")


@dataclass
class Row:
    """One way of sharding. ``shape``, ``dtype``, ``kernel``, ``library`` and
    ``ratio_to_baseline`` are what the gate (``gate.py``) reads."""

    bench: str
    shape: str
    dtype: str
    kernel: str
    median_us: float  # a step: forward, backward, optimizer step; its slowest rank's time
    ratio_to_baseline: float  # t(FSDP2) / t(this): > 1 is faster, the gate's ratio
    library: bool
    memory: dict[str, int]  # bytes a rank holds after a step, by kind (largest over ranks)
    peak_unsharded_bytes: int  # whole parameters alive at once, largest sample of any rank
    time_vs_fsdp2: float = 1.0  # t(this) / t(FSDP2): the goal's ratio, ≤ GOAL
    memory_vs_fsdp2: float = 1.0  # (held + peak unsharded), this / FSDP2's: ≤ GOAL
    runs_us: list[float] = field(default_factory=list)  # every timed step, slowest rank
    losses: list[float] = field(default_factory=list)  # every step's, mean over ranks

    @property
    def held(self) -> int:
        return sum(self.memory.values())


@dataclass
class Report:
    world: int
    setup: Setup
    steps: int
    warmup: int
    rows: list[Row]
    largest_loss_difference: float  # relative, course runs against FSDP2, any step
    seconds: float

    def formula(self) -> dict[str, float]:
        """ZeRO-3's bytes a rank for fp32 AdamW, Ψ parameters over N ranks."""
        share = self.setup.parameters() / self.world
        return {"parameters": 4 * share, "gradients": 4 * share, "optimizer": 8 * share,
                "total": 16 * share}

    def goal(self) -> dict:
        judged = {}
        for row in self.rows:
            if not row.library:
                judged[row.kernel] = {
                    "time_vs_fsdp2": row.time_vs_fsdp2, "time_held": row.time_vs_fsdp2 <= GOAL,
                    "memory_vs_fsdp2": row.memory_vs_fsdp2,
                    "memory_held": row.memory_vs_fsdp2 <= GOAL}
        return {"at_most": GOAL, "of": FSDP2, "runs": judged}


# --- on each rank ------------------------------------------------------------------------

class PeakProbe:
    """While entered: the largest number of bytes of whole parameters alive at once in
    ``blocks``, sampled as each module inside them starts its forward and as its output's
    gradient arrives in backward. Whole: a parameter that is no DTensor, and any
    all-gather's output still referenced; distinct storages, a freed one as nothing."""

    GATHERS = ("all_gather_into_tensor", "all_gather_single")

    def __init__(self, blocks: nn.ModuleList):
        self.blocks = blocks
        self.peak = 0
        self.outputs: list[weakref.ref] = []
        self.handles: list = []
        self.originals: dict[str, Callable] = {}

    def sample(self, *_) -> None:
        from torch.distributed.tensor import DTensor

        from rooflab.kernels.fsdp import bytes_held

        whole = [p for p in self.blocks.parameters() if not isinstance(p, DTensor)]
        gathered = [output() for output in self.outputs]
        self.peak = max(self.peak, bytes_held(whole + gathered))

    def _after_forward(self, module, args, output) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(self.sample)

    def _recording(self, gather: Callable) -> Callable:
        def recorded(output, *args, **kwargs):
            self.outputs.append(weakref.ref(output))
            return gather(output, *args, **kwargs)
        return recorded

    def __enter__(self) -> PeakProbe:
        for name in self.GATHERS:  # both torch and the course look them up in dist
            self.originals[name] = getattr(dist, name)
            setattr(dist, name, self._recording(self.originals[name]))
        for module in self.blocks.modules():
            if not list(module.children()):  # the layers that compute: norms, linears
                self.handles.append(module.register_forward_pre_hook(self.sample))
                self.handles.append(module.register_forward_hook(self._after_forward))
        return self

    def __exit__(self, *_) -> None:
        for name, gather in self.originals.items():
            setattr(dist, name, gather)
        for handle in self.handles:
            handle.remove()


def _model(setup: Setup) -> nn.Module:
    """The same initial weights on every rank and for every way of sharding."""
    from rooflab.kernels.fsdp import TinyTransformer

    torch.manual_seed(1234)
    return TinyTransformer(setup.dim, setup.heads, setup.layers)


def _trainers(setup: Setup, world: int, shard: Callable) -> dict[str, tuple]:
    """(model, the parameters the optimizer steps, AdamW) for each way of sharding."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    library = _model(setup)
    for block in library.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(library, mesh=mesh)
    trainers = {FSDP2: (library, list(library.parameters()))}
    for name, prefetch in ((COURSE, False), (PREFETCH, True)):
        model = _model(setup)
        trainers[name] = (model, list(shard(model, prefetch=prefetch)))
    return {name: (model, params, torch.optim.AdamW(params, lr=LR))
            for name, (model, params) in trainers.items()}


def _work(rank: int, world: int, setup: Setup, steps: int, warmup: int, seed: int,
          shard: Callable | None) -> dict:
    """One rank's whole run (``cpu_ranks.run`` has joined the group): build the three,
    train them in turn step by step. Its times, losses, memory and peak."""
    # Once a rank each, they would bury the table: the course's all-gather and
    # reduce-scatter by their older names, and its backward pre-hooks on blocks whose
    # input needs no gradient (the first block's).
    warnings.filterwarnings("ignore", message=".*is deprecated. Please use")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    if shard is None:
        from rooflab.kernels.fsdp import shard_layers as shard
    from rooflab.kernels.fsdp import loss_fn, memory_held

    trainers = _trainers(setup, world, shard)
    names = list(trainers)
    generator = torch.Generator().manual_seed(seed)
    times = {name: [] for name in names}
    losses = {name: [] for name in names}
    memory, peak = {}, {}
    mine = slice(rank * setup.batch, (rank + 1) * setup.batch)
    for step in range(warmup + steps):
        size = (world * setup.batch, setup.length, setup.dim)
        x, y = (torch.randn(size, generator=generator)[mine] for _ in range(2))
        for name in names[step % 3:] + names[:step % 3]:
            model, params, optimizer = trainers[name]
            probe = PeakProbe(model.blocks) if step == warmup - 1 else None
            if probe:
                probe.__enter__()
            dist.barrier()  # every rank starts together
            start = time.perf_counter()
            loss = loss_fn(model, x, y)
            loss.backward()
            optimizer.step()
            elapsed = time.perf_counter() - start
            if probe:
                probe.__exit__()
                peak[name] = probe.peak
            if step >= warmup:
                times[name].append(elapsed)
            losses[name].append(loss.item())
            if step == warmup + steps - 1:
                memory[name] = memory_held(params, optimizer)
            optimizer.zero_grad()  # set_to_none by default: the gradients are freed
    return {"times": times, "losses": losses, "memory": memory, "peak": peak}


# --- on this side ------------------------------------------------------------------------

def run(world: int = WORLD, setup: Setup = Setup(), steps: int = STEPS,  # noqa: B008
        warmup: int = WARMUP, seed: int = 0, limit: float = RUN_LIMIT_S,
        shard: Callable[..., list[nn.Parameter]] | None = None) -> Report:
    """Start ``world`` gloo ranks, train the model ``steps + warmup`` steps three ways, and
    gather the medians, the memory and the losses. ``shard``: the sharding to time beside
    FSDP2, called as ``shard(model, prefetch=...)`` (default the course's
    ``shard_layers``). Raises RuntimeError if a rank fails, the run takes over ``limit``
    seconds, or a course run's loss differs from FSDP2's by more than ``RELATIVE``."""
    if warmup < 1:
        raise ValueError("the peak is sampled on a warm-up step: warmup must be 1 or more")
    started = time.monotonic()
    gathered = cpu_ranks.run(_work, world, (setup, steps, warmup, seed, shard), limit,
                               "the sharding")
    return _report(gathered, world, setup, steps, warmup, time.monotonic() - started)


def _report(gathered: dict[int, dict], world: int, setup: Setup, steps: int, warmup: int,
            seconds: float) -> Report:
    ranks = list(gathered.values())
    rows = []
    for name in (FSDP2, COURSE, PREFETCH):
        runs = [max(found["times"][name][i] for found in ranks) for i in range(steps)]
        losses = [statistics.fmean(found["losses"][name][i] for found in ranks)
                  for i in range(warmup + steps)]
        memory = {kind: max(found["memory"][name][kind] for found in ranks)
                  for kind in ranks[0]["memory"][name]}
        rows.append(Row(NAME, setup.label(world), "float32", name,
                        statistics.median(runs) * 1e6, 1.0, name == FSDP2, memory,
                        max(found["peak"][name] for found in ranks),
                        runs_us=[t * 1e6 for t in runs], losses=losses))
    library = rows[0]
    largest = 0.0
    for row in rows[1:]:
        row.ratio_to_baseline = library.median_us / row.median_us
        row.time_vs_fsdp2 = row.median_us / library.median_us
        row.memory_vs_fsdp2 = (row.held + row.peak_unsharded_bytes) / \
            (library.held + library.peak_unsharded_bytes)
        for step, (ours, theirs) in enumerate(zip(row.losses, library.losses, strict=True)):
            difference = abs(ours - theirs) / abs(theirs)
            if not difference <= RELATIVE:  # NaN too
                raise RuntimeError(
                    f"{row.kernel}'s loss differs from FSDP2's at step {step + 1}: "
                    f"{ours:.8g} against {theirs:.8g}, {difference:.2g} relative (allowed "
                    f"{RELATIVE:g}): the sharding does not train the same model")
            largest = max(largest, difference)
    return Report(world, setup, steps, warmup, rows, largest, seconds)


def table(report: Report) -> str:
    mib = 1 << 20
    setup, formula = report.setup, report.formula()
    lines = [f"{report.world} gloo ranks on {cpu_name()} ({os.cpu_count()} cores), fp32 "
             f"AdamW, 1 thread a rank; TinyTransformer {setup.label(report.world)}, "
             f"Ψ = {setup.parameters():,} parameters; median of {report.steps} steps after "
             f"{report.warmup} warm-up, each step's time its slowest rank's",
             f"{'':<32}{'step ms':>9}{'×FSDP2':>8}   MiB a rank: {'params':>7}{'grads':>7}"
             f"{'Adam':>7}{'held':>7}{'peak whole':>12}{'×FSDP2':>8}"]
    for row in report.rows:
        m = row.memory
        lines.append(f"{row.kernel:<32}{row.median_us / 1e3:>9.1f}{row.time_vs_fsdp2:>7.2f}×"
                     f"{'':<15}{m['parameters'] / mib:>7.2f}{m['gradients'] / mib:>7.2f}"
                     f"{m['optimizer'] / mib:>7.2f}{row.held / mib:>7.2f}"
                     f"{row.peak_unsharded_bytes / mib:>12.2f}{row.memory_vs_fsdp2:>7.2f}×")
    lines.append(f"{'ZeRO-3 formula, 16Ψ/N':<32}{'':<32}{formula['parameters'] / mib:>7.2f}"
                 f"{formula['gradients'] / mib:>7.2f}{formula['optimizer'] / mib:>7.2f}"
                 f"{formula['total'] / mib:>7.2f}")
    block = report.setup.parameters() / report.setup.layers * 4
    lines.append(f"peak whole: the most bytes of unsharded parameters alive at once in forward "
                 f"or backward (one block: {block / mib:.2f} MiB); ×FSDP2 of memory compares "
                 "held + peak whole")
    for name, judged in report.goal()["runs"].items():
        lines.append(f"goal, {name} ≤ {GOAL:g}× FSDP2: step time "
                     f"{'met' if judged['time_held'] else 'NOT MET'} "
                     f"({judged['time_vs_fsdp2']:.2f}×), memory "
                     f"{'met' if judged['memory_held'] else 'NOT MET'} "
                     f"({judged['memory_vs_fsdp2']:.2f}×)")
    lines.append(f"every step's loss checked against FSDP2's: largest relative difference "
                 f"{report.largest_loss_difference:.2g} (allowed {RELATIVE:g})")
    return "\n".join(lines)


def record(report: Report) -> dict:
    """The evidence: the machine, the versions, the model, the method, every row, the
    formula, the loss check, the goals."""
    return {
        **cpu_ranks.machine(NAME, report.world),
        "model": {**asdict(report.setup), "parameters": report.setup.parameters()},
        "method": (f"fp32, AdamW lr {LR:g}, 1 torch thread a rank; FSDP2 = fully_shard on "
                   "each block then the root; the three take turns step by step in a "
                   f"rotating order, each step after a barrier; {report.warmup} warm-up and "
                   f"{report.steps} timed steps (forward, backward, optimizer step), a step's "
                   "time its slowest rank's; medians. Memory: memory_held after the last "
                   "step, largest over ranks. Peak whole: on the last warm-up step, the "
                   "distinct storages of non-DTensor block parameters and live all-gather "
                   "outputs, sampled at every module's forward and output gradient"),
        "rows": [asdict(row) for row in report.rows],
        "formula": report.formula(),
        "checked": {"against": f"{FSDP2}'s loss, every step", "relative": RELATIVE,
                    "largest_difference": report.largest_loss_difference},
        "goal": report.goal(),
        "seconds": report.seconds,
    }


def main(*, json_path: str | None = None, baseline: str | None = None,
         tolerance: float = 0.05) -> int:
    """``rooflab bench fsdp``: check the baseline, run, print the table, gate, write the
    record."""
    against = cpu_ranks.against(NAME, baseline, tolerance)  # before any rank starts
    report = run()
    return cpu_ranks.finish(
        NAME, report.rows, table(report),
        lambda row: run(report.world, report.setup, report.steps, report.warmup,
                            seed=1).rows,
        lambda: record(report), json_path=json_path, against=against)
