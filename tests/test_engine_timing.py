"""The GPU half of check(): timing, roofline grading and the re-check after timing.

Runs on any machine: the device, the timer and the ceilings are replaced by stand-ins, so
what is tested is the engine's logic, not a GPU. The real thing is in the gpu-marked tests.
"""

import pytest
import torch

from rooflab.autograder import Case, Cost, Levels, Problem, check, engine, roofline
from rooflab.autograder.device import Device
from rooflab.autograder.timing import Timing

N = 4096
CEILINGS = roofline.from_datasheet("H100 SXM")
FLOOR_S = 2 * N * 4 / CEILINGS.bandwidth  # negate reads x and writes out, fp32


def _inputs(case, gen, device):
    return (torch.randn(case.sizes["n"], generator=gen, device=device),)


PROBLEM = Problem(
    id="test/negate",
    title="negate",
    signature="(x: Tensor[n]) -> Tensor[n]",
    make_inputs=_inputs,
    reference=lambda x: -x,
    cost=lambda case: Cost(flops=0, bytes=2 * case.sizes["n"] * 4),
    cpu_cases=[Case({"n": 10})],
    gpu_cases=[Case({"n": 100}), Case({"n": N})],
    levels=Levels(passing=0.5, good=0.7, excellent=0.9),
    kernel=None,
)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A 'GPU' whose timer reports ``fake_gpu.seconds`` for every kernel."""
    state = type("State", (), {"seconds": FLOOR_S / 0.8, "calls": 0})()
    gpu = Device(kind="gpu", name="Stand-in H100", torch_device="cpu", driver="0.0")

    def time_gpu(fn):
        state.calls += 1
        fn()
        return Timing(state.seconds, "do_bench")

    monkeypatch.setattr(engine.device_layer, "current", lambda: gpu)
    monkeypatch.setattr(engine.device_layer, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(engine, "time_gpu", time_gpu)
    monkeypatch.setattr(engine.roofline, "ceilings", lambda: CEILINGS)
    return state


def grade(candidate):
    return check(PROBLEM, candidate, show=False, raise_on_failure=False)


def test_measured_fraction_and_level(fake_gpu):
    result = grade(lambda x: -x)
    assert result.passed, result.message()
    assert fake_gpu.calls == 1
    assert result.performance.case.sizes == {"n": N}  # the largest case is the timed one
    assert result.fraction == pytest.approx(0.8)
    assert result.performance.level == "good"
    assert result.bound == "memory"
    assert "80% of roofline [good]" in result.line
    assert result.mode == "GPU: Stand-in H100"


def test_too_slow_fails_and_names_the_bottleneck(fake_gpu):
    fake_gpu.seconds = FLOOR_S / 0.2
    result = grade(lambda x: -x)
    assert not result.passed
    assert "too slow: 20% of roofline, needs 50%" in result.causes[0]
    assert "memory-bound" in result.causes[0]


def test_answer_replayed_from_an_earlier_call_is_caught_after_timing(fake_gpu):
    cache = {}

    def replays(x):  # right the first time for each size, then returns a stale answer
        return cache.setdefault(x.numel(), -x)

    result = grade(replays)
    assert all(case.ok for case in result.cases)
    assert not result.passed
    assert "wrong after it" in result.causes[0]


def test_nothing_is_timed_when_the_answer_is_wrong(fake_gpu):
    result = grade(lambda x: x)
    assert not result.passed
    assert fake_gpu.calls == 0 and result.performance is None


def _with_baseline(at_least):
    from dataclasses import replace

    return replace(PROBLEM, id="test/negate_vs_library", baseline=torch.neg,
                   baseline_name="torch.neg", at_least_vs_baseline=at_least)


def test_speed_against_the_library_is_measured_on_the_same_inputs(fake_gpu):
    result = check(_with_baseline(0.5), lambda x: -x, show=False, raise_on_failure=False)
    assert result.passed, result.message()
    assert fake_gpu.calls == 2  # the candidate, then torch.neg
    assert result.performance.vs_baseline == pytest.approx(1.0)
    assert "1.00× torch.neg's speed" in result.line


def test_slower_than_asked_against_the_library_fails(fake_gpu):
    # The stand-in timer reports the same time for both: 1.0× is below a 1.5× target.
    result = check(_with_baseline(1.5), lambda x: -x, show=False, raise_on_failure=False)
    assert not result.passed
    assert "too slow against torch.neg: 1.00× its speed" in result.causes[-1]
    assert "needs 1.5×" in result.causes[-1]
