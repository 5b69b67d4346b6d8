"""Vector add: the smallest complete Triton kernel, and a pure test of memory bandwidth.

Each program adds one block of ``BLOCK`` elements. The last block usually runs past the
end of the vectors (n is rarely a multiple of the block), so every load and store is
masked: without the mask the tail is either skipped or written out of bounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    ### BEGIN SOLUTION
    pid = tl.program_id(axis=0)
    ### KEY
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n  # the last block may run past the end
    ### END KEY
    # Add in fp32: exact for fp16/bf16 inputs, and bf16 arithmetic is wrong in the
    # interpreter.
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """x + y for contiguous tensors of the same shape and dtype."""
    assert x.shape == y.shape and x.dtype == y.dtype, "x and y must match in shape and dtype"
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = out.numel()
    add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    return out
