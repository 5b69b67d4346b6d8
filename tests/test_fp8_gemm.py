"""Lab 07's last rung graded: amp/fp8_block_gemm passes right kernels written other ways,
fails the classic slips naming each, and fails the library's matmul on dequantised
operands; the same verdict whatever the seed."""

import mutants
import pytest
import torch
import triton
import triton.language as tl
from mutants import grade, only

from rooflab.autograder.problems.amp import fp8_gemm
from rooflab.kernels import amp

SPEC = "amp/fp8_block_gemm"


def _mutant(tmp_path, *edits):
    return mutants.mutant(tmp_path, "amp", *edits, name="mutant_amp_fp8_gemm")


# --- right answers written other ways ----------------------------------------------------------


@triton.jit
def _dequantise_then_dot(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K,
                         stride_am, stride_ak, stride_bk, stride_bn, stride_sam, stride_sak,
                         stride_sbk, stride_sbn, stride_cm, stride_cn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Scale the operands' tiles first (fp32), then one fp32 dot a K block, 128 × 128
    programs over C: the same sum, another order."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, 128)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, 128)):
        k = kb * 128 + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0).to(tl.float32)
        b = tl.load(b_ptr + k[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0).to(tl.float32)
        a_scale = tl.load(a_scale_ptr + rm * stride_sam + kb * stride_sak, mask=rm < M,
                          other=0.0)
        b_scale = tl.load(b_scale_ptr + kb * stride_sbk + pid_n * stride_sbn)
        acc += tl.dot(a * a_scale[:, None], b * b_scale, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def dequantise_then_dot(a, a_scale, b, b_scale):
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=torch.float32, device=a.device)
    _dequantise_then_dot[(triton.cdiv(m, 128), triton.cdiv(n, 128))](
        a, a_scale, b, b_scale, c, m, n, k, *a.stride(), *b.stride(), *a_scale.stride(),
        *b_scale.stride(), *c.stride(), BLOCK_M=128, BLOCK_N=128)
    return c


def test_operands_scaled_before_the_dot_in_other_tiles_pass():
    result = grade(SPEC, dequantise_then_dot)
    assert result.passed, result.message()


def test_the_course_kernel_with_small_tiles_passes(tmp_path):
    small = _mutant(tmp_path, ("block_m, block_n = (32, 64) if interpreter_enabled() else "
                               "(64, 128)", "block_m, block_n = 16, 32"))
    assert grade(SPEC, small.fp8_block_matmul).passed


# --- the classic slips, each named --------------------------------------------------------------


SLIPS = {
    "no scales": ([("acc += partial * a_scale[:, None] * b_scale", "acc += partial")],
                  "the scales were never applied"),
    "divided": ([("acc += partial * a_scale[:, None] * b_scale",
                  "acc += partial / a_scale[:, None] / b_scale")], "divided by the scales"),
    "summed first": ([("acc += partial * a_scale[:, None] * b_scale", "acc += partial"),
                      ("    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, "
                       "acc,",
                       "    acc = acc * a_scale[:, None] * b_scale\n"
                       "    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, "
                       "acc,")], "one scale for the whole sum"),
}


@pytest.mark.parametrize("name", SLIPS)
def test_the_classic_slips_are_named(tmp_path, name):
    edits, words = SLIPS[name]
    result = grade(only(SPEC, ""), _mutant(tmp_path, *edits).fp8_block_matmul)
    assert not result.passed
    assert any(words in cause for cause in result.causes), result.message()


def test_weight_scales_read_across_are_named(tmp_path):
    across = _mutant(tmp_path, ("b_scale_ptr + kb * stride_sbk + weight_column * stride_sbn",
                                "b_scale_ptr + weight_column * stride_sbk + kb * stride_sbn"))
    result = grade(only(SPEC, fp8_gemm.WEIGHTS_AS_STORED), across.fp8_block_matmul)
    assert not result.passed
    assert any("[column block, K block]" in cause for cause in result.causes), result.message()


def test_a_k_tail_without_a_mask_fails(tmp_path):
    unmasked = _mutant(tmp_path, ("mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)",
                                  "mask=rm[:, None] < M, other=0.0)"),
                       ("mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)",
                        "mask=rn[None, :] < N, other=0.0)"))
    assert not grade(only(SPEC, "K not a multiple of 128"), unmasked.fp8_block_matmul).passed


def test_the_library_on_dequantised_operands_is_a_library_call():
    def dequantised(a, a_scale, b, b_scale):
        expand = fp8_gemm._expand
        return (a.float() * expand(a_scale, 1, a.shape)) @ (
            b.float() * expand(b_scale, 128, b.shape))

    result = grade(only(SPEC, ""), dequantised)
    assert not result.passed and "library" in result.message()


def test_rounding_through_bf16_fails_the_tolerance(tmp_path):
    rounded = _mutant(tmp_path, ("        acc += partial * a_scale[:, None] * b_scale\n",
                                 "        acc += (partial * a_scale[:, None] * b_scale)"
                                 ".to(tl.bfloat16).to(tl.float32)\n"))
    assert not grade(only(SPEC, ""), rounded.fp8_block_matmul).passed


def test_the_inputs_make_every_scale_matter():
    # Block magnitudes spread over 2^12: one scale for all would be far off everywhere.
    a, a_scale, b, b_scale = fp8_gemm._inputs(fp8_gemm.Case({"m": 8, "n": 256, "k": 512},
                                                            fp8_gemm.E4M3),
                                              torch.Generator().manual_seed(1),
                                              torch.device("cpu"))
    assert a_scale.shape == (8, 4) and b_scale.shape == (4, 2)
    assert float(a_scale.max() / a_scale.min()) > 16 and float(b_scale.max() / b_scale.min()) > 4


@pytest.mark.parametrize("seed", range(20))
def test_verdicts_do_not_depend_on_the_seed(tmp_path, seed):
    spec = only(SPEC, "")  # two K blocks: summing first shows
    assert grade(spec, amp.fp8_block_matmul, seed=seed).passed
    summed = _mutant(tmp_path, *SLIPS["summed first"][0])
    result = grade(spec, summed.fp8_block_matmul, seed=seed)
    assert not result.passed and "one scale for the whole sum" in result.causes[0]


# --- the comparison: the GPU's tolerance, the element scale, the slips on a GPU -------------


def _inputs(sizes: dict[str, int], note: str = "", transposed: tuple = (), seed: int = 0):
    case = fp8_gemm.Case(sizes, fp8_gemm.E4M3, note=note, transposed=transposed)
    return fp8_gemm._inputs(case, torch.Generator().manual_seed(seed), torch.device("cpu"))


def _truncated(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` with ``bits`` significant bits, rounded toward zero."""
    mantissa, exponent = torch.frexp(x)
    return torch.ldexp(torch.trunc(mantissa * 2.0**bits) / 2.0**bits, exponent)


def _hopper_like(a, a_scale, b, b_scale, step: int = 32) -> torch.Tensor:
    """The product as Hopper's fp8 tensor cores leave it (DeepSeek-V3 report, 3.3.2):
    within each 128-long K block the partial sum keeps 14 significant bits, truncated
    toward zero, after each MMA step of ``step`` products (32 in one fp8 wgmma); then the
    block's sum is scaled and added in fp32 (the kernel's promotion)."""
    a, b = a.double(), b.double()
    (m, k), n = a.shape, b.shape[1]
    out = torch.zeros(m, n, dtype=torch.float64)
    for block, start in enumerate(range(0, k, 128)):
        partial = torch.zeros(m, n, dtype=torch.float64)
        for j in range(start, min(k, start + 128), step):
            partial = _truncated(partial + a[:, j:j + step] @ b[j:j + step], 14)
        column_scales = b_scale[block].double().repeat_interleave(128)[:n]
        scaled = partial * a_scale[:, block:block + 1].double() * column_scales
        out = (out + scaled).float().double()  # the fp32 accumulator
    return out.float()


def _reference(inputs: tuple) -> dict:
    return fp8_gemm._reference(*(t.double() for t in inputs))


# The GPU cases with fewer rows and columns (the interpreter's time), the same K: the
# accumulation that loses bits is along K.
GPU_LIKE = {
    "ragged": ({"m": 100, "n": 200, "k": 1000}, "", ()),
    "as stored": ({"m": 64, "n": 256, "k": 2048}, fp8_gemm.WEIGHTS_AS_STORED, ("b",)),
    "outliers": ({"m": 32, "n": 256, "k": 4096}, fp8_gemm.OUTLIERS, ()),
}


@pytest.mark.parametrize("name", GPU_LIKE)
def test_hopper_like_partial_sums_pass_on_a_gpu_and_not_in_the_interpreter(name):
    inputs = _inputs(*GPU_LIKE[name])
    reference = _reference(inputs)
    out = _hopper_like(*inputs)
    product = reference["product"]
    # The emulated sums are really off: far more than fp32 sums of exact products.
    assert float((out.double() - product).norm() / product.norm()) > 3e-5
    assert fp8_gemm.compare_block_gemm(out, reference, on_gpu=True) == ""
    assert "worst element" in fp8_gemm.compare_block_gemm(out, reference, on_gpu=False)


@pytest.mark.parametrize("on_gpu", [True, False])
def test_the_exact_answer_rounded_to_bf16_fails_in_both_worlds(on_gpu):
    for sizes, note, transposed in GPU_LIKE.values():
        reference = _reference(_inputs(sizes, note, transposed))
        rounded = reference["product"].to(torch.bfloat16).float()
        cause = fp8_gemm.compare_block_gemm(rounded, reference, on_gpu=on_gpu)
        assert cause.startswith("output: relative error"), cause


def test_one_element_off_fails_on_a_gpu_where_the_norm_hides_it():
    inputs = _inputs(*GPU_LIKE["outliers"])
    reference = _reference(inputs)
    out = reference["product"].clone()
    out[16, 7] += 0.01 * reference["magnitude"][16, 7]  # the outliers' row
    cause = fp8_gemm.compare_block_gemm(out.float(), reference, on_gpu=True)
    assert "worst element off by 1.00e-02" in cause and "at (16, 7)" in cause, cause


def _scaled(a, a_scale, b, b_scale, how):
    """The slips' outputs, each summed as Hopper's tensor cores would."""
    ones_a, ones_b = torch.ones_like(a_scale), torch.ones_like(b_scale)
    if how == "no scales":
        return _hopper_like(a, ones_a, b, ones_b)
    if how == "divided":
        return _hopper_like(a, 1 / a_scale, b, 1 / b_scale)
    if how == "summed first":
        last = b_scale[-1].repeat_interleave(128)[:b.shape[1]]
        return _hopper_like(a, ones_a, b, ones_b) * a_scale[:, -1:] * last
    return _hopper_like(a, a_scale, b, b_scale.t())  # read across


GPU_SLIPS = {"no scales": "the scales were never applied",
             "divided": "divided by the scales",
             "summed first": "one scale for the whole sum",
             "read across": "[column block, K block]"}


@pytest.mark.parametrize("how", GPU_SLIPS)
def test_the_slips_summed_as_on_a_gpu_are_named_there(how):
    # Square weight scales (4 × 4), so that reading them across is still a scale.
    inputs = _inputs({"m": 48, "n": 512, "k": 512}, fp8_gemm.WEIGHTS_AS_STORED, ("b",))
    reference = _reference(inputs)
    cause = fp8_gemm.compare_block_gemm(_scaled(*inputs, how), reference, on_gpu=True)
    assert GPU_SLIPS[how] in cause and cause.startswith("output: relative error"), cause
    assert getattr(cause, "diagnosed", False)  # the card leads with a named slip


def test_the_form_is_checked_as_for_every_problem():
    from rooflab.autograder.evidence import poison

    reference = _reference(_inputs({"m": 8, "n": 128, "k": 256}))
    product = reference["product"]
    check = fp8_gemm.compare_block_gemm
    assert "dtype bf16" in check(product.to(torch.bfloat16), reference, on_gpu=True)
    assert "shape (8, 64)" in check(product[:, :64].float(), reference, on_gpu=True)
    assert "never written" in check(poison.fill(torch.empty(8, 128)), reference, on_gpu=True)
    nan = product.float()
    nan[3, 4] = float("nan")
    assert "NaN/inf" in check(nan, reference, on_gpu=True)
    assert check(product.float(), reference, on_gpu=True) == ""


def test_the_gpu_tolerances_replace_the_cpu_s_on_a_gpu_only():
    spec = fp8_gemm.PROBLEM
    assert spec.tolerance(torch.float32, on_gpu=True) == fp8_gemm.GPU_TOLERANCE
    assert spec.tolerance(torch.float32, on_gpu=False) == fp8_gemm.CPU_TOLERANCE


# --- the benchmark ------------------------------------------------------------------------------


def test_the_bench_workloads_compute_one_product_and_are_placed_on_the_fp8_roof():
    from rooflab.autograder.bench import amp as bench_amp
    from rooflab.autograder.device import roofline

    loads = [w for w in bench_amp.amp_workloads("cpu") if w.shape.startswith("fp8 gemm")]
    assert len(loads) == len(bench_amp.FP8_GEMMS)
    assert all(w.cost.dtype == "fp8" and len(w.kernels) == 3 for w in loads)
    # Small enough for the interpreter: the course's kernel and the bf16 baseline agree on
    # the bench's own inputs (torch._scaled_mm needs a GPU).
    inputs = bench_amp.fp8_gemm_inputs(64, 128, 256, "cpu")
    ours, base = bench_amp.rooflab_fp8_gemm(*inputs), bench_amp.torch_bf16_gemm(*inputs)
    assert float((ours - base).norm() / base.norm()) < 1e-2
    # Measured ceilings have no fp8 figure: the datasheet's stands in, and is named.
    measured = roofline.Ceilings(device="NVIDIA H100 80GB HBM3", source="measured",
                                 bandwidth=3.0e12, flops={"bf16": 700e12})
    assert roofline.compute_peak(measured, "fp8") == pytest.approx(1978.9e12)
    assert "datasheet's fp8 peak" in roofline.borrowed(measured, "fp8")
    assert roofline.borrowed(measured, "bf16") == ""
    with pytest.raises(KeyError):
        roofline.compute_peak(roofline.Ceilings(device="a card of no datasheet",
                                                source="measured", bandwidth=1e12), "fp8")
