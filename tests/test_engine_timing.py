"""The GPU half of check(): timing, roofline grading and the re-check after timing.

Runs on any machine: the device, the timer and the ceilings are replaced by stand-ins, so
what is tested is the engine's logic, not a GPU. The real thing is in the gpu-marked tests.
"""

import pytest
import torch

from rooflab.autograder import Case, Cost, Levels, Problem, check
from rooflab.autograder.checking import engine
from rooflab.autograder.device import Device, roofline
from rooflab.autograder.device.timing import Timing

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


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Never the user's cache: ceilings read and raised here live in a temporary folder."""
    monkeypatch.setenv("ROOFLAB_CACHE_DIR", str(tmp_path))
    return tmp_path


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


# --- a timing that beats the cached ceiling raises it -----------------------------------------

H200 = Device(kind="gpu", name="NVIDIA H200", torch_device="cpu", driver="0.0",
              l2_bytes=60 << 20)
MATMUL_COST = Cost(2 * 4096**3, 3 * 4096**2 * 2, "bf16")  # what the stand-in claims to do


def _as_matmul(**changes):
    from dataclasses import replace

    return replace(PROBLEM, id="test/negate_as_matmul", cost=lambda case: MATMUL_COST,
                   gpu_cases=[Case({"n": 100}), Case({"n": N}, timed=True)], **changes)


@pytest.fixture
def h200(monkeypatch):
    """A stand-in H200 with a bf16 ceiling cached below what the card reaches (672
    TFLOP/s, as one 8192³ timing measured it); its timer reports ``h200.rates`` in turn."""
    state = type("State", (), {"rates": []})()

    def time_gpu(fn):
        fn()
        return Timing(MATMUL_COST.flops / state.rates.pop(0), "do_bench")

    cached = roofline.Ceilings(H200.name, "measured", 4.25e12, {
        "fp32": 51.3e12, "tf32": 356e12, "fp16": 690e12, "bf16": 672e12}, driver="0.0",
        measured_at="2026-11-26T14:02:00+00:00")
    roofline.save(cached, H200)
    monkeypatch.setattr(engine.device_layer, "current", lambda: H200)
    monkeypatch.setattr(engine.device_layer, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(engine, "time_gpu", time_gpu)
    monkeypatch.setattr(roofline, "current", lambda: H200)
    return state


def test_the_library_beating_the_cached_ceiling_raises_it_and_grades_against_it(h200):
    h200.rates = [633e12, 714e12]  # the candidate, then the library on the same inputs
    problem = _as_matmul(baseline=torch.neg, baseline_name="torch.matmul",
                         at_least_vs_baseline=0.5)
    result = check(problem, lambda x: -x, show=False, raise_on_failure=False)
    assert result.passed, result.message()
    assert roofline.load_cached(H200).flops["bf16"] == pytest.approx(714e12)  # persisted
    (raised,) = roofline.load_cached(H200).raised
    assert raised.workload == "torch.matmul on n=4096 fp32" and raised.before == 672e12
    # 633 against the raised 714, not 94% against the stale 672.
    assert result.fraction == pytest.approx(633 / 714)
    assert "89% of roofline" in result.line
    assert ("672 TFLOP/s, was below what this card reaches: torch.matmul on n=4096 fp32 "
            "reached 714 TFLOP/s, 106% of it, so it was raised and cached") in result.line


def test_a_kernel_beating_the_cached_ceiling_raises_it_and_says_so(h200):
    h200.rates = [700e12]
    result = check(_as_matmul(), lambda x: -x, show=False, raise_on_failure=False)
    assert result.fraction == pytest.approx(1.0)
    assert "100% of roofline" in result.line
    assert ("your kernel for test/negate_as_matmul on n=4096 fp32 reached 700 TFLOP/s, 104% "
            "of it") in result.line
    assert roofline.load_cached(H200).flops["bf16"] == pytest.approx(700e12)


def test_a_kernel_wrong_after_timing_raises_nothing(h200):
    h200.rates = [900e12]
    cache = {}
    result = check(_as_matmul(), lambda x: cache.setdefault(x.numel(), -x), show=False,
                   raise_on_failure=False)
    assert "wrong after it" in result.causes[0]
    assert roofline.load_cached(H200).flops["bf16"] == pytest.approx(672e12)
