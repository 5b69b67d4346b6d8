"""Lab 00 graded: numeric answers in any real-number type, never NaN; a timer passes only
if it really measures, on a quiet host or a busy one."""

import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from rooflab.autograder import check

COSTS = {
    "roofline/cost_vector_add": lambda n, b: (n, 3 * n * b),
    "roofline/cost_softmax": lambda r, c, b: (5 * r * c, 2 * r * c * b),
    "roofline/cost_matmul": lambda m, n, k, b: (2 * m * n * k, (m * k + k * n + m * n) * b),
    "roofline/cost_attention": lambda b, h, s, d, size, causal: (
        4 * b * h * s * s * d // (2 if causal else 1), 4 * b * h * s * d * size),
}


def floor(flops, nbytes, peak, bandwidth):
    compute, memory = flops / peak, nbytes / bandwidth
    return max(compute, memory), "compute" if compute >= memory else "memory"


def grade(problem_id, candidate, seed=None):
    return check(problem_id, candidate, show=False, raise_on_failure=False, seed=seed)


# --- numbers --------------------------------------------------------------------------------

@pytest.mark.parametrize("problem_id", COSTS)
@pytest.mark.parametrize("wrap", [int, float, np.int64, np.float64, torch.tensor,
                                  lambda x: torch.tensor([x]), np.array],
                         ids=["int", "float", "np.int64", "np.float64", "0-d tensor",
                              "1-element tensor", "0-d array"])
def test_a_right_count_passes_in_any_real_number_type(problem_id, wrap):
    answer = COSTS[problem_id]
    result = grade(problem_id, lambda *sizes: tuple(wrap(x) for x in answer(*sizes)))
    assert result.passed, result.message()


@pytest.mark.parametrize("problem_id", COSTS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan")], ids=str)
def test_nan_and_infinity_never_pass(problem_id, bad):
    result = grade(problem_id, lambda *sizes: (bad, bad))
    assert not result.passed
    assert "not a finite number" in result.message()


@pytest.mark.parametrize("problem_id", COSTS)
@pytest.mark.parametrize("bad", [True, "1000", None, [1, 2], torch.tensor([1.0, 2.0])],
                         ids=["bool", "str", "None", "list", "2-element tensor"])
def test_what_is_not_one_number_fails_and_says_so(problem_id, bad):
    result = grade(problem_id, lambda *sizes: (bad, bad))
    assert not result.passed and "not a number" in result.message()


def _lookup_table(problem_id, answer):
    """The answers to the problem's named cases, by their arguments: no formula at all."""
    from rooflab.autograder import get_problem

    named = [tuple(case.sizes.values()) for case in get_problem(problem_id).cpu_cases
             if case.sizes]
    table = {sizes: answer(*sizes) for sizes in named}
    return lambda *sizes: table.get(tuple(sizes), table[named[0]])


@pytest.mark.parametrize("problem_id", [*COSTS, "roofline/time_floor"])
def test_a_table_of_the_named_cases_fails_and_the_formula_passes_for_every_seed(problem_id):
    answer = COSTS.get(problem_id, floor)
    table = _lookup_table(problem_id, answer)
    for seed in range(20):
        cheat = grade(problem_id, table, seed=seed)
        assert not cheat.passed, seed
        assert "for " in cheat.causes[0] and "expected" in cheat.causes[0], cheat.causes
        right = grade(problem_id, answer, seed=seed)
        assert right.passed, (seed, right.message())


def test_time_floor_takes_numpy_and_tensors_and_rejects_nan():
    assert grade("roofline/time_floor", floor).passed
    as_tensor = grade("roofline/time_floor", lambda *a: (torch.tensor(floor(*a)[0]),
                                                         floor(*a)[1]))
    assert as_tensor.passed, as_tensor.message()
    assert grade("roofline/time_floor", lambda *a: (np.float64(floor(*a)[0]),
                                                   floor(*a)[1])).passed
    result = grade("roofline/time_floor", lambda *a: (math.nan, floor(*a)[1]))
    assert not result.passed and "seconds: got nan, not a finite number" in result.message()


# --- the timer ------------------------------------------------------------------------------

def honest(launch, synchronize, warmup=5, runs=15):
    """A right timer, smaller than the lab's (5 warm-up runs, median of 15)."""
    for _ in range(warmup):
        launch()
    synchronize()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        launch()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def no_synchronize(launch, synchronize):
    start = time.perf_counter()
    launch()
    seconds = time.perf_counter() - start
    synchronize()
    return seconds


def mean_of_everything(launch, synchronize):
    start = time.perf_counter()
    for _ in range(20):
        launch()
    synchronize()
    return (time.perf_counter() - start) / 20


def reads_the_stand_in(launch, synchronize):
    return launch.__self__.kernel_s


@pytest.mark.cpu("the stand-in GPU")
@pytest.mark.parametrize("constant", [2e-3, 3.8e-3, 6e-3])
def test_a_timer_that_returns_a_constant_never_passes(constant):
    for seed in range(20):
        assert not grade("roofline/timer", lambda launch, sync: constant, seed=seed).passed


@pytest.mark.cpu("the stand-in GPU")
@pytest.mark.parametrize("candidate, words", [
    (no_synchronize, "far too fast"),
    (mean_of_everything, "too slow"),
    (reads_the_stand_in, "raised AttributeError"),
])
def test_a_timer_that_does_not_measure_fails_with_its_cause(candidate, words):
    result = grade("roofline/timer", candidate)
    assert not result.passed
    assert words in result.message()


@pytest.mark.cpu("the stand-in GPU")
def test_an_honest_timer_passes_every_seed_and_in_any_number_type():
    for seed in range(20):
        result = grade("roofline/timer", honest, seed=seed)
        assert result.passed, (seed, result.message())
    as_tensor = grade("roofline/timer", lambda *a: torch.tensor(honest(*a)))
    assert as_tensor.passed, as_tensor.message()


def held_up_after_launch(launch, synchronize):
    """A right timer on a host that stalls between launch and synchronize (descheduled, or
    waiting for the GIL): the kernel is done before synchronize is called."""
    return honest(lambda: (launch(), time.sleep(4e-3)), synchronize)


@pytest.mark.cpu("the stand-in GPU")
def test_a_timer_held_up_between_launch_and_synchronize_is_right():
    # It measures the stall with the kernel, and so must the answer it is compared with.
    for seed in range(3):
        result = grade("roofline/timer", held_up_after_launch, seed=seed)
        assert result.passed, (seed, result.message())


@pytest.mark.cpu("the stand-in GPU")
def test_an_honest_timer_passes_on_a_busy_host():
    # Two spinning processes per core: every thread of the check waits its turn.
    spin = [sys.executable, "-c", "while True: pass"]
    busy = [subprocess.Popen(spin) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.3)  # let them start spinning
        for seed in range(5):
            result = grade("roofline/timer", honest, seed=seed)
            assert result.passed, (seed, result.message())
    finally:
        for process in busy:
            process.kill()
            process.wait()
