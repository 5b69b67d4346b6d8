"""Two ways into an exercise: from a blank cell (the signature alone) and scaffolded. The
build writes the blank cell, a check of an unwritten way stops nothing that the other way
can still pass, and the grader counts the better of the two."""

import ast
import json
from pathlib import Path

import pytest

from rooflab.autograder import check, passed, passing
from rooflab.autograder.course.build import from_scratch, inline, solution, stub
from rooflab.autograder.grading.cells import exercises, one_cell_each
from rooflab.autograder.grading.verdicts import Grade, best_of_each
from rooflab.kernels.vector_add import vector_add

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = "# rooflab-scratch: rooflab.kernels.vector_add:add_kernel,vector_add"


def unwritten(x, y, block=1024):
    raise NotImplementedError()


def test_the_blank_cell_has_the_signature_and_docstring_and_nothing_of_the_answer():
    learner = stub(inline(from_scratch(DIRECTIVE, learner=True)))
    tree = ast.parse(learner)
    [function] = tree.body
    assert function.name == "vector_add" and [a.arg for a in function.args.args] == [
        "x", "y", "block"]
    assert ast.get_docstring(function)
    assert "tl.load" not in learner and "add_kernel[" not in learner
    assert "# Write add_kernel here" in learner and "raise NotImplementedError()" in learner
    solved = solution(inline(from_scratch(DIRECTIVE, learner=False)))
    assert solved == solution(inline("# rooflab-inline: rooflab.kernels.vector_add:"
                                      "add_kernel,vector_add"))


def test_an_unwritten_way_stops_nothing_the_other_way_can_still_pass():
    blank = check("coalescing/vector_add", unwritten, scratch=True, show=False)
    assert blank.verdict == "NOT IMPLEMENTED" and "not written yet" in blank.causes[0]

    solved = check("coalescing/vector_add", vector_add, scratch=True, show=False)
    assert solved.passed and passing("coalescing/vector_add") is vector_add
    # The scaffolded cell run after it redefines the names, unwritten: that stops nothing,
    # and the charts still find the kernel that passed.
    after = check("coalescing/vector_add", unwritten, show=False)
    assert "solved from scratch above" in after.causes[0]
    assert passed("coalescing/vector_add") and passing("coalescing/vector_add") is vector_add

    # The blank cell run again unwritten: its names are stubs again, and nothing keeps
    # the pass it had (the scaffolded cell runs, and the charts take the course's kernel).
    check("coalescing/vector_add", unwritten, scratch=True, show=False)
    assert not passed("coalescing/vector_add") and passing("coalescing/vector_add") is None

    # An unwritten scaffolded cell with no from-scratch pass before it stops the run.
    def scaffolded(x, y, block=1024):
        return vector_add(x, y, block)

    check("coalescing/vector_add", scaffolded, show=False)  # passed, not from scratch
    with pytest.raises(AssertionError, match="not implemented yet"):
        check("coalescing/vector_add", unwritten, show=False)
    assert not passed("coalescing/vector_add") and passing("coalescing/vector_add") is None


def test_the_scaffolded_cell_is_skipped_once_solved_from_scratch():
    from IPython.core.interactiveshell import InteractiveShell

    from rooflab.autograder.checking import ways

    shell = InteractiveShell.instance()
    ways.register()
    shell.user_ns["vector_add"] = vector_add
    check("coalescing/vector_add", vector_add, scratch=True, show=False)
    skipped = shell.run_cell("%%scaffold coalescing/vector_add\nvector_add = None\n")
    assert skipped.success and shell.user_ns["vector_add"] is vector_add
    # Its check finds the function that passed from scratch, and does not run it again.
    again = check("coalescing/vector_add", vector_add, show=False)
    assert again.passed and "not run again" in again.skipped[-1]
    # Not solved from scratch: the cell runs, and its errors are the cell's.
    ran = shell.run_cell("%%scaffold coalescing/strided_copy\nran = 1\n")
    assert ran.success and shell.user_ns["ran"] == 1
    failed = shell.run_cell("%%scaffold coalescing/strided_copy\nraise ValueError('x')\n")
    assert isinstance(failed.error_in_exec, ValueError)


