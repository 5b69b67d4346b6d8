"""Lab 07's kernels and helpers against PyTorch's own: bf16 and e4m3 conversions bit for
bit (every bf16 input, every sign and exponent of fp32), the fused AdamW step against
torch.optim.AdamW, the scaler against torch.amp.GradScaler, the formats' limits against
torch.finfo."""

import math

import pytest
import torch

from rooflab.kernels import amp

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def one_thread():
    """Tiny models train faster on one CPU thread than on a pool of busy ones."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _nan_aware_bits_equal(got: torch.Tensor, want: torch.Tensor) -> bool:
    nan = want.float().isnan()
    return bool(got.float().isnan()[nan].all()) and torch.equal(
        got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def test_bf16_round_is_torch_conversion_on_random_bits_and_edges():
    generator = torch.Generator().manual_seed(0)
    bits = torch.randint(-(1 << 31), (1 << 31) - 1, (300_000,), generator=generator,
                         dtype=torch.int64).to(torch.int32)
    edges = torch.tensor([0x7F800001, 0x7FFFFFFF, -1, 0x7F7FFFFF, 1, 0x3F808000, 0x3F818000,
                          0x00008000, -0x7F7F8000], dtype=torch.int32)
    x = torch.cat([bits, edges]).view(torch.float32).to(DEVICE)
    got = amp.bf16_round(x)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    assert _nan_aware_bits_equal(got, x.to(torch.bfloat16))
    matrix = torch.randn(37, 129, device=DEVICE) * 1e30
    assert torch.equal(amp.bf16_round(matrix), matrix.to(torch.bfloat16))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_e4m3_conversion_is_torch_on_every_bf16_value_and_scale():
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    every = every[every.float().isfinite()].to(DEVICE)
    for scale in (1.0, 3.7, 2.0**-10, 2.0**-20, 448 / 3.3e38, 1e30):
        q, amax = amp.fp8_quantize(every, torch.tensor([scale], device=DEVICE))
        want = (every.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        assert torch.equal(q.view(torch.uint8), want.view(torch.uint8)), scale
        assert amax.item() == every.float().abs().max().item()


def test_fp8_quantize_keeps_shapes_and_takes_every_element_into_amax():
    x = torch.randn(33, 257, device=DEVICE).to(torch.bfloat16)
    x[32, 256] = -1000.0  # in the last, partial block
    q, amax = amp.fp8_quantize(x, torch.tensor([0.1], device=DEVICE))
    assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn
    assert amax.item() == 1000.0
    assert q[32, 256].float().item() == -96.0  # -100 is a tie between 96 and 104: to even


def test_scale_from_amax_is_448_over_amax_and_keeps_1_for_zero_and_inf():
    amax = torch.tensor([2.0, 0.0, float("inf"), 448.0])
    assert amp.scale_from_amax(amax).tolist() == [224.0, 1.0, 1.0, 1.0]
    assert amp.scale_from_amax(amax, margin=1).tolist() == [112.0, 1.0, 1.0, 0.5]


@pytest.mark.parametrize("grad_dtype", [torch.float16, torch.float32])
def test_fused_adamw_is_torch_adamw_with_an_unscaled_gradient(grad_dtype):
    torch.manual_seed(0)
    n, scale, step = 20011, 1024.0, 7
    w, m = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE) * 1e-3
    v = torch.rand(n, device=DEVICE) * 1e-6
    grad = (torch.randn(n, device=DEVICE) * 1e-3 * scale).to(grad_dtype)
    hyper = {"lr": 3e-3, "betas": (0.85, 0.99), "eps": 1e-7, "weight_decay": 0.05}
    master = w.clone()
    optimizer = torch.optim.AdamW([master], **hyper)
    optimizer.state[master] = {"step": torch.tensor(float(step - 1)), "exp_avg": m.clone(),
                               "exp_avg_sq": v.clone()}
    master.grad = grad.float() / scale
    optimizer.step()
    copy = torch.empty(n, dtype=torch.bfloat16, device=DEVICE)
    found = amp.fused_adamw(w, grad, m, v, copy, torch.tensor([scale], device=DEVICE), step,
                            hyper["lr"], *hyper["betas"], hyper["eps"], hyper["weight_decay"])
    assert found.item() == 0.0
    state = optimizer.state[master]
    torch.testing.assert_close(w, master.detach(), rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(m, state["exp_avg"], rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(v, state["exp_avg_sq"], rtol=1e-5, atol=1e-15)
    assert torch.equal(copy, w.to(torch.bfloat16))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_fused_step_with_a_non_finite_gradient_changes_nothing(bad):
    n = 30000
    tensors = [torch.randn(n, device=DEVICE) for _ in range(3)]
    tensors[2] = tensors[2].abs()
    copy = tensors[0].to(torch.bfloat16)
    before = [t.clone() for t in (*tensors, copy)]
    grad = torch.randn(n, device=DEVICE).half()
    grad[-1] = bad
    found = amp.fused_adamw(*tensors[:1], grad, *tensors[1:], copy,
                            torch.tensor([1.0], device=DEVICE), 3)
    assert found.item() == 1.0
    for now, then in zip((*tensors, copy), before, strict=True):
        assert torch.equal(now, then)


def _drive(scaler, optimizer, params, grads, scale_of):
    for p, g in zip(params, grads, strict=True):
        p.grad = g * scale_of()
    scaler.step(optimizer)
    scaler.update()


@pytest.mark.parametrize("kwargs", [
    {}, {"init_scale": 3.0, "growth_factor": 3.0, "backoff_factor": 0.3, "growth_interval": 2},
    {"init_scale": 2.0**126, "growth_factor": 4.0, "growth_interval": 1}])
def test_loss_scaler_follows_gradscaler_step_by_step(kwargs):
    ours, theirs = amp.LossScaler(**kwargs), torch.amp.GradScaler("cpu", **kwargs)
    a, b = torch.zeros(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    sgd_a, sgd_b = torch.optim.SGD([a], lr=1.0), torch.optim.SGD([b], lr=1.0)
    generator = torch.Generator().manual_seed(1)
    for step in range(60):
        grad = torch.randn(4, generator=generator)
        if step % 7 == 3:
            grad[1] = float("nan")
        if step % 9 == 5:
            grad[0] = float("-inf")
        theirs.scale(torch.ones(()))  # GradScaler sets itself up on its first scale()
        _drive(ours, sgd_a, [a], [grad], ours.get_scale)
        _drive(theirs, sgd_b, [b], [grad], theirs.get_scale)
        assert ours.get_scale() == theirs.get_scale(), step
        assert ours.growth_tracker == theirs._get_growth_tracker(), step
        assert torch.equal(a, b), step
    assert ours.scale(torch.tensor(2.0)).item() == 2 * ours.get_scale()


def test_the_default_scaler_grows_after_2000_good_steps_and_backs_off_on_an_overflow():
    scaler = amp.LossScaler()
    assert scaler.get_scale() == 2.0**16
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=1.0)
    for _ in range(1999):
        _drive(scaler, optimizer, [weight], [torch.ones(1)], scaler.get_scale)
    assert scaler.get_scale() == 2.0**16 and scaler.growth_tracker == 1999
    _drive(scaler, optimizer, [weight], [torch.ones(1)], scaler.get_scale)
    assert scaler.get_scale() == 2.0**17 and scaler.growth_tracker == 0
    moved = weight.clone()
    _drive(scaler, optimizer, [weight], [torch.tensor([float("inf")])], scaler.get_scale)
    assert scaler.get_scale() == 2.0**16 and torch.equal(weight, moved)


def test_fp16_fate_counts_each_boundary_as_the_cast_does():
    edges = torch.tensor([2.0**-25, 1.5 * 2.0**-25, 2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-24,
                          65519.0, 65520.0, 0.0, 1.0])
    underflow, subnormal, overflow = amp.fp16_fate(edges)
    assert (underflow, subnormal, overflow) == (1 / 8, 2 / 8, 1 / 8)
    assert amp.fp16_fate(edges, 2.0**-3) == (2 / 8, 2 / 8, 0.0)  # both smallest now 0


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_format_limits_are_torch_finfo(name):
    limits = amp.format_limits(name)
    info = torch.finfo({"fp32": torch.float32, "bf16": torch.bfloat16,
                        "fp16": torch.float16}[name])
    assert limits["max"] == info.max and limits["min_normal"] == info.tiny
    assert limits["epsilon"] == info.eps and limits["min_subnormal"] == info.smallest_normal \
        * info.eps


def test_fp8_limits_are_torch_finfo():
    for name, dtype in (("fp8 e4m3", torch.float8_e4m3fn), ("fp8 e5m2", torch.float8_e5m2)):
        limits, info = amp.format_limits(name), torch.finfo(dtype)
        assert limits["max"] == info.max and limits["min_normal"] == info.tiny
        assert limits["epsilon"] == info.eps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_train_step_learns_in_each_dtype_with_fp32_weights(dtype, one_thread):
    x, y = amp.teacher_task(512, 16, 8, device=DEVICE)
    model = amp.mlp(16, 32, 2, 8, device=DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = amp.LossScaler() if dtype == torch.float16 else None
    losses = [amp.train_step(model, optimizer, scaler, torch.nn.functional.cross_entropy,
                             x, y, dtype) for _ in range(30)]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < 0.9 * losses[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())
