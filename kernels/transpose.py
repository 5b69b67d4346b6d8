"""Matrix transpose: one row per program, then one tile per program.

A transpose reads ``x`` along its rows and writes ``out`` along its columns, so one side
of any simple kernel walks memory with a large stride. Give each program a row and its
reads are contiguous but its writes land one element per row of ``out``: one useful
element per 32-byte sector written. Give each program a square tile and both sides can be
contiguous: the tile is read along rows of ``x`` and written along rows of ``out``, and
the compiler moves it between the two layouts on chip (through shared memory).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def transpose_rows_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om, stride_on,
                          BLOCK_N: tl.constexpr):
    """The starting point: program ``r`` copies row ``r`` of x into column ``r`` of out."""
    row = tl.program_id(0)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        values = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask)
        tl.store(out_ptr + cols * stride_om + row * stride_on, values, mask=mask)  # strided


def transpose_rows(x: torch.Tensor, block: int = 256) -> torch.Tensor:
    """x.T, contiguous, one row of x per program."""
    assert x.dim() == 2, "transpose expects a matrix"
    M, N = x.shape
    out = torch.empty((N, M), dtype=x.dtype, device=x.device)
    transpose_rows_kernel[(M,)](x, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                out.stride(1), BLOCK_N=block)
    return out


@triton.jit
def transpose_kernel(
    x_ptr, out_ptr, M, N,
    stride_xm, stride_xn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    ### BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    ### KEY
    tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    # out[c, r] = x[r, c]: the same tile, addressed through out's strides.
    tl.store(out_ptr + cols[None, :] * stride_om + rows[:, None] * stride_on, tile, mask=mask)
    ### END KEY
    ### END SOLUTION


def transpose(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """A contiguous copy of ``x.T`` for a 2-D ``x`` of any strides, one tile per program."""
    assert x.dim() == 2, "transpose expects a matrix"
    M, N = x.shape
    out = torch.empty((N, M), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, block), triton.cdiv(N, block))
    transpose_kernel[grid](
        x, out, M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=block, BLOCK_N=block,
    )
    return out
