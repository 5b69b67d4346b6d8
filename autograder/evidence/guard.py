"""Guard bands: poisoned memory on both sides of every tensor a kernel touches.

A store without a mask writes past the end of its tensor. On a CPU the interpreter
writes to whatever host memory lies there, which can corrupt the allocator and kill the
Python process (and with it a Jupyter kernel) with no message; on a GPU it corrupts a
neighbour silently. So during a check, inputs and fresh allocations live inside a larger
buffer whose margins hold poison. A margin that changed means an out-of-bounds write; an
out-of-bounds read returns poison, a NaN, which the comparison then catches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import poison

# Wide enough for a whole unmasked block past the end (1024 fp32 lanes, a 128-row tile),
# and a multiple of 512 so views keep the alignment Triton specialises on.
MARGIN_BYTES = 64 * 1024


def _extent(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements spanned by a strided view, from its first element to its last."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= max(size, 1)
    return tuple(reversed(stride))


@dataclass
class Guarded:
    """A view inside a poisoned buffer, and how to tell whether its margins were hit."""

    view: torch.Tensor
    buffer: torch.Tensor
    margin: int
    extent: int
    name: str

    def margins_hit(self) -> int:
        """How many margin elements no longer hold poison."""
        front = self.buffer[: self.margin]
        back = self.buffer[self.margin + self.extent :]
        return int((~poison.unwritten_mask(front)).sum() + (~poison.unwritten_mask(back)).sum())


def empty(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device | str,
    stride: tuple[int, ...] | None = None,
    name: str = "tensor",
) -> Guarded:
    """A poisoned tensor of ``shape`` (and ``stride``) with poisoned margins around it."""
    shape = tuple(shape)
    stride = tuple(stride) if stride is not None else _contiguous_stride(shape)
    margin = MARGIN_BYTES // dtype.itemsize
    extent = _extent(shape, stride)
    buffer = poison.fill(torch.empty(extent + 2 * margin, dtype=dtype, device=device))
    view = buffer.as_strided(shape, stride, storage_offset=margin)
    return Guarded(view, buffer, margin, extent, name)


def copy(x: torch.Tensor, name: str) -> Guarded:
    """``x`` moved into a guarded buffer, keeping its shape and strides."""
    guarded = empty(tuple(x.shape), x.dtype, x.device, tuple(x.stride()), name)
    guarded.view.copy_(x)
    return guarded

