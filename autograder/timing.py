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
    Counts the FLOPs of every ``tl.dot`` in waves of programs over the SMs, the DRAM and L2
    traffic of every access, and makes a config whose tile would not fit an SM (shared
    memory, registers) infinitely slow. Warps and stages beyond that fit are not modelled."""
    from . import matrix_units, roofline, traffic
    from .trace import tracing

    with tracing() as tracer:
        fn()
    launches = tracer.launches
    ceilings, card = roofline.target(None)
    rules = matrix_units.rules_for(card)
    dots = [(launch, matrix_units.main_dot(launch)) for launch in launches]
    if any(dot and matrix_units.misfits(launch, dot, rules) for launch, dot in dots):
        ms = float("inf")
    else:
        flops = sum(2 * d.m * d.n * d.k for launch in launches for d in launch.dots)
        operand = next((d.operand for _, d in dots if d), "fp32")
        compute = operand if operand in ("fp16", "bf16") else "tf32"
        compulsory = sum(t.extent for launch in launches for t in launch.tensors)
        predicted = traffic.predict(launches, flops, compulsory, compute, ceilings, card)
        # A program runs on one SM: with fewer programs than SMs, or a last partial wave,
        # part of the chip idles. This is what makes small tiles win on small problems.
        programs = sum(launch.programs for launch in launches)
        sms = card.sm_count or 1
        waves = -(-programs // sms)
        per_program = flops / programs / (ceilings.peak_flops(compute) / sms)
        ms = max(predicted.seconds, waves * per_program) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def autotune_bench() -> Callable | None:
    """What ``@triton.autotune(do_bench=...)`` should use here: Triton's own (None) on a
    GPU, the traffic model's prediction in the interpreter."""
    from .device import interpreter_enabled

    return predicted_bench if interpreter_enabled() else None
