"""Autotuning without a GPU: rank a kernel's configurations by the predicted time.

On a GPU ``@triton.autotune`` times each configuration with ``do_bench``. In Triton's
interpreter there is no GPU to time, and the interpreter's own wall time would pick
whatever interprets fastest, which says nothing about a GPU. So here a configuration's
"time" is what the traffic model predicts for the target card: ``predicted_bench`` has
``do_bench``'s call shape, ``autotune_bench()`` is what a kernel passes as ``do_bench=``,
and ``rank_by_prediction()`` gives the same to autotuners that pass nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import device
from ..device import roofline
from . import matrix_units, traffic
from .time_model import dot_dtype
from .trace import tracing


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
    with tracing(keep_lanes=False) as tracer:
        fn()
    launches = tracer.launches
    ceilings, card = roofline.target(None)
    rules = matrix_units.rules_for(card)
    dots = [(launch, matrix_units.main_dot(launch)) for launch in launches]
    if any(dot and matrix_units.misfits(launch, dot, rules) for launch, dot in dots):
        ms = float("inf")
    else:
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
    return predicted_bench if device.interpreter_enabled() else None


def rank_by_prediction() -> None:
    """``@triton.autotune`` written as Triton's tutorials write it, with no ``do_bench=``,
    asks the GPU driver for a timer, and there is none here. In the interpreter, let such
    an autotuner rank configurations by the traffic model's prediction instead (what
    ``autotune_bench()`` gives a kernel that asks explicitly). Imports Triton: call it once
    the interpreter is on."""
    from triton.runtime.autotuner import Autotuner

    if getattr(Autotuner, "_rooflab_predicts", False):
        return
    original = Autotuner.__dict__["do_bench"]  # a property (3.6) or a cached_property (3.9)

    def do_bench(self):
        if self._do_bench is None and device.interpreter_enabled():
            return predicted_bench
        return original.__get__(self, type(self))

    Autotuner.do_bench = property(do_bench)
    Autotuner._rooflab_predicts = True
