"""Tiled matrix multiplication with grouped program ordering.

Each program computes one BLOCK_M × BLOCK_N tile of C, walking K in BLOCK_K steps and
accumulating in fp32. Programs are numbered so that GROUP_M consecutive programs share
the same columns of B, which keeps those columns in L2 while they are reused.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rooflab.autograder.device import interpreter_enabled


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, UPCAST: tl.constexpr,
):
    # Grouped ordering: walk down GROUP_M rows of tiles before moving one column right.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_size = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
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
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(
    a: torch.Tensor, b: torch.Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32,
    group_m: int = 8,
) -> torch.Tensor:
    """a @ b for 2-D a (M×K) and b (K×N) of any strides; fp32 accumulation."""
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
