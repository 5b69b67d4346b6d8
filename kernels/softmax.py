"""Row softmax, ``y = softmax(x, dim=-1)``, from three passes through memory to one.

For each row, ``y_j = exp(x_j - max(x)) / sum_k exp(x_k - max(x))``. It does 5 FLOPs per
element (max, subtract, exp, add, divide) and cannot use tensor cores, so it is
memory-bound on every card: its speed is the bytes it moves. For an ``M × N`` matrix of
``s``-byte elements the compulsory traffic is ``2·M·N·s``: the input read once, the output
written once. The ladder, each step a kernel:

1. ``softmax_naive``: three kernels, one per pass (row max, exp and row sum, normalise),
   each going through HBM: ``M·N·(3s + 8) + 16·M`` bytes, 2.5× the compulsory traffic in
   fp32 and 3.5× in fp16/bf16.
2. ``softmax_unstable``: one kernel, one program per row holding the whole row in
   registers: ``2·M·N·s`` bytes. But it forgets to subtract the row max and returns NaN
   for inputs above ~89. Kept to show the failure: this is the WRONG one.
3. ``softmax_fused``: the same single pass, with the max subtracted: fast and correct,
   as long as a row fits in one block of registers.
4. ``softmax_online``: rows of any length, walked in blocks, with a running max and a
   running sum rescaled as the max grows (the trick FlashAttention is built on).

Every version takes a 2-D ``x`` of any strides, rows and columns (a column stride of 1 is
specialised by Triton at launch, so the common contiguous case loses nothing), computes in
fp32 whatever the input dtype (fp32, fp16, bf16: fp16/bf16 are upcast on load, which is
exact), and returns a new contiguous tensor of ``x``'s dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _output_for(x: torch.Tensor) -> torch.Tensor:
    """Check ``x`` and allocate the contiguous output every version writes."""
    assert x.dim() == 2, "softmax here works on a matrix, over its last dimension"
    assert x.dtype in DTYPES, f"softmax supports {DTYPES}, not {x.dtype}"
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _num_warps(block: int) -> int:
    """Warps for a program that holds ``block`` elements at a time: about 8 elements per
    thread (256 per warp), so wide rows get more threads instead of spilling registers,
    between 1 and 16 warps. A power of two, since ``block`` is one."""
    return min(16, max(1, block // 256))


# %% 1. Three passes, three kernels ----------------------------------------------------
#
# The way a framework without fusion runs softmax: each step is its own kernel, and what
# one step produces goes to HBM and comes back for the next. One program per row; each
# walks its row in blocks, so any row length works.


@triton.jit
def row_max_kernel(x_ptr, max_ptr, N, stride_xm, stride_xn, BLOCK: tl.constexpr):
    """Pass 1: m[row] = max(x[row, :]). Reads x (M·N·s bytes), writes m (4·M)."""
    row = tl.program_id(0).to(tl.int64)  # row * stride can pass 2**31 on a big tensor
    running = tl.full((BLOCK,), float("-inf"), tl.float32)  # lane-wise max so far
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        # Lanes past the row's end read -inf, which never wins a max.
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=cols < N,
                    other=float("-inf")).to(tl.float32)
        running = tl.maximum(running, x)
    tl.store(max_ptr + row, tl.max(running, axis=0))


@triton.jit
def exp_sum_kernel(x_ptr, max_ptr, exp_ptr, sum_ptr, N, stride_xm, stride_xn,
                   BLOCK: tl.constexpr):
    """Pass 2: e = exp(x - m), d[row] = sum(e[row, :]). Reads x again (M·N·s) and m (4·M);
    writes e in fp32 (4·M·N) and d (4·M)."""
    row = tl.program_id(0).to(tl.int64)
    m = tl.load(max_ptr + row)  # once per row, not once per block
    running = tl.zeros((BLOCK,), tl.float32)  # lane-wise sum so far
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask,
                    other=float("-inf")).to(tl.float32)
        e = tl.exp(x - m)  # masked lanes: exp(-inf) = 0, nothing added to the sum
        tl.store(exp_ptr + row * N + cols, e, mask=mask)  # e is ours: contiguous M × N
        running += e
    tl.store(sum_ptr + row, tl.sum(running, axis=0))


@triton.jit
def normalise_kernel(exp_ptr, sum_ptr, out_ptr, N, stride_om, BLOCK: tl.constexpr):
    """Pass 3: y = e / d. Reads e (4·M·N) and d (4·M), writes y (M·N·s)."""
    row = tl.program_id(0).to(tl.int64)
    d = tl.load(sum_ptr + row)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        e = tl.load(exp_ptr + row * N + cols, mask=mask)
        tl.store(out_ptr + row * stride_om + cols, (e / d).to(out_ptr.dtype.element_ty),
                 mask=mask)


def softmax_naive(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """softmax(x, dim=-1) in three kernels, each a pass through HBM.

    Bytes moved for an ``M × N`` input of ``s``-byte elements (the max and sum vectors
    and the exponentials are kept in fp32, 4 bytes):

    ===========  ========================  ==============================
    pass         reads                     writes
    ===========  ========================  ==============================
    row max      x: M·N·s                  m: 4·M
    exp and sum  x: M·N·s, m: 4·M          e: 4·M·N, d: 4·M
    normalise    e: 4·M·N, d: 4·M          y: M·N·s
    ===========  ========================  ==============================

    Total ``M·N·(3s + 8) + 16·M``: x is read twice, and the exponentials make a round
    trip, in fp32, that is as large as x or larger. Against the fused kernel's
    ``2·M·N·s`` that is 20 vs 8 bytes per element in fp32 (2.5×) and 14 vs 4 in
    fp16/bf16 (3.5×): the speed-up to expect from fusing, since all of them are
    memory-bound.
    """
    out = _output_for(x)
    M, N = x.shape
    if x.numel() == 0:
        return out
    BLOCK = min(block, triton.next_power_of_2(N))
    warps = _num_warps(BLOCK)
    row_max = torch.empty(M, dtype=torch.float32, device=x.device)
    row_sum = torch.empty(M, dtype=torch.float32, device=x.device)
    exps = torch.empty((M, N), dtype=torch.float32, device=x.device)
    row_max_kernel[(M,)](x, row_max, N, x.stride(0), x.stride(1), BLOCK=BLOCK,
                         num_warps=warps)
    exp_sum_kernel[(M,)](x, row_max, exps, row_sum, N, x.stride(0), x.stride(1), BLOCK=BLOCK,
                         num_warps=warps)
    normalise_kernel[(M,)](exps, row_sum, out, N, out.stride(0), BLOCK=BLOCK,
                           num_warps=warps)
    return out


# %% 2. One pass, and wrong --------------------------------------------------------------
#
# Fusing the three passes into one program per row keeps the row in registers between the
# steps: x is read once and y written once. This first attempt computes the textbook
# formula exp(x) / sum(exp(x)) as written.


@triton.jit
def softmax_unstable_kernel(x_ptr, out_ptr, N, stride_xm, stride_xn, stride_om,
                            BLOCK: tl.constexpr):
    """WRONG on purpose: no max subtracted, so exp overflows (see softmax_unstable)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask,
                other=float("-inf")).to(tl.float32)
    numerator = tl.exp(x)  # inf as soon as x > 88.7: the bug this kernel exists to show
    y = numerator / tl.sum(numerator, axis=0)
    tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax_unstable(x: torch.Tensor) -> torch.Tensor:
    """THE WRONG ONE, kept to show the failure: fused softmax without the max subtracted.

    It moves the compulsory ``2·M·N·s`` bytes, like ``softmax_fused``, and is right on
    small inputs. But ``exp(x)`` overflows fp32 for ``x > ln(3.4e38) ≈ 88.7``: one such
    element makes the row's sum inf and its own output inf / inf = NaN (the others become
    0). Had it computed in fp16 it would overflow already at ``ln(65504) ≈ 11.1``; here
    fp16 input is upcast first, so the threshold is 88.7 for every dtype, but fp16 and bf16
    inputs reach far beyond it (logits of 100 are common). At the other end, a row whose
    every element is below about -104 underflows every exp to 0 and returns 0 / 0 = NaN.
    """
    out = _output_for(x)
    M, N = x.shape
    if x.numel() == 0:
        return out
    BLOCK = triton.next_power_of_2(N)
    softmax_unstable_kernel[(M,)](x, out, N, x.stride(0), x.stride(1), out.stride(0),
                                  BLOCK=BLOCK, num_warps=_num_warps(BLOCK))
    return out


