"""A plain-Python exercise is answered by the learner's code, not the grader's.

A cost formula or a timer launches no kernel to watch: handing back the grader's own
reference, calling it however indirectly, or timing with the grader's own timer computes
right answers. The check watches the candidate's calls into the grader
(evidence/grader_calls.py) and fails each of these, while solutions written in other
ways, which call only what they were handed, pass."""

import concurrent.futures
import functools
import statistics
import sys
import threading
import time

import pytest
import torch
import triton
import triton.language as tl

from rooflab.autograder import check, get_problem
from rooflab.autograder.checking.engine import new_seed
from rooflab.autograder.evidence import grader_calls
from rooflab.autograder.evidence.recording import paused
from rooflab.autograder.problems.roofline import SimulatedGPU


def grade(problem: str, candidate, seed: int | None = None):
    return check(problem, candidate, seed=seed, show=False, raise_on_failure=False)


def reference(problem: str):
    return get_problem(problem).reference


# Honest answers, written otherwise than the course's solutions.
def cost_vector_add(n, dtype_bytes):
    return n, sum(n * dtype_bytes for _ in ("x", "y", "out"))


def time_floor(flops, nbytes, peak_flops, bandwidth):
    compute, memory = flops / peak_flops, nbytes / bandwidth
    return (compute, "compute") if compute > memory else (memory, "memory")


def measure(launch, synchronize):
    launch()  # warm-up
    synchronize()
    samples = []
    for _ in range(15):
        start = time.perf_counter_ns()
        launch()
        synchronize()
        samples.append((time.perf_counter_ns() - start) * 1e-9)
    return statistics.median(samples)


@pytest.mark.parametrize("problem, candidate", [
    ("roofline/cost_vector_add", cost_vector_add), ("roofline/time_floor", time_floor),
    ("roofline/timer", measure)])
def test_answers_of_the_learners_own_pass(problem, candidate):
    result = grade(problem, candidate)
    assert result.passed, result.message()
    assert result.grader_calls == []


def _in_a_thread(function):
    def candidate(*args):
        found = []
        worker = threading.Thread(target=lambda: found.append(function(*args)))
        worker.start()
        worker.join()
        return found[0]
    return candidate


def _in_a_pool(function):
    def candidate(*args):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(function, *args).result()
    return candidate


HIDING = {
    "itself": lambda ref: ref,
    "a lambda": lambda ref: (lambda *args: ref(*args)),
    "a partial": lambda ref: functools.partial(ref),
    "a thread": _in_a_thread,
    "a thread pool": _in_a_pool,
}
PLAIN = ["roofline/cost_vector_add", "roofline/cost_softmax", "roofline/cost_matmul",
         "roofline/cost_attention", "roofline/time_floor", "fsdp/plan", "amp/underflow"]


@pytest.mark.parametrize("how", HIDING)
@pytest.mark.parametrize("problem", PLAIN)
def test_the_graders_reference_handed_back_fails_however_it_is_called(problem, how):
    result = grade(problem, HIDING[how](reference(problem)))
    assert result.failed
    assert result.grader_calls, result.message()
    assert "calls the grader's own" in result.causes[0]
    assert reference(problem).__qualname__ in result.causes[0]


def _switched_off(function):
    def candidate(*args):
        import sys

        sys.setprofile(None)
        return function(*args)
    return candidate


def _switched_off_and_on(function):
    def candidate(*args):
        import sys

        watch = sys.getprofile()
        sys.setprofile(None)
        try:
            return function(*args)
        finally:
            sys.setprofile(watch)
    return candidate


def _threads_unwatched(function):
    def candidate(*args):
        threading.setprofile(None)
        return _in_a_thread(function)(*args)
    return candidate


def _in_a_made_up_file(function):
    """Code compiled under a file name of the grader's own instruments."""
    from rooflab.autograder.evidence import recording

    namespace = {"ref": function}
    exec(compile("def candidate(*args):\n    return ref(*args)\n", recording.__file__,
                 "exec"), namespace)
    return namespace["candidate"]


