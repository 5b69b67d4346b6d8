"""What a benchmark times: a workload (a shape, its inputs, the kernels that compute it,
the first the library's baseline), and the row each kernel's timing becomes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..problem import Cost


@dataclass
class Row:
    bench: str
    shape: str
    dtype: str
    kernel: str
    median_us: float
    throughput: float  # TFLOP/s, or GB/s for kernels without FLOPs
    unit: str
    roofline_fraction: float
    bound: str
    ratio_to_baseline: float | None = None  # baseline time / this time (>1: faster)
    # The same ratio against every library kernel of the workload, by name.
    ratios: dict[str, float] = field(default_factory=dict)
    method: str = ""  # how it was timed: "do_bench" or "cuda graph"
    library: bool = False  # one of the library's kernels (the baseline or its alternatives)
    # A ceiling this row raised, or why its fraction is above 100% (roofline.fraction_note).
    note: str = ""


@dataclass
class Workload:
    shape: str
    dtype: torch.dtype
    cost: Cost
    make: Callable[[], tuple]
    kernels: dict[str, Callable]  # the first is the baseline
    reference: Callable
    # The kernels that are the library's (the baseline and its alternatives): every row gets
    # its speed relative to each. Default: the baseline alone.
    library: tuple[str, ...] = ()

    @property
    def baselines(self) -> tuple[str, ...]:
        return self.library or (next(iter(self.kernels)),)


class NotAvailable(RuntimeError):
    """A library kernel this torch, card or dtype does not offer: its rows are left out."""