# %% 3. One pass, and right ---------------------------------------------------------------


@triton.jit
def softmax_fused_kernel(x_ptr, out_ptr, N, stride_xm, stride_xn, stride_om,
                         BLOCK: tl.constexpr):
    """One program per row, the whole row in one block: compute ``y``, the row's softmax,
    without overflow (see softmax_fused)."""
    row = tl.program_id(0).to(tl.int64)  # row * stride can pass 2**31 on a big tensor
    cols = tl.arange(0, BLOCK)  # the whole row: BLOCK is the next power of two >= N
    mask = cols < N  # ...so the lanes past the row's end must be switched off
    # Masked lanes read -inf: they never win the max, and exp(-inf) = 0 adds nothing to the
    # sum. Upcasting fp16/bf16 on load is exact, and keeps every step below in fp32.
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask,
                other=float("-inf")).to(tl.float32)
    ### BEGIN SOLUTION
    ### KEY
    # softmax(x) = softmax(x - c) for any constant c. With c = max(x) every exponent is
    # <= 0, so exp cannot overflow, and the largest term is exp(0) = 1, so the sum is at
    # least 1 and cannot underflow to 0.
    z = x - tl.max(x, axis=0)
    ### END KEY
    numerator = tl.exp(z)
    denominator = tl.sum(numerator, axis=0)
    y = numerator / denominator
    ### END SOLUTION
    tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax_fused(x: torch.Tensor) -> torch.Tensor:
    """softmax(x, dim=-1) for a 2-D x (fp32, fp16 or bf16, of any strides), as a new
    contiguous tensor of x's shape and dtype: one kernel, one program per row, the row in
    registers.

    What changed from ``softmax_naive``: the max, the exponentials and their sum never
    leave the chip, so the kernel reads x once and writes y once, ``2·M·N·s`` bytes, the
    compulsory minimum (2.5× less than the naive version in fp32, 3.5× in fp16/bf16).
    What changed from ``softmax_unstable``: the row max is subtracted before exp, which
    changes nothing mathematically and removes the overflow.

    The limit: a program holds ``next_power_of_2(N)`` fp32 values in registers, spread
    over at most 16 warps (512 threads): 32 values per thread at N = 16384, 128 at 65536.
    A thread has at most 255 registers, so somewhere in the tens of thousands of columns
    the row no longer fits and spills to (slow) local memory. ``softmax_online`` removes
    that limit.
    """
    out = _output_for(x)
    M, N = x.shape
    if x.numel() == 0:
        return out
    BLOCK = triton.next_power_of_2(N)
    softmax_fused_kernel[(M,)](x, out, N, x.stride(0), x.stride(1), out.stride(0),
                               BLOCK=BLOCK, num_warps=_num_warps(BLOCK))
    return out


