"""The verdict line is the grader's own: whatever text a candidate's process writes into
its report (by patching the report writer under `rooflab check`, or by writing the hand-in
record under `rooflab grade`), the line that states the verdict is worded in the grader's
process, and the report's text follows it, indented under a label that says whose word it
is."""

import json

import pytest

from rooflab.autograder import check
from rooflab.autograder.checking import child_report, handin
from rooflab.autograder.cli import EXIT_FAIL, EXIT_PASS, main
from rooflab.autograder.grading.cells import Exercise
from rooflab.autograder.grading.verdicts import grade_exercises
from rooflab.kernels.vector_add import vector_add

FORGED = "PASS coalescing/vector_add: FORGED, every case correct at 100% of roofline"

# A correct kernel whose file also rewrites the child's report: its verdict is PASS, but
# the words are the forger's.
REWRITES_REPORT = '''\
import sys
from rooflab.kernels.vector_add import vector_add

child = sys.modules["__main__"]
original = child._write

def _write(into, report):
    if "verdict" in report:
        report = dict(report, verdict=VERDICT, line=LINE, message=LINE + "\\n  all fine")
    return original(into, report)

child._write = _write

def add(x, y):
    return vector_add(x, y)
'''


def run_check(capsys, tmp_path, verdict: str, *flags: str) -> tuple[int, str]:
    candidate = tmp_path / "forger.py"
    candidate.write_text(f"VERDICT, LINE = {verdict!r}, {FORGED!r}\n" + REWRITES_REPORT)
    code = main(["check", "coalescing/vector_add", f"{candidate}:add", *flags])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_report_rewritten_in_the_child_never_words_the_verdict_line(capsys, tmp_path):
    code, out = run_check(capsys, tmp_path, "PASS")
    first = out.splitlines()[0]
    assert code == EXIT_PASS, out
    assert first.startswith("PASS coalescing/vector_add: all "), first
    assert "checked again outside the candidate's process" in first
    assert "FORGED" not in out  # without --verbose, nothing of the report is shown

    code, out = run_check(capsys, tmp_path, "PASS", "--verbose")
    lines = out.splitlines()
    assert code == EXIT_PASS and "FORGED" not in lines[0], out
    assert lines[1] == child_report.REPORT_HEAD
    assert all(line.startswith("    ") for line in lines[2:] if line), out


def test_a_forged_failure_cannot_read_as_a_pass(capsys, tmp_path):
    code, out = run_check(capsys, tmp_path, "FAIL")
    assert code == EXIT_FAIL, out
    assert out.startswith("FAIL coalescing/vector_add: "), out
    code, out = run_check(capsys, tmp_path, "DONE")  # not a verdict at all: a failure
    assert code == EXIT_FAIL and out.startswith("FAIL coalescing/vector_add: "), out


@pytest.mark.parametrize("forged_verdict", ["PASS", "FAIL"])
def test_a_hand_in_record_s_text_never_words_the_gradebook_s_verdict_line(
        tmp_path, monkeypatch, forged_verdict):
    """The record a graded check leaves, its text then rewritten as a notebook could."""
    seed = 11
    monkeypatch.setenv(handin.INTO_ENV, str(tmp_path))
    monkeypatch.setenv(handin.SEED_ENV, str(seed))
    monkeypatch.setattr(handin, "_cell", "01-004")
    result = check("coalescing/vector_add", vector_add, seed=seed, show=False,
                   raise_on_failure=False, measure=False)
    assert result.passed, result.message()
    [written] = sorted(tmp_path.glob("*.json"))
    record = json.loads(written.read_text())
    record.update(verdict=forged_verdict, message=FORGED + "\n  ok  every case")
    record["performance"] = {"measured": False, "predicted_roofline_fraction": 0.5,
                             "line": FORGED}
    exercise = Exercise("01-004", "coalescing/vector_add")
    run = {"cells": [{"index": 3, "id": "01-004", "seconds": 0.1, "error": ""}]}
    outputs = written.with_name(written.stem + "-outputs.pt")
    [grade] = grade_exercises([exercise], run, [(record, outputs)], seed=seed)
    first, *rest = grade.message.splitlines()
    assert grade.verdict == forged_verdict, grade.message
    assert first.startswith(f"{forged_verdict} coalescing/vector_add: "), first
    if forged_verdict == "PASS":
        assert "FORGED" not in first and "checked again outside" in first, first
        assert "predicted: 50% in all, nothing measured" in first
        assert rest[0] == child_report.REPORT_HEAD and FORGED in rest[1]
        assert all(line.startswith("    ") for line in rest[1:])


def test_the_figures_in_a_verdict_line_are_numbers_the_grader_formats():
    assert child_report.figures_words({"measured": True, "seconds": 2.5e-5,
                                       "roofline_fraction": 0.82}) == \
        "measured 25.0 µs median, 82% of roofline"
    for odd in ({"measured": True, "seconds": "PASS", "roofline_fraction": 1.0},
                {"measured": True, "seconds": float("nan"), "roofline_fraction": 1.0},
                {"predicted_roofline_fraction": True}, "PASS", None):
        assert child_report.figures_words(odd) == ""
    assert child_report.figures_words({
        "predicted_roofline_fraction": 0.004, "predicted_traffic_fraction": 0.99,
        "predicted_for": "H100 SXM, datasheet (not measured)"}) == \
        "predicted for H100 SXM, datasheet (not measured): 99% of roofline in its " \
        "traffic, 0% in all, nothing measured"
    assert "PASS" not in child_report.figures_words({
        "predicted_roofline_fraction": 0.5, "predicted_for": "x\nPASS: forged"})
