"""Attention, O = softmax(Q Kᵀ · scale) V, without ever writing the S×S scores to memory.

The ladder:

1. ``attention_reference``: the textbook version. It materialises the scores S = Q Kᵀ and
   the probabilities P = softmax(S), both (seq × seq) per head, so its memory traffic
   grows with seq² while its useful inputs and output grow with seq · head_dim. At
   seq 4096, head_dim 64 in fp16, one head's scores are 32 MiB against 0.5 MiB for each of
   Q, K, V and O: the operation that should sit above the ridge point is memory-bound.
2. ``flash_attention_forward`` (FlashAttention): tile it. A program owns BLOCK_M query
   rows and keeps their output tile in registers; it walks K and V in blocks of BLOCK_N
   keys, so each score block lives only on chip. The catch is the softmax, which needs a
   row's maximum and sum over *all* keys before any probability is known. The *online
   softmax* fixes that: keep per row a running maximum m and running sum l of exp(s - m),
   and when a new block raises the maximum from m_old to m_new, multiply the sum l and the
   partial output acc by exp(m_old - m_new), which re-expresses them relative to the new
   maximum. After the last block, O = acc / l exactly, in one pass over K and V.
3. Causal attention (query i sees keys j ≤ i): key blocks entirely above the diagonal
   contribute nothing, so the loop stops at the diagonal and never loads them, which
   halves the work; only the block that straddles the diagonal needs an element mask.
4. The backward pass needs P again. Storing it would bring back the seq² traffic, so the
   forward saves one number per row instead, the log-sum-exp LSE = m + log(l), and the
   backward recomputes P = exp(S - LSE) block by block from Q, K and LSE. With
   delta = rowsum(dO ∘ O) (one small preprocessing kernel):

       dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − delta),
       dQ = dS K · scale,   dK = dSᵀ Q · scale.

   dK and dV sum over queries, dQ over keys. One kernel owns a block of keys and loops
   over query blocks (dK, dV); another owns a block of queries and loops over key blocks
   (dQ). Each output tile then has a single writer: no atomics, at the price of computing
   the score block twice.

Inputs are (batch, heads, seq, head_dim) of any strides, in fp16, bf16 or fp32; dots
accumulate in fp32 and P is cast back to the input type before the P·V dot, as
FlashAttention does on tensor cores. Causal masks are aligned top-left (query i sees keys
0..i), as in ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from rooflab.autograder.device import interpreter_enabled


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """The starting point: plain PyTorch attention that materialises the scores.

    Computes in float32 (float64 if given float64) and returns q's dtype. Per head, with
    seq S and head_dim D, the comments count the elements each line reads and writes."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    out_dtype = q.dtype
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    s = (q @ k.transpose(-2, -1)) * scale  # reads 2·S·D, writes S·S
    if causal:
        above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(above, float("-inf"))  # reads and writes S·S
    p = torch.softmax(s, dim=-1)  # reads S·S (twice: max, then exp and sum), writes S·S
    o = p @ v  # reads S·S + S·D, writes S·D
    return o.to(out_dtype)


# Why exp2: the GPU's special-function unit computes 2**x (MUFU.EX2); exp(x) compiles to
# exp2(x · log2 e) anyway. Folding log2(e) into the softmax scale once turns every score's
# "scale, then exp" into "scale, then exp2", saving a multiply per score; the running
# maximum m and the sum are then in base 2, and LSE is converted back to natural log when
# it is stored. The constants are written in the kernels because a @triton.jit function
# may only read globals that are tl.constexpr, and the notebooks copy kernels one by one.


