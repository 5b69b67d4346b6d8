"""Poison values: bit patterns that mark memory no kernel has written yet.

Freshly allocated memory often holds the right answer by accident: the reference ran a
moment ago, its buffer went back to the allocator, and the candidate's ``torch.empty``
got it back. So during a check every new allocation, and every output buffer the grader
passes in, is filled with a poison pattern. Floating types get a quiet NaN with a
recognisable payload: an element that still carries that exact pattern was never written,
and any arithmetic that touches it yields NaN, never a plausible number.
"""

from __future__ import annotations

import torch

# dtype -> (integer view dtype, bit pattern as a signed integer of that width)
_PATTERNS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FF8_A5A5_A5A5_A5A5),
    torch.float32: (torch.int32, 0x7FE5_A5A5),
    torch.float16: (torch.int16, 0x7E5A),
    torch.bfloat16: (torch.int16, 0x7FDA),
    torch.int64: (torch.int64, 0x5A5A_5A5A_5A5A_5A5A),
    torch.int32: (torch.int32, 0x5A5A_5A5A),
    torch.int16: (torch.int16, 0x5A5A),
    torch.int8: (torch.int8, 0x5A),
    torch.uint8: (torch.uint8, 0xA5),
}


def supports(dtype: torch.dtype) -> bool:
    return dtype in _PATTERNS


def can_poison(t: torch.Tensor) -> bool:
    return t.dtype in _PATTERNS and t.numel() > 0


def fill(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` (in place) with its dtype's poison pattern; returns ``t``."""
    if can_poison(t):
        view_dtype, pattern = _PATTERNS[t.dtype]
        t.view(view_dtype).fill_(pattern)
    return t


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A new tensor full of poison: the output buffer the grader hands a candidate."""
    return fill(torch.empty(shape, dtype=dtype, device=device))


def unwritten_mask(t: torch.Tensor) -> torch.Tensor:
    """True where ``t`` still holds the poison pattern bit for bit."""
    if not can_poison(t):
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    view_dtype, pattern = _PATTERNS[t.dtype]
    return t.contiguous().view(view_dtype) == pattern
