"""Lab 07's failure messages name the real cause: a bias correction missing from one moment
only, gradients that accumulate in an fp16 run whose scale goes wrong, a step that
bypasses the scaler, the case whose failure names its cause leading the card, and no talk
of an interpreter or a prediction on the card of a plain-Python exercise."""

import mutants
import pytest
import torch
from mutants import grade, only

from rooflab.autograder import CheckResult, check
from rooflab.autograder.checking.result import html
from rooflab.autograder.evidence.compare import CaseResult, Comparison
from rooflab.autograder.problem import Case
from rooflab.autograder.problems.amp import adamw, scaling
from rooflab.autograder.problems.amp.common import Diagnosis
from rooflab.kernels import amp

FIRST = "the first step: bias corrections at their largest"

# --- amp/fused_adamw: one moment without its bias correction ---------------------------------

ONE_MOMENT = [
    ("v", ("    bias2_sqrt = math.sqrt(1 - beta2**step)\n", "    bias2_sqrt = 1.0\n"),
     "v is used without its bias correction (m has its own)"),
    ("m", ("    step_size = lr / (1 - beta1**step)\n", "    step_size = lr\n"),
     "m is used without its bias correction (v has its own)"),
]


@pytest.mark.parametrize("moment, edit, words", ONE_MOMENT, ids=[m[0] for m in ONE_MOMENT])
def test_a_bias_correction_missing_from_one_moment_is_named(tmp_path, moment, edit, words):
    mutant = mutants.mutant(tmp_path, "amp", edit, name=f"mutant_amp_no_{moment}_correction")
    result = grade(only("amp/fused_adamw", FIRST), mutant.fused_adamw, seed=5)
    assert not result.passed
    assert "param:" in result.causes[0] and words in result.causes[0], result.causes[0]


# --- amp/train_step: the slips the scale and the weights give away ---------------------------


def test_gradients_that_accumulate_in_an_fp16_run_are_named_not_the_order_of_calls(tmp_path):
    mutant = mutants.mutant(tmp_path, "amp", ("    optimizer.zero_grad(set_to_none=True)\n", ""),
                            name="mutant_amp_no_zero_grad")
    result = grade(only("amp/train_step", scaling.IN_FP16_SGD), mutant.train_step, seed=3)
    assert not result.passed
    assert "the scale is" in result.causes[0], result.causes[0]
    assert "the gradients accumulate from step to step" in result.causes[0], result.causes[0]
    assert "once each per step" not in result.causes[0]


def test_a_step_that_bypasses_the_scaler_is_not_called_accumulation(tmp_path):
    """Gradients left over from a step that unscaled them are 1 / scale of the next ones:
    a run without zero_grad then loses almost the same as a right one, and only the weights
    tell it from a step with the scaled gradients."""
    mutant = mutants.mutant(tmp_path, "amp", ("        scaler.step(optimizer)\n"
                                              "        scaler.update()\n",
                                              "        optimizer.step()\n"),
                            name="mutant_amp_bypass")
    result = grade(only("amp/train_step", scaling.IN_FP16_TINY), mutant.train_step, seed=3)
    assert not result.passed
    assert "stepped with the scaled gradients" in result.causes[0], result.causes[0]
    assert "accumulate" not in result.causes[0]
    right = grade(only("amp/train_step", scaling.IN_FP16_SGD, scaling.IN_FP16_TINY),
                  amp.train_step, seed=3)
    assert right.passed, right.message()


# --- the card: which case leads, and what it says it ran on ----------------------------------


def scale_in_the_overflow_only(grad, scale=1.0):
    """fp16_fate with the scale left out of the underflow and subnormal counts: wrong at
    every scale but 1, though only a scale below 1 (nothing overflows, scaled or not)
    shows the slip alone."""
    n = grad.numel()
    half = grad.to(torch.float16)
    underflow = int(((half == 0) & (grad != 0)).sum()) / n
    subnormal = int(((half != 0) & (half.abs() < 2**-14)).sum()) / n
    scaled = grad * scale
    overflow = int((scaled.to(torch.float16).isinf() & scaled.isfinite()).sum()) / n
    return underflow, subnormal, overflow


def test_the_card_leads_with_the_case_that_names_its_cause():
    result = check("amp/underflow", scale_in_the_overflow_only, show=False,
                   raise_on_failure=False, seed=3)
    assert not result.passed
    assert "GradScaler's initial scale" in [c.case.note for c in result.cases if not c.ok][0]
    assert "(a scale below 1)" in result.causes[0], result.causes[0]
    assert "without the scale" in result.causes[0], result.causes[0]


def _case(note: str, **found) -> CaseResult:
    return CaseResult(Case({"n": 8}, note=note), **found)


def test_a_diagnosis_outranks_values_off_and_a_traffic_finding_does_not():
    plain = _case("plain", comparison=Comparison(ok=False, cause="x: 3 of 8 values off"))
    traffic = _case("traffic", comparison=Comparison(ok=True), error="reads x 2.0 times")
    diagnosed = _case("diagnosed", comparison=Comparison(
        ok=False, cause=Diagnosis("x: 8 of 8 values off: the scale is missing")))
    result = CheckResult("amp/underflow", "CPU", 0, cases=[plain, traffic, diagnosed])
    assert result.worst_case is diagnosed
    result.cases = [plain, traffic]
    assert result.worst_case is plain


def test_a_plain_python_card_mentions_no_interpreter_and_no_prediction():
    result = check("amp/underflow", amp.fp16_fate, show=False, raise_on_failure=False)
    assert result.passed, result.message()
    for text in (result.line, html(result)):
        assert "plain Python, checked for correctness" in text
        assert "interpreter" not in text and "predicted" not in text
    kernel = CheckResult("amp/fused_adamw", "CPU (Triton interpreter): nothing timed", 0)
    assert kernel.setting == "CPU (Triton interpreter): nothing timed"


# --- amp/fused_adamw: a found-inf flag stored by every program --------------------------------

EVERY_PROGRAM_STORES = ("    if tl.sum(bad.to(tl.int32), axis=0) > 0:\n",
                        "    tl.store(found_ptr, (tl.sum(bad.to(tl.int32), axis=0) > 0).to("
                        "tl.float32))\n    if False:\n")


@pytest.mark.cpu("which programs stored what is read from the interpreter's trace")
def test_a_flag_stored_by_every_program_is_told_about_the_flag(tmp_path):
    mutant = mutants.mutant(tmp_path, "amp", EVERY_PROGRAM_STORES, name="mutant_amp_flag_store")
    result = grade(only("amp/fused_adamw", adamw.INF_LAST), mutant.fused_adamw, seed=5)
    assert not result.passed
    cause = result.causes[0]
    assert "found_ptr is one element" in cause and "tl.atomic_max" in cause, cause
    assert "overwrite what another found" in cause and "wrong way round" not in cause, cause
