"""Lab 07 graded, the second half: amp/fused_adamw and amp/fp8_quantize pass right
kernels written other ways, fail wrong and cheating ones, and name the classic slip when
the evidence shows it; the same verdict whatever the seed."""

import math

import mutants
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from mutants import grade, only

from rooflab.autograder import get_problem
from rooflab.autograder.problems.amp import adamw, fp8
from rooflab.kernels import amp

FIRST = "the first step: bias corrections at their largest"


def _mutant(tmp_path, *edits, name="mutant_amp_fused"):
    return mutants.mutant(tmp_path, "amp", *edits, name=name)


# --- amp/fused_adamw: right answers written other ways ---------------------------------------


@triton.jit
def _flag_blocks(grad_ptr, flags_ptr, n, BLOCK: tl.constexpr):
    """One count per block of the non-finite gradients in it (no atomics)."""
    block = tl.program_id(0)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(grad_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    finite = tl.abs(g) <= 3.4028234663852886e38  # False for inf and for NaN
    tl.store(flags_ptr + block, tl.sum((finite == 0).to(tl.int32), axis=0))


@triton.jit
def _adamw_torch_order(param_ptr, grad_ptr, m_ptr, v_ptr, copy_ptr, flags_ptr, found_ptr,
                       scale_ptr, n, blocks, lr, beta1, beta2, eps, weight_decay, bias1,
                       bias2, BLOCK: tl.constexpr, FLAGS: tl.constexpr):
    """AdamW in torch's order (decay first, lerp for m, the bias corrections applied to
    m and v), every program reading every block's flag."""
    slots = tl.arange(0, FLAGS)
    bad = tl.sum(tl.load(flags_ptr + slots, mask=slots < blocks, other=0), axis=0)
    if tl.program_id(0) == 0:
        tl.store(found_ptr, (bad > 0).to(tl.float32))
    if bad == 0:
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        g = g / tl.load(scale_ptr)
        w = tl.load(param_ptr + offsets, mask=mask) * (1 - lr * weight_decay)
        m = tl.load(m_ptr + offsets, mask=mask)
        m = m + (1 - beta1) * (g - m)
        v = beta2 * tl.load(v_ptr + offsets, mask=mask) + (1 - beta2) * (g * g)
        w = w - lr * (m / bias1) / (tl.sqrt(v / bias2) + eps)
        tl.store(param_ptr + offsets, w, mask=mask)
        tl.store(m_ptr + offsets, m, mask=mask)
        tl.store(v_ptr + offsets, v, mask=mask)
        tl.store(copy_ptr + offsets, amp.bf16_bits(w).to(tl.int16, bitcast=True), mask=mask)


def adamw_by_flags(param, grad, exp_avg, exp_avg_sq, param_bf16, scale, step, lr, beta1, beta2,
                   eps, weight_decay):
    n, block = param.numel(), 2048
    blocks = triton.cdiv(n, block)
    flags = torch.empty(blocks, dtype=torch.int32, device=param.device)
    found = torch.empty(1, dtype=torch.float32, device=param.device)
    _flag_blocks[(blocks,)](grad, flags, n, BLOCK=block)
    _adamw_torch_order[(blocks,)](param, grad, exp_avg, exp_avg_sq, param_bf16.view(torch.int16),
                                  flags, found, scale, n, blocks, lr, beta1, beta2, eps,
                                  weight_decay, 1 - beta1**step, 1 - beta2**step, BLOCK=block,
                                  FLAGS=triton.next_power_of_2(blocks))
    return found


def test_adamw_with_flags_per_block_and_torch_s_order_passes():
    result = grade("amp/fused_adamw", adamw_by_flags)
    assert result.passed, result.message()


# --- amp/fused_adamw: the classic slips ------------------------------------------------------


@triton.jit
def _one_pass(param_ptr, grad_ptr, m_ptr, v_ptr, copy_ptr, found_ptr, scale_ptr, n, decay,
              beta1, beta2, eps, step_size, bias2_sqrt, BLOCK: tl.constexpr):
    """One launch: each program checks its own block, and steps it if that is finite."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    bad = tl.sum(((g != g) | (tl.abs(g) > 3.4028234663852886e38)).to(tl.int32), axis=0)
    if bad > 0:
        tl.atomic_max(found_ptr, 1.0)
    else:
        g = g / tl.load(scale_ptr)
        m = beta1 * tl.load(m_ptr + offsets, mask=mask) + (1 - beta1) * g
        v = beta2 * tl.load(v_ptr + offsets, mask=mask) + (1 - beta2) * g * g
        w = tl.load(param_ptr + offsets, mask=mask) * decay
        w = w - step_size * m / (tl.sqrt(v) / bias2_sqrt + eps)
        tl.store(param_ptr + offsets, w, mask=mask)
        tl.store(m_ptr + offsets, m, mask=mask)
        tl.store(v_ptr + offsets, v, mask=mask)
        tl.store(copy_ptr + offsets, amp.bf16_bits(w).to(tl.int16, bitcast=True), mask=mask)


def adamw_one_pass(param, grad, exp_avg, exp_avg_sq, param_bf16, scale, step, lr, beta1, beta2,
                   eps, weight_decay):
    found = torch.zeros(1, device=param.device)
    block = 1024
    _one_pass[(triton.cdiv(param.numel(), block),)](
        param, grad, exp_avg, exp_avg_sq, param_bf16.view(torch.int16), found, scale,
        param.numel(), 1 - lr * weight_decay, beta1, beta2, eps, lr / (1 - beta1**step),
        math.sqrt(1 - beta2**step), BLOCK=block)
    return found


def test_one_pass_that_checks_only_its_own_block_is_named():
    result = grade(only("amp/fused_adamw", adamw.INF_LAST), adamw_one_pass)
    assert not result.passed
    assert "all before the first non-finite gradient" in result.causes[0], result.causes[0]
    assert "check the whole gradient first" in result.causes[0]
    finite = grade(only("amp/fused_adamw", FIRST, "step 1000, other betas"), adamw_one_pass)
    assert finite.passed, finite.message()  # right whenever nothing overflows


ADAMW_SLIPS = [
    ("no unscale", [("        g = g * (1.0 / tl.load(scale_ptr))  # unscale\n", "")], FIRST,
     "the gradient was not unscaled"),
    ("no bias correction", [("    step_size = lr / (1 - beta1**step)\n"
                             "    bias2_sqrt = math.sqrt(1 - beta2**step)\n",
                             "    step_size = lr\n    bias2_sqrt = 1.0\n")], FIRST,
     "without bias correction"),
    ("eps inside", [("m / (tl.sqrt(v) / bias2_sqrt + eps)",
                     "m / tl.sqrt(v / (bias2_sqrt * bias2_sqrt) + eps)")],
     adamw.SMALL_GRADS, "eps goes outside the square root"),
    ("no decay", [("        w = w * decay - step_size", "        w = w - step_size")], FIRST,
     "the weight decay is missing"),
    ("L2", [("        m = beta1 * m + (1 - beta1) * g\n",
             "        g = g + (1 - decay) * 1000.0 * w\n        m = beta1 * m + (1 - beta1) * g\n"),
            ("        w = w * decay - step_size", "        w = w - step_size")], FIRST,
     "Adam with L2"),
    ("NaN missed", [("bad = (g != g) | (tl.abs(g) > 3.4028234663852886e38)",
                     "bad = tl.abs(g) > 3.4028234663852886e38")], adamw.NAN_FIRST,
     "x != x finds it"),
]


@pytest.mark.parametrize("name, edits, note, words", ADAMW_SLIPS,
                         ids=[slip[0] for slip in ADAMW_SLIPS])
def test_the_classic_adamw_slips_are_named(tmp_path, name, edits, note, words):
    mutant = _mutant(tmp_path, *edits)
    result = grade(only("amp/fused_adamw", note), mutant.fused_adamw)
    assert not result.passed
    assert words in result.causes[0], result.causes[0]


FLOAT_COPY = [("        tl.store(bf16_ptr + offsets, bf16_bits(w).to(tl.int16, bitcast=True), "
               "mask=mask)", "        tl.store(bf16_ptr + offsets, w.to(tl.bfloat16), mask=mask)"),
              ("    adamw_kernel[grid](param, grad, exp_avg, exp_avg_sq, param_bf16.view("
               "torch.int16),", "    adamw_kernel[grid](param, grad, exp_avg, exp_avg_sq, "
               "param_bf16,")]


@pytest.mark.cpu("Triton's interpreter stores fp32 into bf16 by truncating; a GPU rounds")
def test_a_bf16_copy_stored_as_a_float_is_truncated_on_a_cpu_and_named(tmp_path):
    result = grade(only("amp/fused_adamw", FIRST), _mutant(tmp_path, *FLOAT_COPY).fused_adamw)
    assert "they are truncated" in result.causes[0], result.causes[0]


@pytest.mark.gpu
def test_a_bf16_copy_stored_as_a_float_rounds_on_a_gpu(tmp_path):
    result = grade("amp/fused_adamw", _mutant(tmp_path, *FLOAT_COPY).fused_adamw)
    assert result.passed, result.message()


# --- amp/fused_adamw: cheats and traffic -----------------------------------------------------


def test_the_pytorch_path_is_a_library_call():
    def torch_path(param, grad, exp_avg, exp_avg_sq, param_bf16, scale, step, lr, beta1,
                   beta2, eps, weight_decay):
        found = torch.zeros(1, device=param.device)
        g = grad.float()
        torch._amp_foreach_non_finite_check_and_unscale_([g], found, scale.reciprocal())
        if not found.item():
            torch._fused_adamw_([param], [g], [exp_avg], [exp_avg_sq], [],
                                [torch.tensor(float(step), device=param.device)], amsgrad=False,
                                lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay,
                                eps=eps, maximize=False)
            param_bf16.copy_(param)
        return found

    result = grade(only("amp/fused_adamw", FIRST), torch_path)
    assert not result.passed
    assert "calls the library (aten._amp_foreach_non_finite_check_and_unscale_" in \
        result.causes[-1]


@triton.jit
def _unscale_to_fp32(grad_ptr, out_ptr, scale_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    g = tl.load(grad_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, g / tl.load(scale_ptr), mask=mask)


@pytest.mark.cpu("bytes are counted in the interpreter's trace")
def test_an_fp32_copy_of_the_gradient_moves_too_many_bytes():
    def three_passes(param, grad, exp_avg, exp_avg_sq, param_bf16, scale, step, *hyper):
        unscaled = torch.empty(grad.shape, dtype=torch.float32, device=grad.device)
        _unscale_to_fp32[(triton.cdiv(grad.numel(), 4096),)](grad, unscaled, scale,
                                                            grad.numel(), BLOCK=4096)
        one = torch.ones(1, device=grad.device)
        return amp.fused_adamw(param, unscaled, exp_avg, exp_avg_sq, param_bf16, one, step,
                               *hyper)

    result = grade(only("amp/fused_adamw", adamw.ADAMW_TRAFFIC), three_passes)
    assert not result.passed
    assert "bytes a parameter, more than the 30" in result.causes[0], result.causes[0]


@pytest.mark.cpu("numpy reaches host tensors only; the trace shows who wrote the answer")
def test_a_step_computed_with_numpy_beside_a_kernel_fails():
    def numpy_step(param, grad, exp_avg, exp_avg_sq, param_bf16, scale, step, lr, beta1, beta2,
                   eps, weight_decay):
        found = torch.zeros(1)
        amp.nonfinite_kernel[(1,)](grad, found, 16, BLOCK=16)  # a kernel launched for show
        w, m, v = param.numpy(), exp_avg.numpy(), exp_avg_sq.numpy()
        g = grad.numpy().astype(np.float64) / float(scale.numpy()[0])
        m[:] = beta1 * m + (1 - beta1) * g
        v[:] = beta2 * v + (1 - beta2) * g * g
        w[:] = w * (1 - lr * weight_decay) - lr / (1 - beta1**step) * m / (
            np.sqrt(v / (1 - beta2**step)) + eps)
        bits = w.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        param_bf16.view(torch.int16).numpy()[:] = rounded.astype(np.uint16).view(np.int16)
        return found

    result = grade(only("amp/fused_adamw", FIRST), numpy_step)
    assert not result.passed
    assert "param was not all written by the kernels" in result.causes[0], result.causes[0]


def test_the_adamw_cases_use_every_argument():
    for cases in (get_problem("amp/fused_adamw").cpu_cases,
                  get_problem("amp/fused_adamw").gpu_cases):
        assert {case.dtype for case in cases} == {torch.float16, torch.float32, torch.bfloat16}
        for name in ("step", "lr", "beta1", "beta2", "eps", "weight_decay", "scale"):
            assert len({case.sizes.get(name) for case in cases}) >= 2, name
        assert 0.0 in {case.sizes.get("weight_decay") for case in cases}
        notes = {case.note for case in cases}
        assert {adamw.INF_LAST, adamw.NAN_FIRST, adamw.NEG_INF,
                adamw.EVERYWHERE} <= notes
        assert any(case.sizes["n"] < 1024 for case in cases)
        assert sum(case.timed for case in cases) <= 1


def _step_100(n: int = 4096, seed: int = 0):
    """The timed case's maths at a CPU size: the inputs, and the float64 reference."""
    spec = get_problem("amp/fused_adamw")
    case = next(case for case in spec.gpu_cases if case.timed)
    case = type(case)({**case.sizes, "n": n}, case.dtype, note=case.note)
    (state,) = spec.make_inputs(case, torch.Generator().manual_seed(seed), torch.device("cpu"))
    return spec, state, spec.reference(state)


def _answer(state, reference, param):
    """An answer with the reference's moments and the given weights."""
    m, v = reference["exp_avg"].float(), reference["exp_avg_sq"].float()
    state["param"].copy_(param)
    state["exp_avg"].copy_(m)
    state["exp_avg_sq"].copy_(v)
    state["param_bf16"].copy_(param.to(torch.bfloat16))
    return (torch.zeros(1), state["param"], state["exp_avg"], state["exp_avg_sq"],
            state["param_bf16"], "guard bands, read in the check's own process")


def test_the_timed_call_reads_no_guard_band_and_the_compare_reads_them_all(monkeypatch):
    """A timed run repeats the problem's call: reading the six guard bands there (a host
    sync each) made the course's own kernel time at 38% of the copy roof on an H100,
    where the benchmark measured 93%. The compare reads them, once."""
    from rooflab.autograder.evidence import guard

    spec, state, _ = _step_100()
    read = []
    monkeypatch.setattr(guard.Guarded, "margins_hit", lambda self: read.append(self) or 0)
    output = spec.invoke(amp.fused_adamw, (state,))
    assert read == []
    assert spec.compare(output, spec.reference(state)) == ""
    assert len(read) == len(state.tensors) == 6


def test_a_weight_off_at_step_100_is_not_blamed_on_a_bias_correction():
    """At step 100, 1 - beta1**step is 0.99997: a step without m's correction is all but
    the right one, so a weight that is off (by far more than rounding) says nothing of
    the correction, and the message must not name it."""
    spec, state, reference = _step_100()
    param = reference["param"].float().clone()
    param[7] += 1e-3 * param[7].abs() + 1e-6
    message = spec.compare(_answer(state, reference, param), reference)
    assert message.startswith("param: 1 of 4096 values off"), message
    assert "correction" not in message


def test_weights_whose_moment_cancels_are_held_to_the_rounding_of_its_terms():
    """Where beta1 * m and (1 - beta1) * g all but cancel, beta1 held in fp32 (as every
    kernel holds it) moves the step by a few roundings of those terms; the inputs hold
    such weights on every seed. An answer off by that much passes; one off by 30 times
    that much fails."""
    spec, state, reference = _step_100()
    h, start = state.hyper, state.initial
    unscaled = start["grad"].double() / float(start["scale"])
    cancelled = ((h["beta1"] * start["exp_avg"].double()
                  + (1 - h["beta1"]) * unscaled).abs()
                 < 1e-2 * ((1 - h["beta1"]) * unscaled).abs())
    assert int(cancelled.sum()) >= 4096 // 64
    # beta1 as an fp32 kernel holds it: the step computed from it, in float64.
    beta1 = float(np.float32(h["beta1"]))
    m = beta1 * start["exp_avg"].double() + (1 - beta1) * unscaled
    v = reference["exp_avg_sq"]
    t = state.step
    step = (h["lr"] / (1 - h["beta1"] ** t) * m
            / ((v / (1 - h["beta2"] ** t)).sqrt() + h["eps"]))
    fp32_beta = start["param"].double() * (1 - h["lr"] * h["weight_decay"]) - step
    off = fp32_beta - reference["param"]
    assert float(off[cancelled].abs().max()) > 0
    assert spec.compare(_answer(state, reference, fp32_beta.float()), reference) == ""
    worse = (reference["param"] + 30 * off).float()
    assert spec.compare(_answer(state, reference, worse), reference).startswith("param:")


@pytest.mark.parametrize("seed", range(20))
def test_adamw_verdicts_do_not_depend_on_the_seed(seed):
    spec = only("amp/fused_adamw", adamw.INF_LAST, adamw.SMALL_GRADS)
    assert "all before the first non-finite gradient" in grade(spec, adamw_one_pass,
                                                               seed=seed).causes[0]
    assert grade(spec, amp.fused_adamw, seed=seed).passed


# --- amp/fp8_quantize ------------------------------------------------------------------------


@triton.jit
def _fp8_partial(x_ptr, scale_ptr, q_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    """Store the fp8 values through an fp8 pointer, and each block's amax apart."""
    block = tl.program_id(0)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    code = amp.e4m3_bits(x * tl.load(scale_ptr))
    tl.store(q_ptr + offsets, code.to(tl.float8e4nv, bitcast=True), mask=mask)
    tl.store(partial_ptr + block, tl.max(tl.where(mask, tl.abs(x), 0.0), axis=0))


@triton.jit
def _max_of(partial_ptr, out_ptr, count, BLOCK: tl.constexpr):
    slots = tl.arange(0, BLOCK)
    tl.store(out_ptr, tl.max(tl.load(partial_ptr + slots, mask=slots < count, other=0.0), 0))


def fp8_with_partial_maxima(x, scale):
    n, block = x.numel(), 1024
    blocks = triton.cdiv(n, block)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    partial = torch.empty(blocks, dtype=torch.float32, device=x.device)
    amax = torch.empty(1, dtype=torch.float32, device=x.device)
    _fp8_partial[(blocks,)](x, scale, q, partial, n, BLOCK=block)
    _max_of[(1,)](partial, amax, blocks, BLOCK=triton.next_power_of_2(blocks))
    return q, amax


def test_fp8_with_an_fp8_pointer_and_partial_maxima_passes():
    result = grade("amp/fp8_quantize", fp8_with_partial_maxima)
    assert result.passed, result.message()


FP8_STORE = "    tl.store(q_ptr + offsets, e4m3_bits(x * tl.load(scale_ptr)), mask=mask)\n"
FP8_AMAX = "    tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0))\n"
FP8_SLIPS = [
    ("divided", [(FP8_STORE, FP8_STORE.replace("x * tl.load", "x / tl.load"))],
     fp8.DELAYED, "x was divided by the scale"),
    ("scaled amax", [(FP8_AMAX, "    tl.atomic_max(amax_ptr, tl.max(tl.abs(x * "
                                "tl.load(scale_ptr)), axis=0))\n")],
     fp8.DELAYED, "the amax of the scaled values"),
    ("last block's amax", [(FP8_AMAX, "    if tl.program_id(0) == tl.num_programs(0) - 1:\n"
                                      "        tl.store(amax_ptr, tl.max(tl.abs(x), axis=0))\n")],
     fp8.OUTLIERS, "it misses some elements"),
]


@pytest.mark.parametrize("name, edits, note, words", FP8_SLIPS, ids=[s[0] for s in FP8_SLIPS])
def test_the_classic_fp8_slips_are_named(tmp_path, name, edits, note, words):
    mutant = _mutant(tmp_path, *edits)
    result = grade(only("amp/fp8_quantize", note), mutant.fp8_quantize)
    assert not result.passed
    assert words in result.causes[0], result.causes[0]


TRITON_CONVERSION = [(FP8_STORE, "    tl.store(q_ptr + offsets, (x * tl.load(scale_ptr)).to("
                                 "tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)\n")]


@pytest.mark.cpu("Triton's interpreter converts to fp8 without rounding; a GPU rounds")
def test_triton_s_conversion_is_wrong_in_the_interpreter_and_the_check_says_so(tmp_path):
    mutant = _mutant(tmp_path, *TRITON_CONVERSION)
    for seed in range(20):  # whether or not the draw holds exact ties
        result = grade(only("amp/fp8_quantize", fp8.CURRENT), mutant.fp8_quantize,
                       seed=seed)
        assert not result.passed
        assert "Triton's interpreter's conversion" in result.causes[0], (seed, result.causes)


@pytest.mark.gpu
def test_triton_s_conversion_passes_on_a_gpu(tmp_path):
    result = grade("amp/fp8_quantize", _mutant(tmp_path, *TRITON_CONVERSION).fp8_quantize)
    assert result.passed, result.message()


def test_the_pytorch_fp8_path_is_a_library_call():
    def torch_path(x, scale):
        return (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), \
            x.abs().max().float().reshape(1)

    result = grade(only("amp/fp8_quantize", fp8.CURRENT), torch_path)
    assert not result.passed and "calls the library" in result.causes[-1]


@pytest.mark.cpu("reads are counted in the interpreter's trace")
def test_current_scaling_reads_x_twice_and_fails_the_one_read():
    def current_scaling(x, scale):
        _, amax = amp.fp8_quantize(x, scale)  # a first pass for this tensor's own amax
        return amp.fp8_quantize(x, scale)[0], amax

    result = grade(only("amp/fp8_quantize", fp8.FP8_TRAFFIC), current_scaling)
    assert not result.passed
    assert "reads x 2.0 times" in result.causes[0], result.causes[0]


def test_the_fp8_cases_saturate_use_subnormals_and_signed_zeros():
    spec = get_problem("amp/fp8_quantize")
    for cases in (spec.cpu_cases, spec.gpu_cases):
        notes = {case.note for case in cases}
        assert {fp8.DELAYED, fp8.CURRENT, fp8.TINY_SCALE} <= notes
        assert any("m" in case.sizes for case in cases)  # a matrix
    generator = torch.Generator().manual_seed(0)
    x, scale = spec.make_inputs(next(c for c in spec.cpu_cases if c.note == fp8.DELAYED),
                                generator, torch.device("cpu"))
    assert float((x.float() * scale).abs().max()) > 448  # some values saturate
    assert torch.equal(x.view(-1)[:2].view(torch.int16),
                       torch.tensor([0, -32768], dtype=torch.int16))


@pytest.fixture(scope="module")
def scaled_amax(tmp_path_factory):
    return _mutant(tmp_path_factory.mktemp("amp_fp8_seeds"), *FP8_SLIPS[1][1],
                   name="seed_scaled_amax")


@pytest.mark.parametrize("seed", range(20))
def test_fp8_verdicts_do_not_depend_on_the_seed(seed, scaled_amax):
    spec = only("amp/fp8_quantize", fp8.DELAYED, fp8.TINY_SCALE)
    assert "the amax of the scaled values" in grade(spec, scaled_amax.fp8_quantize,
                                                    seed=seed).causes[0]
    assert grade(spec, amp.fp8_quantize, seed=seed).passed