def test_a_forged_pass_from_scratch_hands_nothing_in(monkeypatch):
    """The verdict kept for a skipped scaffolded cell is shown, never handed in: state
    planted in the engine by the notebook's own code gives the grader no record."""
    from rooflab.autograder.checking import engine, handin

    kept = []
    monkeypatch.setattr(handin, "keep", kept.append)
    forged = engine.CheckResult("coalescing/vector_add", "CPU", 0)  # no case, no cause
    monkeypatch.setattr(engine, "_passed_from_scratch", {"coalescing/vector_add": forged})
    monkeypatch.setattr(engine, "_passing", {"coalescing/vector_add": unwritten})
    shown = check("coalescing/vector_add", unwritten, show=False)
    assert shown.passed and "not run again" in shown.skipped[-1] and kept == []
    # The same stub checked with no such state is handed in, as NOT IMPLEMENTED.
    monkeypatch.setattr(engine, "_passed_from_scratch", {})
    monkeypatch.setattr(engine, "_passing", {})
    with pytest.raises(AssertionError):
        check("coalescing/vector_add", unwritten, show=False)
    assert [result.verdict for result in kept] == ["NOT IMPLEMENTED"]


def test_a_wrong_answer_from_scratch_fails_and_stops_the_run():
    def wrong(x, y, block=1024):
        return x - y

    with pytest.raises(AssertionError):
        check("coalescing/vector_add", wrong, scratch=True, show=False)


def test_the_grader_counts_the_better_way_once():
    def grade(cell, verdict, seconds=1.0):
        return Grade("coalescing/vector_add", cell, verdict, verdict.lower(), seconds)

    other = Grade("coalescing/transpose", "01-030", "FAIL", "wrong", 2.0)
    for ways in ([grade("01-008", "PASS"), grade("01-010", "NOT IMPLEMENTED")],
                 [grade("01-008", "NOT IMPLEMENTED"), grade("01-010", "PASS")]):
        [best, rest] = best_of_each([*ways, other])
        assert (best.verdict, best.seconds, rest) == ("PASS", 2.0, other)
    [first] = best_of_each([grade("01-008", "FAIL"), grade("01-010", "NOT IMPLEMENTED")])
    assert (first.cell, first.verdict) == ("01-008", "FAIL")


@pytest.mark.parametrize("number", [f"{n:02d}" for n in range(1, 10)])
def test_each_lab_has_a_from_scratch_way_into_an_exercise_that_it_grades(number):
    [path] = (ROOT / "labs").glob(f"{number}_*.ipynb")
    lab = json.loads(path.read_text())
    scratch = [cell for cell in lab["cells"] if "scratch=True" in "".join(cell["source"])]
    assert scratch, f"{path.name} has no from-scratch exercise"
    graded = {e.problem_id for e in exercises(lab)}
    assert len(one_cell_each(exercises(lab))) == len(graded)
    for cell in scratch:
        assert "check" in cell["metadata"]["tags"]
        assert exercises({"cells": [cell]})[0].problem_id in graded


def test_a_graded_notebook_counts_an_exercise_solved_either_way_once(tmp_path):
    from rooflab.autograder.checking.answers import save
    from rooflab.autograder.grading.cells import Exercise
    from rooflab.autograder.grading.verdicts import grade_exercises

    problem = "roofline/cost_vector_add"

    def cost(n, dtype_bytes):
        return n, 3 * n * dtype_bytes

    result = check(problem, cost, seed=5, show=False, keep_outputs=True)
    save(result.outputs, tmp_path / "pass.pt")
    ways = [Exercise("00-006", problem), Exercise("00-008", problem)]
    run = {"cells": [{"index": 3, "id": "00-006", "seconds": 0.1, "error": ""},
                     {"index": 5, "id": "00-008", "seconds": 0.2, "error": ""}]}

    def record(cell, verdict):
        return ({"cell": cell, "problem": problem, "seed": 5, "verdict": verdict,
                 "message": verdict, "replaced": [], "grader_calls": []},
                tmp_path / ("pass.pt" if verdict == "PASS" else "none.pt"))

    # From scratch, then the skipped scaffold (whose check hands nothing in); or the other way.
    for records in ([record("00-006", "PASS")],
                    [record("00-006", "NOT IMPLEMENTED"), record("00-008", "PASS")]):
        [grade] = grade_exercises(ways, run, records, seed=5)
        assert grade.verdict == "PASS", grade.message
    [grade] = grade_exercises(ways, run, [record("00-006", "NOT IMPLEMENTED")], seed=5)
    assert grade.verdict == "FAIL"
