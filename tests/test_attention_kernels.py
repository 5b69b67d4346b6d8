"""FlashAttention forward and backward (rooflab.kernels.attention) against plain attention
in float64, on ragged lengths, strided inputs and the causal mask's block skipping."""

import math

import pytest
import torch
import torch.nn.functional as F

from rooflab.kernels.attention import (
    attention_reference,
    flash_attention,
    flash_attention_backward,
    flash_attention_forward,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Tolerances, used as atol = rtol. The reference takes the same (already rounded) inputs
# in float64, so only the kernel's own rounding counts. The output is rounded once to its
# dtype and P is rounded to the input dtype before the P·V dot: about 2 ulps at 1 (fp16
# ulp 2^-10, bf16 2^-7). Gradients go through more roundings (P and dS before their dots,
# the stored gradient): about 4 ulps. fp32 dots are exact in the interpreter, leaving exp2
# and reordered sums (measured below 2e-6); on a GPU they are TF32, which rounds q, k, v
# and P to fp16's 10-bit mantissa, and errors in the scores grow through exp.
FWD_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2,
           torch.float32: 1e-5 if DEVICE == "cpu" else 1e-2}
GRAD_TOL = {torch.float16: 4e-3, torch.bfloat16: 3.2e-2,
            torch.float32: 1e-5 if DEVICE == "cpu" else 2e-2}


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def reference(q, k, v, causal=False, sm_scale=None):
    """The float64 reference on the kernel's exact inputs."""
    return attention_reference(q.double(), k.double(), v.double(), causal, sm_scale)


def gradients(attention, q, k, v, do):
    """(o, dq, dk, dv) of ``attention`` through autograd, on fresh leaves."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    o = attention(q, k, v)
    o.backward(do)
    return o, q.grad, k.grad, v.grad


def reference_gradients(q, k, v, do, causal=False, sm_scale=None):
    """(o, dq, dk, dv) of the float64 reference: float64 leaves, so that its gradients are
    not rounded back to the kernel's dtype."""
    return gradients(lambda *x: attention_reference(*x, causal, sm_scale),
                     *(x.double() for x in (q, k, v)), do.double())


def assert_grads_close(actual, expected, tol):
    for name, a, e in zip(("o", "dq", "dk", "dv"), actual, expected, strict=True):
        torch.testing.assert_close(a.double(), e, atol=tol, rtol=tol,
                                   msg=lambda m, n=name: f"{n}: {m}")


# --- forward ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch, heads, seq", [(1, 1, 1), (2, 2, 37), (1, 2, 100)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_forward_matches_reference(batch, heads, seq, causal, dtype):
    q, k, v = (randn(batch, heads, seq, 64, dtype=dtype) for _ in range(3))
    o, lse = flash_attention_forward(q, k, v, causal)
    assert o.dtype == dtype and o.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (batch, heads, seq)
    tol = FWD_TOL[dtype]
    torch.testing.assert_close(o.double(), reference(q, k, v, causal), atol=tol, rtol=tol)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_head_dim_128(causal):
    q, k, v = (randn(1, 2, 70, 128, dtype=torch.float16) for _ in range(3))
    o, _ = flash_attention_forward(q, k, v, causal)
    tol = FWD_TOL[torch.float16]
    torch.testing.assert_close(o.double(), reference(q, k, v, causal), atol=tol, rtol=tol)


def test_forward_bf16():
    q, k, v = (randn(2, 1, 100, 64, dtype=torch.bfloat16) for _ in range(3))
    o, _ = flash_attention_forward(q, k, v, causal=True)
    assert o.dtype == torch.bfloat16
    tol = FWD_TOL[torch.bfloat16]
    torch.testing.assert_close(o.double(), reference(q, k, v, True), atol=tol, rtol=tol)


def test_forward_of_strided_views():
    # (batch, seq, heads, head_dim) memory seen as (batch, heads, seq, head_dim), as a
    # model's projections produce it; k also skips every other position.
    q = randn(2, 45, 2, 64).transpose(1, 2)
    k = randn(2, 90, 2, 64).transpose(1, 2)[:, :, ::2]
    v = randn(2, 2, 64, 45).transpose(2, 3)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    o, _ = flash_attention_forward(q, k, v, causal=True)
    tol = FWD_TOL[torch.float32]
    torch.testing.assert_close(o.double(), reference(q, k, v, True), atol=tol, rtol=tol)


