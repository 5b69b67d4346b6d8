"""What a trace holds: one kernel launch, its tensor arguments, and each memory access
and ``tl.dot`` its programs made. ``trace.py`` fills them; the rest of the model reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Access:
    kind: str  # "load", "store" or "atomic"
    program: int  # linear program id, x fastest (the order programs are launched in)
    addresses: np.ndarray  # uint64, the block's shape
    active: np.ndarray  # bool, same shape: lanes the mask let through
    element_size: int


@dataclass
class TensorArg:
    name: str
    base: int  # address of element 0 of the view
    extent: int  # bytes from base to one past the view's last element
    element_size: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def contains(self, addresses: np.ndarray) -> np.ndarray:
        return (addresses >= self.base) & (addresses < self.base + self.extent)


@dataclass(frozen=True)
class Dot:
    """One ``tl.dot`` a program ran: (m × k) @ (k × n), its operand and accumulator types
    (Triton's names: "fp16", "bf16", "fp32"), the precision asked for fp32 operands, and
    whether an operand was one value repeated, zeros say (a dot for show: it multiplies
    nothing that came from the inputs)."""

    m: int
    n: int
    k: int
    operand: str
    accumulator: str
    input_precision: str
    constant_operand: bool = False


@dataclass
class Launch:
    """One kernel launch: its grid, its tensor arguments, and every access it made."""

    kernel: str
    grid: tuple[int, int, int]
    tensors: list[TensorArg]
    accesses: list[Access] = field(default_factory=list)
    dots: list[Dot] = field(default_factory=list)
    # Lanes of sorting networks' compare-and-swaps (trace.py says which it counts).
    compare_lanes: int = 0
    # While tracing: the latest tl.split outputs, by the id of their first half.
    split_halves: dict = field(default_factory=dict, repr=False)
    # Integer launch arguments by name: sizes, strides, BLOCK_*, num_warps, num_stages.
    options: dict[str, int] = field(default_factory=dict)
    # Each access reduced to what the traffic model needs (footprint.Footprint), in the order
    # made: filled as they happen when the lanes are not kept, else on first analysis.
    footprints: list = field(default_factory=list)
    # For the race check, each store and atomic in the order made: (program, the addresses
    # it wrote inside the tensor arguments, the bits stored at each as uint64, or None for
    # an atomic, whose value depends on what was there).
    writes: list[tuple[int, np.ndarray, np.ndarray | None]] = field(default_factory=list)

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]
