"""Candidates with one classic bug each (and a few without), for the course's problems.

The tests and ``rooflab check`` both grade these; each broken one should fail with a
message that names its bug.
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


@triton.jit
def _add_unmasked_store(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y)  # forgot the mask: the last block writes past the end


def writes_out_of_bounds(x, y):
    out = torch.empty_like(x)
    _add_unmasked_store[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
    return out


def writes_a_whole_block_out_of_bounds(x, y):
    """The same bug with blocks of 1024: up to 4 KiB past the end, enough to corrupt the
    allocator's own records if the write were let through."""
    out = torch.empty_like(x)
    _add_unmasked_store[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return out


@triton.jit
def _add_tutorial(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)  # adds in the input dtype, bf16 included


def tutorial_add(x, y):
    """Correct, written as Triton's tutorial does: no upcast before adding."""
    out = torch.empty_like(x)
    _add_tutorial[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
    return out


# coalescing/transpose

@triton.jit
def _copy_tile(x_ptr, out_ptr, M, N, sxm, sxn, som, son, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tile = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn, mask=mask)
    tl.store(out_ptr + rows[:, None] * som + cols[None, :] * son, tile, mask=mask)


def _copy(x):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(x.shape[0], 32), triton.cdiv(x.shape[1], 32))
    _copy_tile[grid](x, out, *x.shape, *x.stride(), *out.stride(), BLOCK=32)
    return out


def transpose_as_view(x):
    """Copies x with a kernel, then returns the copy's .T: right values, wrong layout."""
    return _copy(x).T


def transpose_returns_input(x):
    """Launches a kernel for show, then returns a view of its input."""
    _copy(x)
    return x.T


def transpose_with_copy_(x):
    """Lets torch do the transpose with copy_."""
    _copy(x)
    out = torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype, device=x.device)
    return out.copy_(x.T)


# matmul/tiled

@triton.jit
def _matmul_fp16_acc(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                     BLOCK: tl.constexpr):
    rm = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rk = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float16)  # should be float32
    for k0 in range(0, K, BLOCK):
        k = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * sam + k[None, :] * sak,
                    mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + k[:, None] * sbk + rn[None, :] * sbn,
                    mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b).to(tl.float16)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_accumulating_in_fp16(a, b):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
    _matmul_fp16_acc[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(), BLOCK=32)
    return c


# matmul/naive

@triton.jit
def _rows_fp16_acc(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                   BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float16)  # should be float32
    for k in range(0, K):
        a = tl.load(a_ptr + row * sam + k * sak)
        b = tl.load(b_ptr + k * sbk + cols * sbn, mask=mask, other=0.0)
        acc += (a * b).to(tl.float16)
    tl.store(c_ptr + row * scm + cols * scn, acc.to(c_ptr.dtype.element_ty), mask=mask)


def matmul_rows_accumulating_in_fp16(a, b):
    """The naive matmul with an fp16 running sum: right for short K, wrong for long K."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    _rows_fp16_acc[(M, triton.cdiv(N, 64))](a, b, c, M, N, K, *a.stride(), *b.stride(),
                                            *c.stride(), BLOCK_N=64)
    return c


@triton.jit
def _stub_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # YOUR CODE HERE
    raise NotImplementedError()


def not_implemented_in_a_kernel(x, y):
    out = torch.empty_like(x)
    _stub_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
    return out


# Written the way Triton's matmul tutorial writes it: pointers advanced each K step,
# `tl.dot(a, b, acc)`, row and column offsets wrapped modulo M and N so every load is in
# bounds, and the program order grouped with GROUP_SIZE_M = 8. Correct: it must pass.

@triton.jit
def _tutorial_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                            stride_bn, stride_cm, stride_cn, BLOCK_SIZE_M: tl.constexpr,
                            BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                            GROUP_SIZE_M: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    c = accumulator.to(c_ptr.dtype.element_ty)

    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def tutorial_matmul(a, b, block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _tutorial_matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                  b.stride(1), c.stride(0), c.stride(1),
                                  BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n,
                                  BLOCK_SIZE_K=block_k, GROUP_SIZE_M=group_m,
                                  num_warps=num_warps)
    return c


def transpose_forgets_to_swap(x):
    """Stores each tile where it read it: rows and columns not swapped for the output."""
    out = torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(x.shape[0], 32), triton.cdiv(x.shape[1], 32))
    _copy_tile[grid](x, out, *x.shape, *x.stride(), *out.stride(), BLOCK=32)
    return out


# softmax/fused

@triton.jit
def _softmax_masked_as_zero(x_ptr, out_ptr, N, stride_xm, stride_xn, stride_om,
                            BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask,
                other=0.0).to(tl.float32)  # should be -inf: exp(0 - max) adds to the sum
    z = x - tl.max(x, axis=0)
    num = tl.exp(z)
    tl.store(out_ptr + row * stride_om + cols, (num / tl.sum(num, axis=0)).to(
        out_ptr.dtype.element_ty), mask=mask)


def softmax_masked_lanes_count(x):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(x.shape[1])
    _softmax_masked_as_zero[(x.shape[0],)](x, out, x.shape[1], x.stride(0), x.stride(1),
                                           out.stride(0), BLOCK=block)
    return out
