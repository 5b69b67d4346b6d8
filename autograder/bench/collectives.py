"""``rooflab bench allreduce``: the course's ring all-reduce against ``dist.all_reduce``,
on gloo ranks on this machine's CPU.

Four ranks (processes joined in a gloo group) all-reduce fp32 tensors of 1 to 64 MiB a
rank. At each size, both collectives run on the same fresh random tensor in every run,
one after the other (which goes first alternates), each after a barrier; a run's time is
its slowest rank's, since a collective is done when its last rank is. The first run is a
warm-up; the median of the others is reported, with the algorithm bandwidth algbw = S/t,
the bus bandwidth busbw = algbw·2(N − 1)/N (nccl-tests' definition: the bytes each rank's
links carry per second) and the speed of the ring relative to the library,
t(dist.all_reduce) / t(ring). Every ring answer, warm-up included, is compared with
``dist.all_reduce``'s on the same input: a wrong ring stops the benchmark.

The lab's goal is a ring at least as fast as ``dist.all_reduce`` from 16 MiB up; the
report says whether it holds, with the measured ratios, and the exit status does not
depend on it (as for the GPU benches, a speed target is evidence, not a test). gloo's
all-reduce is no ring of point-to-point calls: it is one call into C++ that pipelines its
reductions with its transfers, which a ring of ``isend``/``irecv`` in Python cannot do.

The ranks are started, and the report gated and written, by ``cpu_ranks``.

Use ``python -m rooflab.autograder.cli bench allreduce``, or ``run`` and ``record`` from
Python (tests call them on tiny sizes).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from ..device import cpu_name
from . import cpu_ranks

NAME = "allreduce"
WORLD = 4
MIB = 1 << 20
SIZES = [MIB << k for k in range(7)]  # bytes a rank: 1 MiB to 64 MiB
REPS = 11  # timed runs a size, after WARMUP untimed ones: a shared CPU is noisy
WARMUP = 1
GOAL_FROM, GOAL = 16 * MIB, 1.0  # the ring at least as fast as the library from 16 MiB up
LIBRARY, RING = "dist.all_reduce (gloo)", "rooflab ring_allreduce"
# Two fp32 sums of N normal values in different orders differ by a few roundings of the
# largest partial sum: far below this, and a ring that drops or doubles a chunk far above.
ATOL = 1e-4
RUN_LIMIT_S = 1200.0  # for the whole run, beyond which the ranks are killed


@dataclass
class Row:
    """One collective at one size. ``shape``, ``dtype``, ``kernel``, ``library`` and
    ``ratio_to_baseline`` are what the gate (``gate.py``) reads."""

    bench: str
    shape: str  # "16 MiB": bytes a rank
    dtype: str
    kernel: str
    bytes: int
    median_us: float
    algbw_gbs: float  # S / t
    busbw_gbs: float  # algbw · 2(N − 1)/N
    ratio_to_baseline: float  # t(dist.all_reduce) / t(this): > 1 is faster
    library: bool
    runs_us: list[float] = field(default_factory=list)  # every timed run, slowest rank


@dataclass
class Report:
    world: int
    reps: int
    warmup: int
    rows: list[Row]
    checked_runs: int  # ring answers compared with dist.all_reduce's
    largest_difference: float  # the largest |ring − dist.all_reduce| over all of them
    seconds: float  # wall time of the whole run

    def ratios(self) -> dict[int, float]:
        """The ring's speed relative to the library, by size in bytes."""
        return {row.bytes: row.ratio_to_baseline for row in self.rows if not row.library}

    def goal(self) -> dict:
        judged = {size: ratio for size, ratio in self.ratios().items() if size >= GOAL_FROM}
        return {"from_bytes": GOAL_FROM, "at_least": GOAL,
                "held": bool(judged) and min(judged.values()) >= GOAL,
                "ratios": {_label(size): ratio for size, ratio in judged.items()}}


# --- on each rank ------------------------------------------------------------------------

