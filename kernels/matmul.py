"""Matrix multiplication, C = A @ B, from one row at a time to tiles in a good order.

The ladder, each step a kernel:

1. ``matmul_rows``: a program computes a block of one row of C, walking K one element
   at a time. Every element of A and B is fetched from memory again for every output
   that needs it: 8 bytes per 2 FLOPs in fp32.
2. ``matmul``: a program computes a BLOCK_M × BLOCK_N tile of C, walking K in BLOCK_K
   steps with ``tl.dot``. Each element loaded is used BLOCK_M or BLOCK_N times.
3. The same kernel with grouped program order (``group_m > 1``): programs that run at
   the same time share rows of A and columns of B, so those stay in L2.

Inputs may have any strides; accumulation is in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rooflab.autograder.device import interpreter_enabled


@triton.jit
def matmul_rows_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                       BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    ### BEGIN SOLUTION
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(0, K):
        a = tl.load(a_ptr + row * stride_am + k * stride_ak).to(tl.float32)  # one element
        b = tl.load(b_ptr + k * stride_bk + cols * stride_bn, mask=mask, other=0.0)
        acc += a * b.to(tl.float32)
    ### END SOLUTION
    tl.store(c_ptr + row * stride_cm + cols * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask)


def matmul_rows(a: torch.Tensor, b: torch.Tensor, block_n: int = 64) -> torch.Tensor:
    """a @ b, one program per row of C and block of its columns."""
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "need (M×K) @ (K×N)"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    matmul_rows_kernel[(M, triton.cdiv(N, block_n))](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), BLOCK_N=block_n)
    return c


@triton.jit
def tile_coordinates(pid, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Which tile of C program ``pid`` computes, walking GROUP_M rows of tiles down
    before moving one column right (GROUP_M = 1: plain row-major order)."""
    ### BEGIN SOLUTION
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_size = min(tiles_m - first_m, GROUP_M)  # the last group may be shorter
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    ### END SOLUTION
    return pid_m, pid_n


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m, pid_n = tile_coordinates(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N),
                                    GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ### BEGIN SOLUTION
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
        if UPCAST:  # the interpreter computes bf16 dots wrongly; fp32 is exact there
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b)
    ### END SOLUTION
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(
    a: torch.Tensor, b: torch.Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32,
    group_m: int = 1,
) -> torch.Tensor:
    """a @ b for 2-D a (M×K) and b (K×N) of any strides, one tile of C per program,
    programs in row-major order (``group_m=1``) or grouped (``group_m > 1``)."""
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "need (M×K) @ (K×N)"
    assert a.dtype == b.dtype, "a and b must share a dtype"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    matmul_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
        UPCAST=interpreter_enabled() and a.dtype == torch.bfloat16,
    )
    return c


def matmul_grouped(a: torch.Tensor, b: torch.Tensor, group_m: int = 4) -> torch.Tensor:
    """a @ b with programs in groups of ``group_m`` rows of tiles, for L2 reuse."""
    return matmul(a, b, group_m=group_m)
