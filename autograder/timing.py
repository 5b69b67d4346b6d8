"""Honest timing on a GPU, and a clearly labelled stand-in on the CPU.

On a GPU a kernel is timed with ``triton.testing.do_bench``, which flushes L2 before each
repetition. We ask it for the *median* (its default is the mean, which one slow outlier
drags). The first call, with compilation and autotuning, happens before timing starts.
Kernels of a few microseconds are dominated by launch overhead when timed one launch at a
time, so they are re-timed by replaying a CUDA graph.

On a CPU the Triton interpreter runs kernels one program at a time in Python: its wall
time says nothing about a GPU. ``cpu_stand_in`` exists only because ``@triton.autotune``
needs *some* timer to pick a config; its numbers must never be shown as performance.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Below this median a kernel is re-timed with a CUDA graph (launch overhead is ~5 µs).
CUDA_GRAPH_BELOW_S = 20e-6


@dataclass(frozen=True)
class Timing:
    median_s: float
    method: str  # "do_bench" or "cuda graph"

    @property
    def median_us(self) -> float:
        return self.median_s * 1e6


def time_gpu(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100) -> Timing:
    """Median time of ``fn()`` on the current CUDA device, in seconds."""
    if not torch.cuda.is_available():
        raise RuntimeError("time_gpu needs a CUDA GPU; on a CPU there is no GPU time to measure")
    import triton.testing

    fn()  # compile, autotune and allocate outside the numbers
    torch.cuda.synchronize()
    median_ms = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    if median_ms * 1e-3 >= CUDA_GRAPH_BELOW_S:
        return Timing(median_ms * 1e-3, "do_bench")
    graph_ms = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
    return Timing(graph_ms * 1e-3, "cuda graph")


def cpu_stand_in(fn: Callable[[], object], warmup: int = 1, rep: int = 3, **_: object) -> float:
    """Median wall time in ms, with ``do_bench``'s call shape, for ``@triton.autotune``'s
    ``do_bench=`` on a CPU. Interpreter time: useful for picking among configs at most."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rep):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def predicted_bench(fn: Callable[[], object], quantiles: tuple | None = None,
                    **_: object) -> float | list[float]:
    """``do_bench``'s call shape for ``@triton.autotune`` on a CPU, answering with the
    traffic model's predicted time (ms) on the target card instead of a measurement: timing
    the interpreter would pick whatever interprets fastest, which says nothing about a GPU.
    Traces ``fn()`` keeping only each access's footprint and predicts with
    ``time_model``: each launch's fixed cost, its DRAM and L2 traffic, its ``tl.dot``
    FLOPs in waves of programs over the SMs, the dependent steps of loops without
    ``tl.dot``; a config whose tile would not fit an SM (shared memory, registers) is
    infinitely slow. Beyond that fit, ``num_stages`` and ``num_warps`` only change how many
    programs an SM holds at once."""
    from . import matrix_units, roofline, traffic
    from .trace import tracing

    with tracing(keep_lanes=False) as tracer:
        fn()
    launches = tracer.launches
    ceilings, card = roofline.target(None)
    rules = matrix_units.rules_for(card)
    dots = [(launch, matrix_units.main_dot(launch)) for launch in launches]
    if any(dot and matrix_units.misfits(launch, dot, rules) for launch, dot in dots):
        ms = float("inf")
    else:
        from .time_model import dot_dtype

        flops = sum(2 * d.m * d.n * d.k for launch in launches for d in launch.dots)
        dtype = next((dot_dtype(d) for _, d in dots if d), "fp32")
        reports = [traffic.analyze(launch, card) for launch in launches]
        predicted = traffic.prediction(reports, flops, compulsory_bytes(reports, launches),
                                       dtype, ceilings, card)
        ms = predicted.seconds * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def compulsory_bytes(reports: list, launches: list) -> int:
    """The bytes the traced work must move at least: every distinct tensor argument a
    launch touched, once (a tensor passed twice counts once), except intermediates, which
    one launch writes and a later one reads back: those need not leave the chip."""
    role: dict[tuple[int, int], str] = {}  # input, output or intermediate
    extent: dict[tuple[int, int], int] = {}
    for report, launch in zip(reports, launches, strict=True):
        for tensor in launch.tensors:
            counts = report.per_tensor[tensor.name]
            read, written = counts.read_refs > 0, counts.written > 0
            if not (read or written):
                continue
            key = (tensor.base, tensor.extent)
            extent[key] = tensor.extent
            if key not in role:
                role[key] = "input" if read else "output"
            elif role[key] == "output" and read:
                role[key] = "intermediate"
    return sum(extent[key] for key, kind in role.items() if kind != "intermediate")


def autotune_bench() -> Callable | None:
    """What ``@triton.autotune(do_bench=...)`` should use here: Triton's own (None) on a
    GPU, the traffic model's prediction in the interpreter."""
    from .device import interpreter_enabled

    return predicted_bench if interpreter_enabled() else None
