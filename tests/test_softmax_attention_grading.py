"""Labs 03 and 04 graded: softmax/fused, softmax/online, attention/flash_fwd and
attention/flash_bwd pass the course's kernels and name the cause of the classic bugs."""

from pathlib import Path

import mutants
import pytest
import torch
from mutants import grade

from rooflab.kernels import attention, softmax

KERNELS = Path(attention.__file__).parent


def _mutant(tmp_path, module: str, line: str, replacement: str):
    """The course's kernel module with one line changed: the bug a learner would write."""
    return mutants.mutant(tmp_path, module, (line, replacement))


def test_unstable_softmax_is_caught_and_told_to_subtract_the_max():
    result = grade("softmax/fused", softmax.softmax_unstable)
    assert not result.passed
    assert "large magnitudes" in result.causes[0]
    assert "subtract the row max before exp" in result.causes[0]


@pytest.mark.cpu("traffic is graded in the interpreter")
def test_three_pass_softmax_fails_on_traffic():
    result = grade("softmax/fused", softmax.softmax_naive)
    assert all(case.ok for case in result.cases)
    assert any("2.50× the compulsory bytes" in cause for cause in result.causes), result.causes


def test_softmax_from_the_library_is_reported():
    result = grade("softmax/fused", lambda x: torch.softmax(x, dim=-1))
    assert "calls the library (aten._softmax)" in result.causes[0]


def test_online_softmax_without_rescaling_is_caught(tmp_path):
    mutant = _mutant(tmp_path, "softmax", "d = d * tl.exp(m - shift) + ", "d = d + ")
    result = grade("softmax/online", mutant.softmax_online)
    assert not result.passed
    assert "not 1: the denominator is wrong" in result.causes[0]
    assert "rescale the running sum" in result.causes[0]


def test_flash_attention_without_rescaling_the_running_sum_is_caught(tmp_path):
    mutant = _mutant(tmp_path, "attention", "l_i = l_i * alpha + tl.sum(p, 1)",
                     "l_i = l_i + tl.sum(p, 1)")
    result = grade("attention/flash_fwd", mutant.flash_attention)
    assert not result.passed
    message = result.message()
    assert "with v = 1 every output must be 1" in message
    assert "rescale both the running sum l and the accumulator" in message


def test_flash_attention_from_the_library_is_reported():
    def sdpa(q, k, v, causal, sm_scale):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                scale=sm_scale)

    result = grade("attention/flash_fwd", sdpa)
    assert "calls the library (aten._scaled_dot_product" in result.causes[0]


def test_backward_is_graded_on_the_gradients(tmp_path):
    # dk without the softmax scale: the forward is right, the gradients are not.
    mutant = _mutant(tmp_path, "attention", "dk = dk * sm_scale  #", "dk = dk  #")
    assert grade("attention/flash_fwd", mutant.flash_attention).passed
    result = grade("attention/flash_bwd", mutant.flash_attention)
    assert not result.passed and "wrong on" in result.causes[0]


def test_a_backward_exercise_is_graded_inside_no_grad():
    with torch.no_grad():
        assert grade("attention/flash_bwd", attention.flash_attention).passed


def test_online_softmax_without_the_minus_inf_guard_is_caught(tmp_path):
    mutant = _mutant(tmp_path, "softmax", 'shift = tl.where(m_new == float("-inf"), 0.0, m_new)',
                     "shift = m_new")
    result = grade("softmax/online", mutant.softmax_online)
    assert not result.passed
    assert "masked (-inf) positions" in result.causes[0]
    assert "exp(-inf - (-inf)) = NaN" in result.causes[0]


@pytest.mark.cpu("block skipping is read from the interpreter's trace")
def test_causal_flash_attention_that_loads_every_key_block_fails(tmp_path):
    mutant = _mutant(tmp_path, "attention",
                     "never loaded\n        hi = tl.minimum((pid_m + 1) * BLOCK_M, N_K)",
                     "never loaded\n        hi = N_K")
    result = grade("attention/flash_fwd", mutant.flash_attention)
    assert all(case.comparison.ok for case in result.cases)  # right answers...
    assert not result.passed  # ...computed without skipping
    assert "loaded all of K for every block of queries" in result.causes[0]


def test_a_wrong_gradient_is_named(tmp_path):
    mutant = _mutant(tmp_path, "attention", "dk = dk * sm_scale  #", "dk = dk  #")
    cause = grade("attention/flash_bwd", mutant.flash_attention).causes[0]
    assert "wrong: dk (rel error" in cause and "dq and dv are right" in cause


def test_a_backward_that_ignores_an_explicit_sm_scale_fails(tmp_path):
    # The forward honours sm_scale; the backward silently falls back to 1/sqrt(d).
    mutant = _mutant(tmp_path, "attention", "do, ctx.causal, ctx.sm_scale)", "do, ctx.causal)")
    assert grade("attention/flash_fwd", mutant.flash_attention).passed
    result = grade("attention/flash_bwd", mutant.flash_attention)
    assert not result.passed
    assert "sm_scale_inv=5" in result.causes[0] and "wrong:" in result.causes[0]


@pytest.mark.parametrize("problem_id", ["attention/flash_fwd", "attention/flash_bwd"])
def test_every_argument_is_exercised_in_both_worlds(problem_id):
    from rooflab.autograder import get_problem

    spec = get_problem(problem_id)
    for cases in (spec.cpu_cases, spec.gpu_cases):
        assert any(c.sizes.get("causal") for c in cases)
        assert any(not c.sizes.get("causal") for c in cases)
        assert any("sm_scale_inv" in c.sizes for c in cases)
        assert any("sm_scale_inv" not in c.sizes for c in cases)


def test_a_fused_kernel_is_told_what_fixes_a_fused_kernel():
    import broken_kernels as bk

    result = grade("softmax/fused", bk.softmax_masked_lanes_count)
    message = result.message()
    assert "the denominator is wrong" in message and "Masked lanes must add nothing" in message
    assert "rescale" not in message and "running" not in message


def test_a_running_max_never_updated_is_not_called_an_overflow(tmp_path):
    mutant = _mutant(tmp_path, "softmax", "        m = m_new\n", "")
    result = grade("softmax/online", mutant.softmax_online)
    assert not result.passed
    assert "subtract the row max" not in result.message()