@triton.jit
def flash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, sm_scale, H, N_Q, N_K,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
):
    """One program: BLOCK_M queries of one (batch, head), all keys, in one pass."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    # int64: batch and head offsets pass 2**31 elements on large inputs.
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    q_ptr += b * stride_qb + h * stride_qh
    k_ptr += b * stride_kb + h * stride_kh
    v_ptr += b * stride_vb + h * stride_vh
    o_ptr += b * stride_ob + h * stride_oh
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=offs_m[:, None] < N_Q, other=0.0)
    if UPCAST:  # the interpreter gets bf16 dots wrong; fp32 ones right (no TF32)
        q = q.to(tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): scores in base 2, for exp2
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    ### BEGIN SOLUTION
    hi = N_K
    if CAUSAL:  # key blocks past this query block's last row are never loaded
        hi = tl.minimum((pid_m + 1) * BLOCK_M, N_K)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        # K is loaded transposed (HEAD_DIM × BLOCK_N) so that q @ kt is the score block.
        kt = tl.load(k_ptr + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn,
                     mask=cols[None, :] < N_K, other=0.0)
        v = tl.load(v_ptr + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=cols[:, None] < N_K, other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        keep = cols[None, :] < N_K  # the last block may run past the keys
        if CAUSAL:  # only the block on the diagonal has anything to hide
            keep = keep & (offs_m[:, None] >= cols[None, :])
        s = tl.where(keep, tl.dot(q, kt) * qk_scale, float("-inf"))
        # Key 0 is visible to every row, so after the first block m_i is finite and
        # m_i - m_new is never -inf - (-inf).
        ### KEY
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed against the old maximum
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # P in the input type: the P·V dot runs on tensor cores, accumulating in fp32.
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
        ### END KEY
    ### END SOLUTION
    acc = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             acc.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < N_Q)
    # What the backward needs to rebuild P: log of the row's sum, natural log (ln 2 = 0.693).
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    tl.store(lse_ptr + pid_bh * N_Q + offs_m, lse, mask=offs_m < N_Q)


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "need (batch, heads, seq, head_dim)"
    assert q.dtype == k.dtype == v.dtype, "q, k and v must share a dtype"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"{q.dtype} unsupported"
    assert k.shape == v.shape, "k and v must have the same shape"
    assert q.shape[:2] == k.shape[:2] and q.shape[3] == k.shape[3], "q and k shapes disagree"
    d = q.shape[3]
    # tl.arange needs a power of two and tl.dot each dimension >= 16; past 128 the GPU
    # tiles below would not fit in shared memory.
    assert 16 <= d <= 128 and d & (d - 1) == 0, "head_dim must be a power of two in [16, 128]"
    assert q.shape[2] >= 1 and k.shape[2] >= 1, "empty sequence"


def _launch_config(kernel: str, head_dim: int, dtype: torch.dtype) -> dict[str, int]:
    """Block sizes, warps and pipeline stages for one kernel.

    In the interpreter a program × loop iteration costs milliseconds whatever its size, so
    big blocks make tests fast. On a GPU (Ampere, Hopper) the limits are registers (the
    fp32 accumulators) and shared memory (num_stages copies of the K, V or Q, dO blocks)."""
    if interpreter_enabled():
        return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
    big = head_dim > 64
    if dtype == torch.float32:  # twice the bytes per element: smaller tiles, fewer stages
        return {"BLOCK_M": 64 if kernel == "fwd" else 32, "BLOCK_N": 32, "num_warps": 4,
                "num_stages": 2}
    # 8 warps: with 4, the fp32 accumulators and score blocks of these tiles exceed 255
    # registers per thread and spill (cuobjdump -res-usage on sm_90 builds).
    if kernel == "fwd":
        return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    if kernel == "dkdv":  # holds K, V and fp32 dK, dV for BLOCK_N keys
        return {"BLOCK_M": 32, "BLOCK_N": 64 if big else 128, "num_warps": 8,
                "num_stages": 2 if big else 3}
    # dq: holds Q, dO and fp32 dQ for BLOCK_M queries
    return {"BLOCK_M": 64 if big else 128, "BLOCK_N": 32, "num_warps": 8,
            "num_stages": 2 if big else 3}


def _blocks(config: dict[str, int], block_m: int | None, block_n: int | None) -> dict:
    config = dict(config)
    if block_m is not None:
        config["BLOCK_M"] = block_m
    if block_n is not None:
        config["BLOCK_N"] = block_n
    return config


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    sm_scale: float | None = None, *, block_m: int | None = None, block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward. Returns ``(o, lse)``: o of q's shape and dtype, and the
    natural-log log-sum-exp of each row's scaled scores, fp32, (batch, heads, seq_q).
    q is (batch, heads, seq_q, head_dim), k and v (batch, heads, seq_k, head_dim); seq_q
    and seq_k may differ. ``block_m``/``block_n`` override the block sizes (≥ 16)."""
    _check_inputs(q, k, v)
    B, H, N_Q, D = q.shape
    N_K = k.shape[2]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    o = torch.empty((B, H, N_Q, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_Q), dtype=torch.float32, device=q.device)
    config = _blocks(_launch_config("fwd", D, q.dtype), block_m, block_n)
    grid = (triton.cdiv(N_Q, config["BLOCK_M"]), B * H)
    flash_fwd_kernel[grid](
        q, k, v, o, lse, scale, H, N_Q, N_K,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        HEAD_DIM=D, CAUSAL=causal,
        UPCAST=interpreter_enabled() and q.dtype == torch.bfloat16, **config,
    )
    return o, lse