# %% 4. Rows of any length: the online softmax ---------------------------------------------


@triton.jit
def softmax_online_kernel(x_ptr, out_ptr, N, stride_xm, stride_xn, stride_om,
                          BLOCK: tl.constexpr):
    """One program per row, BLOCK elements at a time. The first loop updates the running
    max ``m`` and running sum ``d`` block by block (see softmax_online); the second writes
    exp(x - m) / d."""
    row = tl.program_id(0).to(tl.int64)  # row * stride can pass 2**31 on a big tensor
    x_row = x_ptr + row * stride_xm
    out_row = out_ptr + row * stride_om
    m = float("-inf")  # the max of the blocks seen so far
    d = 0.0  # sum of exp(x - m) over the blocks seen so far
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols * stride_xn, mask=cols < N,
                    other=float("-inf")).to(tl.float32)
        ### BEGIN SOLUTION
        m_new = tl.maximum(m, tl.max(x, axis=0))
        ### KEY
        # While every element so far is -inf, m_new is -inf and x - m_new would be
        # -inf - (-inf) = NaN. Shift by 0 then: every exp is exp(-inf) = 0 and d stays 0.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        # The old sum was taken relative to m: rescale it to m_new, then add this block.
        d = d * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
        ### END KEY
        m = m_new
        ### END SOLUTION
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(x - m) / d  # m and d are now the whole row's
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax_online(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """softmax(x, dim=-1) for rows of any length, ``block`` elements of a row at a time.

    What changed from ``softmax_fused``: a program no longer holds its whole row, so the
    registers it needs are set by ``block``, not by the row length. The first loop over
    the row's blocks keeps a running max ``m`` and a running sum
    ``d = sum_{k seen} exp(x_k - m)``. When a block raises the max to
    ``m_new = max(m_old, max(x_block))``, every term already in ``d`` is off by the same
    factor, since ``exp(x_k - m_new) = exp(x_k - m_old) · exp(m_old - m_new)``, so

        d_new = sum_{k seen} exp(x_k - m_new) + sum_{k in block} exp(x_k - m_new)
              = d_old · exp(m_old - m_new) + sum(exp(x_block - m_new)).

    ``m_old - m_new <= 0`` and ``x_block - m_new <= 0``, so nothing overflows, and after
    the last block ``m`` and ``d`` are exactly the whole row's max and sum. The second loop
    reads the row again and writes ``exp(x - m) / d``.

    The price: x is read twice, ``3·M·N·s`` bytes requested against ``2·M·N·s``. The second
    read comes soon after the first, by the same program: for short rows it hits L2 and DRAM
    sees about ``2·M·N·s``; when the rows in flight outgrow L2 (1024 rows of 64K bf16 are
    128 MiB against an H100's 50 MB), it comes from DRAM again. (Computing ``m`` and ``d``
    in one pass instead of two is the whole point: a two-pass max-then-sum would read x
    three times.)

    ``block`` must be a power of two; it is clipped to the row length rounded up, so short
    rows do not waste lanes. Tests pass a small block to force several blocks per row.
    """
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, not {block}")
    out = _output_for(x)
    M, N = x.shape
    if x.numel() == 0:
        return out
    BLOCK = min(block, triton.next_power_of_2(N))
    softmax_online_kernel[(M,)](x, out, N, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK=BLOCK, num_warps=_num_warps(BLOCK))
    return out