@pytest.mark.parametrize("how", [_switched_off, _switched_off_and_on, _threads_unwatched,
                                 _in_a_made_up_file])
def test_stepping_out_of_the_watch_fails(how):
    result = grade("roofline/cost_matmul", how(reference("roofline/cost_matmul")))
    assert result.failed, result.message()
    assert "the grader's" in result.causes[0]


@pytest.mark.parametrize("kind", ["a pool", "a thread"])
def test_a_worker_started_before_the_check_fails_it(kind):
    ref, jobs, answers = reference("roofline/cost_matmul"), [], []
    if kind == "a pool":
        pool = concurrent.futures.ThreadPoolExecutor(1)
        pool.submit(lambda: None).result()  # its worker thread now runs, unwatched

        def candidate(*args):
            return pool.submit(ref, *args).result()
    else:
        ready = threading.Event()

        def worker():
            while (job := jobs and jobs.pop()) or not ready.is_set():
                if job:
                    answers.append(ref(*job))
                time.sleep(0.001)

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()

        def candidate(*args):
            jobs.append(args)
            while not answers:
                time.sleep(0.001)
            return answers.pop()
    try:
        result = grade("roofline/cost_matmul", candidate)
    finally:
        if kind == "a pool":
            pool.shutdown()
        else:
            ready.set()
            thread.join()
    assert result.failed and "started before the check" in result.causes[0], \
        result.message()


def test_the_graders_open_parts_may_be_called():
    from rooflab.autograder.device import interpreter_enabled

    def cost_matmul(m, n, k, dtype_bytes):
        interpreter_enabled()  # a lab's own helper: the device, not an answer
        return 2 * m * n * k, (m * k + k * n + m * n) * dtype_bytes

    result = grade("roofline/cost_matmul", cost_matmul)
    assert result.passed, result.message()


def test_a_timer_that_asks_the_grader_for_the_time_fails():
    from rooflab.autograder.problems.roofline import _STAND_INS

    def peeks(launch, synchronize):  # the stand-in GPU knows its own time
        return _STAND_INS[launch].one_run_s()

    for candidate, name in [(reference("roofline/timer"), "_true_time"),
                            (peeks, "SimulatedGPU.one_run_s")]:
        result = grade("roofline/timer", candidate)
        assert result.failed and any(name in call for call in result.grader_calls), \
            result.message()


def test_calling_what_the_grader_handed_over_is_allowed():
    gpu = SimulatedGPU()
    watch_calls = grader_calls.allowed_code((gpu.launch, [{"gpu": gpu}]))
    assert id(SimulatedGPU.launch.__code__) in watch_calls
    assert id(SimulatedGPU.one_run_s.__code__) in watch_calls  # a method of an object handed


def test_a_class_that_takes_over_the_graders_methods_is_named():
    class Mine(SimulatedGPU):
        pass

    assert grader_calls.inherited(Mine) == ["rooflab.autograder.problems.roofline.SimulatedGPU"]
    assert grader_calls.inherited(dict) == [] and grader_calls.inherited(len) == []


def test_pausing_the_recorder_to_hide_library_work_fails():
    from rooflab.kernels.vector_add import vector_add

    def hides(x, y):
        out = vector_add(x, y)  # a real launch, for the look of it
        with paused():
            out.copy_(torch.add(x, y))
        return out

    result = grade("coalescing/vector_add", hides)
    assert result.failed
    assert "rooflab.autograder.evidence.recording.paused" in result.grader_calls


def test_the_same_verdict_for_20_seeds():
    cheat = HIDING["a lambda"](reference("roofline/cost_vector_add"))
    for seed in range(20):
        assert grade("roofline/cost_vector_add", cheat, seed=seed).failed
        assert grade("roofline/cost_vector_add", cost_vector_add, seed=seed).passed


