"""The course's own solutions against their own problems: right in both worlds (on a CPU,
those no solved notebook checks), and on a GPU fast enough to pass each bar with a margin
of at least 10% of the bar."""

import re
from pathlib import Path

import pytest
import torch

from rooflab.autograder import all_problems, check
from rooflab.autograder.checking.candidate import load_function
from rooflab.autograder.device import cuda

BOOK = Path(__file__).resolve().parents[1] / "book"
WITH_SOLUTION = [spec for spec in all_problems() if spec.solution]
TIMED = [spec for spec in WITH_SOLUTION if spec.timed]
MARGIN = 1.1  # a bar the solution only just reaches is a bar a learner cannot trust
# The problems a lab's check cells check: `make test` runs every solved notebook
# (solutions/, built from these masters), whose checks run the course's code and fail the
# cell if it does not pass. On a CPU that is the check below, already made; it runs here
# for the problems no lab checks, and on a GPU for all, where it also times them.
IN_SOLVED_NOTEBOOKS = {problem for master in BOOK.glob("[0-9][0-9]_*.md")
                       for problem in re.findall(r'check\("([\w/]+)"', master.read_text())}
CHECKED_HERE = [spec for spec in WITH_SOLUTION
                if torch.cuda.is_available() or spec.id not in IN_SOLVED_NOTEBOOKS]


def _ids(specs):
    return [spec.id for spec in specs]


def test_every_kernel_problem_names_its_solution():
    missing = [spec.id for spec in all_problems() if spec.kernel and not spec.solution]
    assert not missing, f"problems without a solution in kernels/: {missing}"


def test_every_solution_is_checked_by_a_solved_notebook_or_here():
    assert {spec.id for spec in WITH_SOLUTION} <= IN_SOLVED_NOTEBOOKS | {
        spec.id for spec in CHECKED_HERE}
    assert IN_SOLVED_NOTEBOOKS <= {spec.id for spec in all_problems()}, \
        "a lab checks a problem that does not exist"


@pytest.mark.parametrize("spec", CHECKED_HERE, ids=_ids(CHECKED_HERE))
def test_solution_is_correct(spec):
    if spec.kernel == "cupy" and not (torch.cuda.is_available() and not cuda.cupy_missing()):
        pytest.skip("CUDA C runs on a GPU with CuPy only (compile-checked elsewhere)")
    result = check(spec, load_function(spec.solution), show=False, raise_on_failure=False,
                   measure=False)
    assert result.passed, result.message()


@pytest.mark.gpu
@pytest.mark.parametrize("spec", TIMED, ids=_ids(TIMED))
def test_solution_reaches_its_bar_with_margin(spec):
    if spec.kernel == "cupy" and cuda.cupy_missing():
        pytest.skip("CuPy is not installed")
    result = check(spec, load_function(spec.solution), show=False, raise_on_failure=False)
    assert result.passed, result.message()
    perf = result.performance
    assert perf is not None and perf.measured, result.message()
    where = f"{spec.id} at {perf.case.label}: {perf.line}"
    assert perf.fraction >= MARGIN * spec.levels.passing, \
        f"{where}: {perf.fraction:.0%} of roofline, bar {spec.levels.passing:.0%} + 10%"
    if spec.at_least_vs_baseline:
        assert perf.vs_baseline >= MARGIN * spec.at_least_vs_baseline, \
            f"{where}: {perf.vs_baseline:.2f}× {perf.baseline_name}, bar " \
            f"{spec.at_least_vs_baseline:g}× + 10%"
