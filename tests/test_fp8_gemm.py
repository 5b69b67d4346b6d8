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