def _library(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def _work(rank: int, world: int, sizes: list[int], reps: int, warmup: int, seed: int,
          ring: Callable | None) -> tuple[dict, list[float]]:
    """One rank's whole run (``cpu_ranks.run`` has joined the group): at each size time
    both collectives on the same fresh input, run after run, and check the ring's
    answer. The times, and the ring's largest difference from the library's, each run."""
    if ring is None:
        from rooflab.kernels.collectives import ring_allreduce as ring
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    times: dict[int, dict[str, list[float]]] = {}
    differences = []
    for size in sizes:
        times[size] = {LIBRARY: [], RING: []}
        for run in range(warmup + reps):
            x = torch.randn(size // 4, generator=generator)  # fresh for every run
            order = [(LIBRARY, _library), (RING, ring)]
            answers = {}
            for name, collective in order[::-1] if run % 2 else order:
                data = x.clone()
                dist.barrier()  # every rank starts together
                start = time.perf_counter()
                answers[name] = collective(data)
                elapsed = time.perf_counter() - start
                if run >= warmup:
                    times[size][name].append(elapsed)
            difference = float((answers[RING] - answers[LIBRARY]).abs().max())
            if not difference <= ATOL:  # NaN too
                raise AssertionError(
                    f"rank {rank}: ring_allreduce differs from dist.all_reduce at "
                    f"{_label(size)} by up to {difference:.3g} (allowed {ATOL:g})")
            differences.append(difference)
    return times, differences


# --- on this side ------------------------------------------------------------------------

def run(world: int = WORLD, sizes: Sequence[int] = SIZES, reps: int = REPS,
        warmup: int = WARMUP, seed: int = 0, limit: float = RUN_LIMIT_S,
        ring: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Report:
    """Start ``world`` gloo ranks, time both collectives at every size (bytes a rank,
    multiples of 4), and gather the medians. ``ring``: the all-reduce to time (default
    the course's ``ring_allreduce``; a module-level function). Raises RuntimeError if a
    rank fails (a wrong ring answer among the causes) or the run takes over ``limit``
    seconds."""
    started = time.monotonic()
    gathered = cpu_ranks.run(_work, world, (list(sizes), reps, warmup, seed, ring), limit,
                               "ring_allreduce")
    return _report(gathered, world, list(sizes), reps, warmup, time.monotonic() - started)


def _report(gathered: dict, world: int, sizes: list[int], reps: int, warmup: int,
            seconds: float) -> Report:
    rows = []
    differences = [d for _, diffs in gathered.values() for d in diffs]
    for size in sizes:
        medians, runs = {}, {}
        for name in (LIBRARY, RING):
            # A run ends when its slowest rank does.
            runs[name] = [max(gathered[r][0][size][name][i] for r in gathered)
                          for i in range(reps)]
            medians[name] = statistics.median(runs[name])
        for name in (LIBRARY, RING):
            algbw = size / medians[name]
            rows.append(Row(NAME, _label(size), "float32", name, size, medians[name] * 1e6,
                            algbw / 1e9, algbw * 2 * (world - 1) / world / 1e9,
                            medians[LIBRARY] / medians[name], name == LIBRARY,
                            [t * 1e6 for t in runs[name]]))
    return Report(world, reps, warmup, rows, len(differences), max(differences, default=0.0),
                  seconds)


def _label(size: int) -> str:
    return f"{size / MIB:g} MiB" if size >= MIB else f"{size / 1024:g} KiB"


def table(report: Report) -> str:
    lines = [f"{report.world} gloo ranks on {cpu_name()} ({os.cpu_count()} cores), fp32, "
             f"1 thread a rank; median of {report.reps} runs after {report.warmup} warm-up, "
             "each run's time its slowest rank's",
             f"{'size':<10}{'collective':<26}{'median ms':>10}{'algbw GB/s':>12}"
             f"{'busbw GB/s':>12}{'vs library':>12}"]
    for row in report.rows:
        lines.append(f"{row.shape if row.library else '':<10}{row.kernel:<26}"
                     f"{row.median_us / 1e3:>10.2f}{row.algbw_gbs:>12.3f}{row.busbw_gbs:>12.3f}"
                     f"{row.ratio_to_baseline:>11.2f}×")
    goal = report.goal()
    if goal["ratios"]:
        ratios = ", ".join(f"{ratio:.2f}× at {size}" for size, ratio in goal["ratios"].items())
        lines.append(f"goal, ring ≥ {GOAL:g}× dist.all_reduce from {_label(GOAL_FROM)} up: "
                     f"{'met' if goal['held'] else 'NOT MET'} ({ratios})")
    lines.append(f"every ring answer checked against dist.all_reduce's on the same input: "
                 f"{report.checked_runs} (ranks × runs), largest difference "
                 f"{report.largest_difference:.2g}")
    return "\n".join(lines)


def record(report: Report) -> dict:
    """The evidence: the machine, the date, the versions, the method, every row, the
    check, the goal."""
    return {
        **cpu_ranks.machine(NAME, report.world),
        "method": (f"fp32, 1 torch thread a rank; at each size {report.warmup} warm-up and "
                   f"{report.reps} timed runs, each on a fresh torch.randn tensor, ring and "
                   "dist.all_reduce in alternating order after a barrier; a run's time is "
                   "its slowest rank's; medians. algbw = S/t, busbw = algbw·2(N − 1)/N "
                   "(nccl-tests); ratio = t(dist.all_reduce)/t(this)"),
        "rows": [asdict(row) for row in report.rows],
        "checked": {"against": "dist.all_reduce on the same input", "runs": report.checked_runs,
                    "largest_difference": report.largest_difference, "allowed": ATOL},
        "goal": report.goal(),
        "seconds": report.seconds,
    }


def main(*, json_path: str | None = None, baseline: str | None = None,
         tolerance: float = 0.05) -> int:
    """``rooflab bench allreduce``: check the baseline, run, print the table, gate, write
    the record."""
    against = cpu_ranks.against(NAME, baseline, tolerance)  # before any rank starts
    report = run()
    return cpu_ranks.finish(
        NAME, report.rows, table(report),
        lambda row: run(report.world, [row.bytes], report.reps, report.warmup, seed=1).rows,
        lambda: record(report), json_path=json_path, against=against)