def test_rooflab_check_fails_a_borrowed_reference_the_child_called_a_pass(tmp_path, capsys):
    """The candidate's module patches the child's engine so that its check passes; the
    child's report still names the grader's function it called, and the parent fails it."""
    from rooflab.autograder.cli import main

    cheat = tmp_path / "cheat.py"
    cheat.write_text(
        "import rooflab.autograder.checking.engine as engine\n"
        "from rooflab.autograder import get_problem\n"
        "engine._causes = lambda spec, result: []  # the child's verdict, patched\n"
        "cost = get_problem('roofline/cost_vector_add').reference\n")
    code = main(["check", "roofline/cost_vector_add", f"{cheat}:cost"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "calls the grader's own rooflab.autograder.problems.roofline" in out


def test_rooflab_grade_fails_a_record_that_passes_and_names_a_grader_call(tmp_path):
    from rooflab.autograder.grading.cells import Exercise
    from rooflab.autograder.grading.verdicts import grade_exercises

    exercise = Exercise("00-006", "roofline/cost_vector_add")
    record = {"cell": "00-006", "problem": exercise.problem_id, "seed": 5, "verdict": "PASS",
              "message": "PASS", "replaced": [], "grader_calls": ["x.reference"]}
    run = {"cells": [{"index": 3, "id": "00-006", "seconds": 0.1, "error": ""}]}
    [grade] = grade_exercises([exercise], run, [(record, tmp_path / "none.pt")], seed=5)
    assert grade.verdict == "FAIL" and "calls the grader's own x.reference" in grade.message


def test_a_timers_answers_are_checked_outside_too(tmp_path, capsys):
    """A timer's exact answer depends on its run, but another process can still tell an
    answer that is missing, or far from the time the stand-in GPU was made to take."""
    from rooflab.autograder.cli import main

    forger = tmp_path / "forger.py"  # a report of its own, and no answer
    forger.write_text(
        "import json, os, sys\n"
        "into = sys.argv[sys.argv.index('--into') + 1]\n"
        "json.dump({'verdict': 'PASS', 'line': 'PASS roofline/timer', 'message': 'PASS'},\n"
        "          open(os.path.join(into, 'report.json'), 'w'))\n"
        "os._exit(0)\n"
        "def measure(launch, synchronize):\n    return 0.0\n")
    assert main(["check", "roofline/timer", f"{forger}:measure"]) == 1
    assert "its answers never reached the grader" in capsys.readouterr().out

    from rooflab.autograder.checking.answers import save
    from rooflab.autograder.checking.isolated import recheck

    spec = get_problem("roofline/timer")
    for seed in range(20):
        save({i: 2.0 for i in range(3)}, tmp_path / "slow.pt")  # far too slow, every case
        assert "set to take" in recheck(spec, tmp_path / "slow.pt", seed)
    assert grade("roofline/timer", measure).passed


# --- inside a kernel launch, the lighter watch ------------------------------------------------

@triton.jit
def _peeks_at_the_grader(x_ptr):
    new_seed()  # run as Python by the interpreter: a call of the grader's closed code
    tl.store(x_ptr, 1.0)


@triton.jit
def _leaves_the_watch(x_ptr):
    sys.setprofile(None)
    tl.store(x_ptr, 1.0)


@pytest.mark.cpu("a kernel body is Python only in the interpreter")
@pytest.mark.parametrize("kernel, words", [
    (_peeks_at_the_grader, "calls the grader's own rooflab.autograder.checking.engine.new_seed"),
    (_leaves_the_watch, "ran out of the grader's watch (sys.setprofile)"),
])
def test_a_kernel_body_is_watched_during_its_launch(kernel, words):
    from mutants import only

    from rooflab.kernels import kmeans

    def fit(x, k, seed, init=None):
        kernel[(1,)](torch.zeros(1, device=x.device))
        return kmeans.fit(x, k, seed, init)

    result = check(only("kmeans/fit", "k = 1"), fit, show=False, raise_on_failure=False)
    assert result.failed and words in result.causes[0], result.causes
