"""Lab 07 graded where a right-looking answer used to slip through, or a right one used to
fail: a bf16 copy that rounds ties away from zero, a scaler that scales the learning rate
instead of the gradients, an unscale by division, and a flag stored by every program that
finds an inf. The same verdict whatever the seed."""

import dataclasses

import mutants
import pytest
import torch
from mutants import grade, only

from rooflab.autograder import get_problem
from rooflab.autograder.problems.amp import adamw, scaling
from rooflab.kernels import amp


def causes_by_seed(spec, candidate, seeds=range(20)) -> list[str]:
    """Each seed's cause ("" when right), the first of the problem's cases, from the
    problem's own inputs, run, reference and comparison: the answer's verdict, which
    ``check`` reaches the same way (one ``check`` per test shows that), without its
    watch and trace, which cost seconds a run."""
    device = torch.device("cpu")
    causes = []
    for seed in seeds:
        cause = ""
        for index, case in enumerate(spec.cpu_cases):  # as check seeds them
            generator = torch.Generator(device=device).manual_seed(seed + index)
            inputs = spec.make_inputs(case, generator, device)
            output = spec.invoke(candidate, inputs)
            reference = spec.reference(*(x.double() if isinstance(x, torch.Tensor)
                                         and x.is_floating_point() else x for x in inputs))
            cause = cause or spec.compare(output, reference)
        causes.append(cause)
    return causes


# --- amp/fused_adamw: ties in the bf16 copy --------------------------------------------------

HALF_AWAY = [("    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16\n",
              "    rounded = (bits + 0x8000) >> 16\n")]


@pytest.fixture(scope="module")
def half_away(tmp_path_factory):
    return mutants.mutant(tmp_path_factory.mktemp("amp_ties"), "amp", *HALF_AWAY,
                          name="mutant_amp_half_away")


def test_every_adamw_case_holds_bf16_ties_that_a_step_without_decay_keeps():
    spec = get_problem("amp/fused_adamw")
    generator = torch.Generator().manual_seed(0)
    for case in spec.cpu_cases:  # the GPU's cases are made by the same code
        (state,) = spec.make_inputs(case, generator, torch.device("cpu"))
        start = state.initial
        bits = start["param"].view(torch.int32)
        # Ties the step keeps when it does not decay: no gradient, no moments.
        kept = ((bits & 0xFFFF) == 0x8000) & (start["exp_avg"] == 0) & (start["exp_avg_sq"] == 0)
        kept &= start["grad"].float() == 0
        even = kept & ((bits >> 16) & 1 == 0)
        assert int(even.sum()) >= 2 and int((kept & ~even).sum()) >= 2, case.label
    assert {adamw.FEWER, adamw.NO_DECAY} <= {case.note for case in spec.cpu_cases
                                             if case.sizes.get("weight_decay") == 0.0}


def test_a_bf16_copy_rounding_ties_away_from_zero_fails_every_seed(half_away):
    spec = only("amp/fused_adamw", adamw.FEWER)
    result = grade(spec, half_away.fused_adamw)
    assert not result.passed and "rounded away from zero" in result.causes[0], result.causes
    for cause in causes_by_seed(spec, half_away.fused_adamw):
        assert "rounded away from zero" in cause, cause
    assert causes_by_seed(spec, amp.fused_adamw) == [""] * 20


# --- amp/fused_adamw: the flag, stored by every program that finds an inf -------------------

SAME_VALUE = [("        tl.atomic_max(found_ptr, 1.0)\n",
               "        tl.store(found_ptr, 1.0)  # every finder stores the same 1.0\n")]
# Every program stores its own verdict, 0.0 or 1.0: a later block's 0.0 can hide an inf.
OWN_VERDICT = [("    if tl.sum(bad.to(tl.int32), axis=0) > 0:\n", "    if True:\n"),
               ("        tl.atomic_max(found_ptr, 1.0)\n",
                "        found = (tl.sum(bad.to(tl.int32), axis=0) > 0).to(tl.float32)\n"
                "        tl.store(found_ptr, found)\n")]


