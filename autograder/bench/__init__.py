"""Benchmarks: the course's kernels against the library, on a GPU, as evidence.
(``RANK_BENCHES``, at the end of the registry, run on CPU ranks instead.)

``rooflab bench matmul`` (or ``coalescing``) times each kernel with the course's timer
(median, L2 flushed) on fresh random inputs, checks its answer, and reports time,
throughput, roofline fraction against this card's measured ceilings, and the ratio to the
library baseline. ``--json`` writes the same, with card, driver and versions, for
``bench/results/``. Speed targets live here, never in unit tests.

This package's own module is the registry and the run; its modules:

* ``workload.py``: what a benchmark times, and the row each timing becomes;
* one module per lab with its workloads: ``coalescing.py``, ``matmul.py``,
  ``softmax.py``, ``attention.py``, ``topk.py``, ``sampling.py``, ``kmeans.py``,
  ``amp.py``;
* ``gate.py``: did a course kernel get slower, relative to the library, than its record?
* ``cpu_ranks.py``, with ``collectives.py`` and ``fsdp.py``: the benchmarks on gloo ranks
  on this machine's CPU.

It sits on top, beside ``grading/``: it imports the device layer, what a piece of work
costs (``problem.py``) and the course's kernels. Outside the package, only the command line
imports the registry; labs 06 and 07 import their own workloads to time them in a chart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ..device import current, roofline, versions
from ..device.timing import time_gpu
from ..problem import Cost
from .amp import amp_workloads
from .attention import attention_workloads
from .coalescing import coalescing_workloads
from .kmeans import kmeans_workloads
from .matmul import matmul_workloads
from .sampling import sampling_workloads
from .softmax import softmax_workloads
from .topk import topk_workloads
from .workload import NotAvailable, Row, Workload

BENCHES: dict[str, Callable[[str], list[Workload]]] = {
    "matmul": matmul_workloads,
    "coalescing": coalescing_workloads,
    "softmax": softmax_workloads,
    "attention": attention_workloads,
    "topk": topk_workloads,
    "sampling": sampling_workloads,
    "kmeans": kmeans_workloads,
    "amp": amp_workloads,
}

# Benchmarks on ranks of a gloo group on this machine's CPU, which time no GPU kernel:
# name -> "module:function", imported only when run. Each function has the signature in
# cpu_ranks' docstring: main(*, json_path, baseline, tolerance) -> exit status.
RANK_BENCHES: dict[str, str] = {
    "allreduce": "rooflab.autograder.bench.collectives:main",
    "fsdp": "rooflab.autograder.bench.fsdp:main",
}


def rank_bench(name: str) -> Callable[..., int]:
    """The ``main`` of a benchmark in ``RANK_BENCHES``."""
    import importlib

    module, function = RANK_BENCHES[name].split(":")
    return getattr(importlib.import_module(module), function)


def _check(label: str, load: Workload, inputs: tuple, when: str) -> None:
    expected = load.reference(*inputs).float()
    got = load.kernels[label](*inputs).float()
    error = float((got - expected).norm() / expected.norm().clamp_min(1e-30))
    if error > 2e-2:
        raise AssertionError(f"{label} is wrong {when} at {load.shape}: rel error {error:.2e}")


def _measure(name: str, label: str, load: Workload, inputs: tuple,
             floor: roofline.Floor) -> Row:
    """Check, time (median, L2 flushed), check again on the timed inputs."""
    _check(label, load, inputs, "before timing")
    kernel = load.kernels[label]
    timing = time_gpu(lambda: kernel(*inputs))
    seconds = timing.median_s
    _check(label, load, inputs, "after timing")
    throughput, unit = _throughput(load.cost, seconds, floor)
    return Row(name, load.shape, str(load.dtype).removeprefix("torch."), label,
               seconds * 1e6, throughput, unit, floor.seconds / seconds, floor.bound,
               method=timing.method)


def _throughput(cost: Cost, seconds: float, floor: roofline.Floor) -> tuple[float, str]:
    """TFLOP/s for a compute-bound workload, GB/s for a memory-bound one."""
    if floor.bound == "compute":
        return cost.flops / seconds / 1e12, "TFLOP/s"
    return cost.bytes / seconds / 1e9, "GB/s"


@dataclass
class _Timed:
    """A row with what it needs to be placed on the roofline again once ceilings move."""

    row: Row
    cost: Cost
    raised: list[roofline.Raise]


def _settle(timed: list[_Timed], ceilings: roofline.Ceilings, l2_bytes: int) -> None:
    """Place every row against the ceilings as they are after the whole run: a row that
    raised a ceiling lowers the fraction of every other row on it, earlier rows included."""
    for entry in timed:
        row, seconds = entry.row, entry.row.median_us * 1e-6
        floor = roofline.time_floor(entry.cost, ceilings)
        row.roofline_fraction, row.bound = floor.seconds / seconds, floor.bound
        row.throughput, row.unit = _throughput(entry.cost, seconds, floor)
        notes = [roofline.borrowed(ceilings, entry.cost.dtype) if floor.bound == "compute"
                 else "",
                 roofline.fraction_note(row.roofline_fraction, entry.cost, seconds, ceilings,
                                        raised=entry.raised, l2_bytes=l2_bytes,
                                        method=row.method)]
        row.note = "; ".join(note for note in notes if note)


def run(name: str) -> list[Row]:
    """Run one benchmark on this GPU. Raises RuntimeError without a GPU."""
    device = current()
    if not device.can_measure:
        raise RuntimeError("benchmarks need a GPU: on a CPU there is no time worth reporting")
    ceilings = roofline.ceilings()
    timed: list[_Timed] = []
    for load in BENCHES[name](device.torch_device):
        inputs = load.make()  # fresh random inputs for every workload, never zeros
        floor = roofline.time_floor(load.cost, ceilings)
        measured = {}
        for label in load.kernels:
            try:
                measured[label] = _measure(name, label, load, inputs, floor)
            except NotAvailable as missing:
                print(f"{load.shape}: {label} left out: {missing}")
            except RuntimeError as error:  # e.g. "No available kernel" for this card/dtype
                if label not in load.baselines or "available" not in str(error):
                    raise
                print(f"{load.shape}: {label} left out: {str(error).splitlines()[0]}")
        first = measured.get(next(iter(load.kernels)))
        for label, row in measured.items():
            row.library = label in load.baselines
            if first is not None:
                row.ratio_to_baseline = first.median_us / row.median_us
            row.ratios = {base: measured[base].median_us / row.median_us
                          for base in load.baselines if base in measured}
            # Every row was checked before and after timing: its rate is real, and one
            # beyond a ceiling raises it (the library's rows above all).
            raised = roofline.observe(load.cost, row.median_us * 1e-6,
                                      f"{row.kernel} at {load.shape} {row.dtype}", ceilings,
                                      device)
            timed.append(_Timed(row, load.cost, raised))
        del inputs
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    _settle(timed, ceilings, device.l2_bytes)
    return [entry.row for entry in timed]


def remeasure(name: str, row: Row) -> Row | None:
    """``row``'s kernel timed again beside its workload's baseline, on fresh inputs: the
    same row, with a fresh ratio to the library (None if the workload is gone)."""
    device = current()
    load = next((load for load in BENCHES[name](device.torch_device)
                 if load.shape == row.shape and str(load.dtype).endswith(row.dtype)), None)
    if load is None or row.kernel not in load.kernels:
        return None
    inputs = load.make()
    floor = roofline.time_floor(load.cost, roofline.ceilings())
    base = _measure(name, next(iter(load.kernels)), load, inputs, floor)
    again = _measure(name, row.kernel, load, inputs, floor)
    again.ratio_to_baseline = base.median_us / again.median_us
    return again


def table(rows: list[Row]) -> str:
    """The rows as text; a row with a note gets a mark after its fraction, and the notes
    follow the table."""
    lines = [f"{'shape':<18}{'dtype':<10}{'kernel':<36}{'median µs':>11}{'throughput':>16}"
             f"{'roofline':>10}{'':<5}{'vs base':>8}"]
    notes = []
    for r in rows:
        if r.note:
            notes.append(f"[{len(notes) + 1}] {r.kernel} at {r.shape} {r.dtype}: {r.note}")
        mark = f" [{len(notes)}]" if r.note else ""
        lines.append(f"{r.shape:<18}{r.dtype:<10}{r.kernel:<36}{r.median_us:>11.1f}"
                     f"{r.throughput:>9.1f} {r.unit:<7}{r.roofline_fraction:>9.0%}{mark:<5}"
                     + (f"{r.ratio_to_baseline:>7.2f}×" if r.ratio_to_baseline else f"{'-':>8}"))
    return "\n".join(lines + notes)


def record(rows: list[Row]) -> dict:
    """Everything needed to trust the numbers later: card, driver, versions, ceilings."""
    dev = current()
    return {
        "card": dev.name,
        "driver": dev.driver,
        "versions": versions.installed(),
        "ceilings": asdict(roofline.ceilings()),
        "rows": [asdict(r) for r in rows],
    }