@triton.jit
def flash_bwd_preprocess_kernel(
    o_ptr, do_ptr, delta_ptr, H, N_Q,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """delta = rowsum(dO ∘ O), which equals rowsum(P ∘ dP): the softmax backward's
    per-row term, computed once here instead of in every key block."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < N_Q
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om
                + offs_d[None, :] * stride_od, mask=rows, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=rows, other=0.0).to(tl.float32)
    ### BEGIN SOLUTION
    ### KEY
    delta = tl.sum(o * do, 1)
    ### END KEY
    ### END SOLUTION
    tl.store(delta_ptr + pid_bh * N_Q + offs_m, delta, mask=offs_m < N_Q)


@triton.jit
def flash_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, sm_scale, H, N_Q, N_K,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
):
    """One program: dK and dV for BLOCK_N keys of one (batch, head), over all queries.
    Works on transposed score blocks (keys × queries) so that sums over queries are dots."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    q_ptr += b * stride_qb + h * stride_qh
    k_ptr += b * stride_kb + h * stride_kh
    v_ptr += b * stride_vb + h * stride_vh
    do_ptr += b * stride_dob + h * stride_doh
    dk_ptr += b * stride_dkb + h * stride_dkh
    dv_ptr += b * stride_dvb + h * stride_dvh
    lse_ptr += pid_bh * N_Q  # from here on, lse_ptr and delta_ptr are this head's rows
    delta_ptr += pid_bh * N_Q
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < N_K
    k = tl.load(k_ptr + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=keys,
                other=0.0)
    v = tl.load(v_ptr + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=keys,
                other=0.0)
    if UPCAST:  # the interpreter gets bf16 dots wrong; fp32 ones right (no TF32)
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e), as in the forward
    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    ### BEGIN SOLUTION
    lo = 0
    if CAUSAL:  # queries before this block's first key cannot see it: skip their blocks
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in range(lo, N_Q, BLOCK_M):
        rows = start_m + offs_m
        q = tl.load(q_ptr + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                    mask=rows[:, None] < N_Q, other=0.0)
        do = tl.load(do_ptr + rows[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=rows[:, None] < N_Q, other=0.0)
        lse2 = tl.load(lse_ptr + rows, mask=rows < N_Q, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_ptr + rows, mask=rows < N_Q, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        keep = rows[None, :] < N_Q
        if CAUSAL:
            keep = keep & (rows[None, :] >= offs_n[:, None])
        ### KEY
        # Pᵀ rebuilt from the saved LSE: exp(s - lse), already normalised.
        st = tl.where(keep, tl.dot(k, tl.trans(q)) * qk_scale, float("-inf"))
        pt = tl.exp2(st - lse2[None, :])
        dv = tl.dot(pt.to(do.dtype), do, dv)
        dpt = tl.dot(v, tl.trans(do))
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(dst.to(q.dtype), q, dk)
        ### END KEY
    ### END SOLUTION
    dk = dk * sm_scale  # S = scale · Q Kᵀ: the scale comes back out of the chain rule
    tl.store(dk_ptr + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(dk_ptr.dtype.element_ty), mask=keys)
    tl.store(dv_ptr + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(dv_ptr.dtype.element_ty), mask=keys)


@triton.jit
def flash_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, sm_scale, H, N_Q, N_K,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
):
    """One program: dQ for BLOCK_M queries of one (batch, head), over all keys."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    q_ptr += b * stride_qb + h * stride_qh
    k_ptr += b * stride_kb + h * stride_kh
    v_ptr += b * stride_vb + h * stride_vh
    do_ptr += b * stride_dob + h * stride_doh
    dq_ptr += b * stride_dqb + h * stride_dqh
    lse_ptr += pid_bh * N_Q  # from here on, lse_ptr and delta_ptr are this head's rows
    delta_ptr += pid_bh * N_Q
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < N_Q
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=rows,
                other=0.0)
    do = tl.load(do_ptr + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod, mask=rows,
                 other=0.0)
    lse = tl.load(lse_ptr + offs_m, mask=offs_m < N_Q, other=0.0)
    lse2 = lse * 1.4426950408889634  # to base 2, like the scores
    delta = tl.load(delta_ptr + offs_m, mask=offs_m < N_Q, other=0.0)
    if UPCAST:  # the interpreter gets bf16 dots wrong; fp32 ones right (no TF32)
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e), as in the forward
    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    ### BEGIN SOLUTION
    hi = N_K
    if CAUSAL:  # as in the forward: stop at the diagonal
        hi = tl.minimum((pid_m + 1) * BLOCK_M, N_K)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_ptr + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=cols[:, None] < N_K, other=0.0)
        # V transposed (HEAD_DIM × BLOCK_N): dO @ vt is the dP block.
        vt = tl.load(v_ptr + offs_d[:, None] * stride_vd + cols[None, :] * stride_vn,
                     mask=cols[None, :] < N_K, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            vt = vt.to(tl.float32)
        keep = cols[None, :] < N_K
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= cols[None, :])
        ### KEY
        s = tl.where(keep, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        p = tl.exp2(s - lse2[:, None])
        dp = tl.dot(do, vt)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
        ### END KEY
    ### END SOLUTION
    dq = dq * sm_scale
    tl.store(dq_ptr + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(dq_ptr.dtype.element_ty), mask=rows)


def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, causal: bool = False, sm_scale: float | None = None, *,
    block_m: int | None = None, block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` of attention given the forward's ``o`` and ``lse`` and
    the output gradient ``do``; recomputes P block by block, stores nothing seq × seq.
    ``block_m``/``block_n`` override the block sizes of both main kernels (≥ 16)."""
    _check_inputs(q, k, v)
    B, H, N_Q, D = q.shape
    N_K = k.shape[2]
    assert o.shape == q.shape and do.shape == q.shape, "o and do must have q's shape"
    assert lse.shape == (B, H, N_Q), "lse must be (batch, heads, seq_q)"
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    do = do.to(q.dtype)
    lse = lse.to(torch.float32).contiguous()  # the kernels index it as (B·H, N_Q)
    delta = torch.empty_like(lse)
    dq = torch.empty((B, H, N_Q, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, H, N_K, D), dtype=k.dtype, device=k.device)
    dv = torch.empty((B, H, N_K, D), dtype=v.dtype, device=v.device)
    upcast = interpreter_enabled() and q.dtype == torch.bfloat16

    pre_block = 64
    flash_bwd_preprocess_kernel[(triton.cdiv(N_Q, pre_block), B * H)](
        o, do, delta, H, N_Q, *o.stride(), *do.stride(), BLOCK_M=pre_block, HEAD_DIM=D)

    config = _blocks(_launch_config("dkdv", D, q.dtype), block_m, block_n)
    flash_bwd_dkdv_kernel[(triton.cdiv(N_K, config["BLOCK_N"]), B * H)](
        q, k, v, do, lse, delta, dk, dv, scale, H, N_Q, N_K,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        HEAD_DIM=D, CAUSAL=causal, UPCAST=upcast, **config)

    config = _blocks(_launch_config("dq", D, q.dtype), block_m, block_n)
    flash_bwd_dq_kernel[(triton.cdiv(N_Q, config["BLOCK_M"]), B * H)](
        q, k, v, do, lse, delta, dq, scale, H, N_Q, N_K,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        HEAD_DIM=D, CAUSAL=causal, UPCAST=upcast, **config)
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Attention whose backward is ``flash_attention_backward``: saves q, k, v, o and the
    per-row LSE, never the seq × seq probabilities."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                sm_scale: float | None = None) -> torch.Tensor:
        scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
        o, lse = flash_attention_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.sm_scale = scale
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · sm_scale) v for (batch, heads, seq, head_dim) inputs, differentiable;
    ``sm_scale`` defaults to 1/√head_dim."""
    return FlashAttention.apply(q, k, v, causal, sm_scale)