def test_a_plain_store_of_the_same_flag_from_many_programs_passes(tmp_path):
    mutant = mutants.mutant(tmp_path, "amp", *SAME_VALUE, name="mutant_amp_same_flag")
    result = grade(only("amp/fused_adamw", adamw.EVERYWHERE, adamw.NEG_INF), mutant.fused_adamw)
    assert result.passed, result.message()


@pytest.mark.cpu("the race is found in the interpreter's trace")
def test_programs_storing_different_flags_to_one_address_are_a_race(tmp_path):
    mutant = mutants.mutant(tmp_path, "amp", *OWN_VERDICT, name="mutant_amp_own_flag")
    # Two blocks, one -inf in the first: program 0 stores 1.0, program 1 then 0.0.
    result = grade(only("amp/fused_adamw", adamw.NEG_INF), mutant.fused_adamw)
    assert not result.passed
    assert "in nonfinite_kernel, programs" in result.causes[0], result.causes
    assert "different values" in result.causes[0], result.causes


# --- amp/loss_scaler: what the optimizer steps with ------------------------------------------


class LearningRateScaler(amp.LossScaler):
    """Leaves the gradients scaled and divides the learning rate by the scale instead: the
    same SGD step without weight decay, up to rounding; not with it."""

    def step(self, optimizer):
        self.found_inf = any(not bool(torch.isfinite(p.grad).all())
                             for group in optimizer.param_groups for p in group["params"])
        if not self.found_inf:
            rates = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] / self._scale
            optimizer.step()
            for group, rate in zip(optimizer.param_groups, rates, strict=True):
                group["lr"] = rate
        return not self.found_inf


class DividingScaler(amp.LossScaler):
    """Right: unscales by dividing by the scale (GradScaler multiplies by its fp32
    reciprocal, 1 or 2 fp32 roundings away when the scale is not a power of two)."""

    def step(self, optimizer):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        self.found_inf = any(not bool(torch.isfinite(g).all()) for g in grads)
        for g in grads:
            g.div_(self._scale)
        if not self.found_inf:
            optimizer.step()
        return not self.found_inf


def _short_bursts():
    """The case of factors 3 and 0.3 (a scale that is no power of two), cut to 12 steps:
    five good ones, five skipped, two good ones at a scale backed off."""
    spec = only("amp/loss_scaler", scaling.BURSTS)
    case = dataclasses.replace(spec.cpu_cases[0], sizes={**spec.cpu_cases[0].sizes,
                                                         "steps": 12})
    return dataclasses.replace(spec, cpu_cases=[case], gpu_cases=[case])


def test_scaling_the_learning_rate_fails_and_dividing_passes_every_seed():
    spec = _short_bursts()
    cheat = grade(spec, LearningRateScaler)
    assert not cheat.passed and "scaled the learning rate" in cheat.causes[0], cheat.causes
    assert grade(spec, DividingScaler).passed
    for cause in causes_by_seed(spec, LearningRateScaler):
        assert "scaled the learning rate instead of unscaling the gradients" in cause, cause
    assert causes_by_seed(spec, DividingScaler) == [""] * 20


class InverseScaleOptimizer(amp.LossScaler):
    """Steps with scaled gradients, the learning rate and the weight decay both changed so
    that SGD's weights come out the same: the optimizer never sees unscaled gradients."""

    def step(self, optimizer):
        self.found_inf = any(not bool(torch.isfinite(p.grad).all())
                             for group in optimizer.param_groups for p in group["params"])
        if not self.found_inf:
            saved = [(group["lr"], group["weight_decay"]) for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] /= self._scale
                group["weight_decay"] *= self._scale
            optimizer.step()
            for group, (lr, decay) in zip(optimizer.param_groups, saved, strict=True):
                group["lr"], group["weight_decay"] = lr, decay
        return not self.found_inf


def test_an_optimizer_that_never_sees_unscaled_gradients_fails():
    result = grade(_short_bursts(), InverseScaleOptimizer)
    assert not result.passed
    assert "the optimizer stepped with gradients" in result.causes[0], result.causes
