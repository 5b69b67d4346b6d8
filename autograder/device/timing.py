"""Honest timing on a GPU, and a clearly labelled stand-in on the CPU.

On a GPU a kernel is timed with ``triton.testing.do_bench``, which flushes L2 before each
repetition. We ask it for the *median* (its default is the mean, which one slow outlier
drags). The first call, with compilation and autotuning, happens before timing starts.
Kernels of a few microseconds are dominated by launch overhead when timed one launch at a
time, so they are re-timed by replaying a CUDA graph.

On a CPU the Triton interpreter runs kernels one program at a time in Python: its wall
time says nothing about a GPU. ``cpu_stand_in`` exists only because ``@triton.autotune``
needs *some* timer to pick a config; its numbers must never be shown as performance.
(Autotuning on a CPU ranks configurations by the traffic model's prediction instead:
``model/autotune.py``.)
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
