"""Candidates for coalescing/vector_add, each with one classic bug, and one without.

The tests and ``rooflab check`` both grade these; each should fail with a message that
names its bug.
"""

import torch
import triton
import triton.language as tl

import rooflab.autograder  # noqa: F401  (interpreter on before the kernels below)


@triton.jit
def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    if MASKED:
        x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
        y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
        tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        x = tl.load(x_ptr + offsets).to(tl.float32)
        y = tl.load(y_ptr + offsets).to(tl.float32)
        tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty))


def correct(x, y):
    out = torch.empty_like(x)
    _add[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128, MASKED=True)
    return out


def skips_tail(x, y):
    """Launches n // BLOCK programs: the ragged tail is never computed."""
    out = torch.empty_like(x)
    full = x.numel() // 128
    if full:
        _add[(full,)](x, y, out, x.numel(), BLOCK=128, MASKED=True)
    return out


def leaves_half_unwritten(x, y):
    """Computes only the first half of the output."""
    out = torch.empty_like(x)
    half = x.numel() // 2
    if half:
        _add[(triton.cdiv(half, 128),)](x, y, out, half, BLOCK=128, MASKED=True)
    return out


@triton.jit
def _add_into_x(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(x_ptr + offsets, x + y, mask=mask)


def modifies_input(x, y):
    """Accumulates into x and returns it: right values, wrecked input."""
    _add_into_x[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return x


def wrong_dtype(x, y):
    """Always returns float32, whatever the inputs were."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _add[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128, MASKED=True)
    return out


@triton.jit
def _add_doubled(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    # (2x + 2y) / 2 in the input precision: 2x overflows fp16 for |x| > 32752.
    tl.store(out_ptr + offsets, (x * 2 + y * 2) * 0.5, mask=mask)


def overflows(x, y):
    out = torch.empty_like(x)
    _add_doubled[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
    return out


def calls_library(x, y):
    """No kernel at all: torch.add does the work."""
    return torch.add(x, y)


def not_implemented(x, y):
    # YOUR CODE HERE
    raise NotImplementedError()