@pytest.mark.parametrize("seq_q, seq_k", [(50, 90), (90, 50)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_different_lengths_and_scale(seq_q, seq_k, causal):
    q = randn(1, 2, seq_q, 64)
    k, v = randn(1, 2, seq_k, 64), randn(1, 2, seq_k, 64)
    o, _ = flash_attention_forward(q, k, v, causal, sm_scale=0.3)
    tol = FWD_TOL[torch.float32]
    torch.testing.assert_close(o.double(), reference(q, k, v, causal, 0.3), atol=tol, rtol=tol)


@pytest.mark.parametrize("block_m, block_n", [(16, 32), (32, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_with_many_small_blocks(block_m, block_n, causal):
    # Many blocks per row, and a diagonal that cuts blocks of unequal height and width.
    q, k, v = (randn(1, 1, 100, 64) for _ in range(3))
    o, _ = flash_attention_forward(q, k, v, causal, block_m=block_m, block_n=block_n)
    tol = FWD_TOL[torch.float32]
    torch.testing.assert_close(o.double(), reference(q, k, v, causal), atol=tol, rtol=tol)


@pytest.mark.parametrize("causal", [False, True])
def test_lse_is_the_log_sum_exp_of_the_scaled_scores(causal):
    q, k, v = randn(2, 2, 37, 64), randn(2, 2, 53, 64), randn(2, 2, 53, 64)
    _, lse = flash_attention_forward(q, k, v, causal)
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(64)
    if causal:
        above = torch.ones(37, 53, dtype=torch.bool, device=DEVICE).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    # LSE is about log(seq) + max score, a few units: fp32 keeps ~1e-6 of it.
    tol = FWD_TOL[torch.float32]
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, dim=-1), atol=tol, rtol=tol)


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the interpreter's max over the NaN rows
def test_causal_never_reads_key_blocks_past_the_diagonal():
    # With 32 queries and 16-wide blocks, keys 32.. lie wholly above the diagonal. Poisoned
    # with NaN they must not matter: a kernel that loaded them would put 0 · NaN = NaN into
    # its P·V (or dS·K) dots, as the non-causal call shows.
    q, k, v = randn(1, 2, 32, 64), randn(1, 2, 100, 64), randn(1, 2, 100, 64)
    k[:, :, 32:] = float("nan")
    v[:, :, 32:] = float("nan")
    blocks = {"block_m": 16, "block_n": 16}
    assert flash_attention_forward(q, k, v, False, **blocks)[0].isnan().all()

    o, lse = flash_attention_forward(q, k, v, True, **blocks)
    do = randn(1, 2, 32, 64)
    expected = reference_gradients(q, k[:, :, :32], v[:, :, :32], do, causal=True)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, True, **blocks)
    assert torch.equal(dk[:, :, 32:], torch.zeros_like(dk[:, :, 32:]))
    assert torch.equal(dv[:, :, 32:], torch.zeros_like(dv[:, :, 32:]))
    assert_grads_close((o, dq, dk[:, :, :32], dv[:, :, :32]), expected, GRAD_TOL[torch.float32])


def test_unsupported_head_dim_is_refused():
    q = randn(1, 1, 8, 48)
    with pytest.raises(AssertionError, match="power of two"):
        flash_attention_forward(q, q, q)


# --- backward -----------------------------------------------------------------------------


@pytest.mark.parametrize("batch, heads, seq", [(2, 2, 37), (1, 2, 100)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backward_matches_reference(batch, heads, seq, causal, dtype):
    q, k, v = (randn(batch, heads, seq, 64, dtype=dtype) for _ in range(3))
    do = randn(batch, heads, seq, 64, dtype=dtype)
    actual = gradients(lambda *x: flash_attention(*x, causal=causal), q, k, v, do)
    expected = reference_gradients(q, k, v, do, causal)
    assert all(g.dtype == dtype for g in actual)
    assert_grads_close(actual, expected, GRAD_TOL[dtype])


def test_backward_bf16_head_dim_128():
    q, k, v, do = (randn(1, 2, 70, 128, dtype=torch.bfloat16) for _ in range(4))
    actual = gradients(lambda *x: flash_attention(*x, causal=True), q, k, v, do)
    expected = reference_gradients(q, k, v, do, causal=True)
    assert_grads_close(actual, expected, GRAD_TOL[torch.bfloat16])


@pytest.mark.parametrize("causal", [False, True])
def test_backward_small_blocks_strided_and_different_lengths(causal):
    # 16 × 32 blocks: the dK/dV kernel's causal start (a query block below the key block's
    # first key) and the dQ kernel's stop both land mid-block.
    q = randn(1, 45, 2, 64).transpose(1, 2)
    k, v = randn(1, 2, 70, 64), randn(1, 2, 64, 70).transpose(2, 3)
    do = randn(1, 2, 64, 45).transpose(2, 3)
    blocks = {"block_m": 16, "block_n": 32}
    o, lse = flash_attention_forward(q, k, v, causal, 0.2, **blocks)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal, 0.2, **blocks)
    expected = reference_gradients(q, k, v, do, causal, sm_scale=0.2)
    assert_grads_close((o, dq, dk, dv), expected, GRAD_TOL[torch.float32])


# --- on a GPU, at size --------------------------------------------------------------------


def _gpu_case(seq, head_dim, dtype, causal):
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(2, 2, seq, head_dim, device="cuda", dtype=dtype)
                   for _ in range(4))
    ours = gradients(lambda *x: flash_attention(*x, causal=causal), q, k, v, do)
    sdpa = gradients(lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal),
                     q, k, v, do)
    exact = reference_gradients(q, k, v, do, causal)
    return ours, sdpa, exact


@pytest.mark.gpu
@pytest.mark.parametrize("seq, head_dim", [(1024, 64), (2048, 128), (4096, 64)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_and_backward_on_gpu_at_size(seq, head_dim, dtype, causal):
    ours, sdpa, exact = _gpu_case(seq, head_dim, dtype, causal)
    # Against PyTorch's own fused attention, within a few ulps of each value's scale (fp16
    # ulp 2^-10, bf16 2^-7 at 1); long rows sum thousands of rounded terms, so gradients,
    # relative to their largest value, get more room than the output.
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for name, a, s in zip(("o", "dq", "dk", "dv"), ours, sdpa, strict=True):
        scale = 1.0 if name == "o" else s.abs().max().item()
        torch.testing.assert_close(a, s, atol=tol * scale, rtol=tol,
                                   msg=lambda m, n=name: f"{n}: {m}")
    # And no less accurate than it: error against float64 at most twice SDPA's, plus one
    # ulp of the largest value for the rounding of the result itself.
    ulp = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    for name, a, s, e in zip(("o", "dq", "dk", "dv"), ours, sdpa, exact, strict=True):
        ours_err = (a.double() - e).abs().max().item()
        sdpa_err = (s.double() - e).abs().max().item()
        assert ours_err <= 2 * sdpa_err + ulp * e.abs().max().item(), (name, ours_err, sdpa_err)
