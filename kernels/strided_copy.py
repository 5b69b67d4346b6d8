"""Copy every ``stride``-th element: how access patterns waste memory bandwidth.

Memory moves in 32-byte sectors. A contiguous copy uses every byte of every sector it
touches; reading every second fp32 element uses half of each sector, every eighth element
one eighth. The useful bandwidth falls with the stride until each element costs a whole
sector. Reading one field of an array of structs is exactly this: a strided read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def strided_copy_kernel(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
    ### BEGIN SOLUTION
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n  # n output elements; the last block may run past them
    ### KEY
    values = tl.load(x_ptr + offsets * stride, mask=mask)  # consecutive lanes, `stride` apart
    tl.store(out_ptr + offsets, values, mask=mask)  # consecutive lanes, consecutive addresses
    ### END KEY
    ### END SOLUTION


def strided_copy(x: torch.Tensor, stride: int, block: int = 1024) -> torch.Tensor:
    """A contiguous copy of ``x[::stride]`` for a contiguous 1-D ``x``."""
    assert x.dim() == 1 and x.is_contiguous(), "strided_copy expects a contiguous vector"
    n = triton.cdiv(x.numel(), stride)
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    strided_copy_kernel[(triton.cdiv(n, block),)](x, out, n, stride, BLOCK=block)
    return out
