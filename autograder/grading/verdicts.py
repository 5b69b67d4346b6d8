"""The grade of each exercise, decided here, in the grader's process, which never runs
learner code.

A notebook's own output proves nothing: a learner's code shares the kernel with ``check``
and can print "PASS", patch the comparison, or skip the check. So an exercise passes only
when its check cell left one record (``checking/handin.py``) that says so, the timers and
the grader were not replaced before it, and every answer in that record is right when
checked again here against this process's own reference (isolated.recheck), and it
names none of the grader's own functions called by a plain-Python candidate. The verdict
line is then this process's own (``checking/child_report.py``); what the check saw in the
notebook's process (which ops ran, the traffic, the time) follows it as that process's
word.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import problems
from ..checking import child_report
from ..checking.isolated import judged_cases, recheck, setting
from ..evidence import grader_calls
from .cells import Exercise


@dataclass
class Grade:
    exercise: str  # the problem id
    cell: str
    verdict: str  # PASS, FAIL, NOT IMPLEMENTED or NEEDS A GPU
    message: str
    seconds: float = 0.0  # the check cell's own run time
    performance: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def as_dict(self) -> dict:
        return asdict(self)


def grade_exercises(exercises: list[Exercise], run: dict, records: list[tuple[dict, Path]],
                    seed: int) -> list[Grade]:
    """One Grade per exercise, from what the run did and what the checks recorded, the
    checks' inputs made from ``seed`` (the grader's)."""
    cells = {cell["id"]: cell for cell in run.get("cells", [])}
    by_index = {cell["index"]: cell for cell in run.get("cells", [])}
    grades, after = [], -1
    for exercise in exercises:
        cell = cells.get(exercise.cell_id, {})
        seconds = float(cell.get("seconds", 0.0))
        # Cells since the last exercise's check that ended the kernel or failed: the
        # likely cause when this check could not run.
        since = [c for i, c in sorted(by_index.items()) if after < i < cell.get("index", -1)]
        crashes = [c["id"] for c in since if c["index"] in run.get("crashed", [])]
        failed = [c for c in since if c["error"] and c["index"] not in run.get("crashed", [])]
        after = cell.get("index", after)
        in_cell = [(rec, outputs) for rec, outputs in records
                   if rec.get("cell") == exercise.cell_id]
        mine = [(rec, outputs) for rec, outputs in in_cell
                if rec.get("problem") == exercise.problem_id]
        if len(in_cell) > 1:  # its one check leaves one: the others were written otherwise
            grades.append(Grade(exercise.problem_id, exercise.cell_id, "FAIL", (
                f"the check cell left {len(in_cell)} records where its one check leaves "
                "one: something else in the notebook (a thread, a cell's own code) wrote "
                "records, and none of them can be trusted"), seconds))
            continue
        if not mine:
            why = _why_no_record(cell, run)
            if crashes:
                why = (f"cell {crashes[0]} ended the kernel (os._exit, a crash, or the memory "
                       f"cap) and was left out when the notebook ran again; {why}")
            elif failed:
                why = f"cell {failed[0]['id']} failed ({failed[0]['error'][:200]}); {why}"
            grades.append(Grade(exercise.problem_id, exercise.cell_id, "FAIL", why, seconds))
            continue
        rec, outputs = mine[-1]
        grades.append(_judge(exercise, rec, outputs, seconds, seed))
    return best_of_each(grades)


# A verdict's rank when one exercise has two check cells (from scratch, and scaffolded):
# the better of the two counts.
_RANK = {"PASS": 3, "NEEDS A GPU": 2, "FAIL": 1, "NOT IMPLEMENTED": 0}


def best_of_each(grades: list[Grade]) -> list[Grade]:
    """One grade per exercise, in the order of first appearance: of several check cells
    of one exercise (its ways in), the best verdict; at a tie, the first. Their seconds
    add up: each cell ran."""
    best: dict[str, Grade] = {}
    for grade in grades:
        kept = best.setdefault(grade.exercise, grade)
        if kept is grade:
            continue
        seconds = kept.seconds + grade.seconds
        if _RANK.get(grade.verdict, 0) > _RANK.get(kept.verdict, 0):
            best[grade.exercise] = kept = grade
        kept.seconds = seconds
    return list(best.values())


def _why_no_record(cell: dict, run: dict) -> str:
    if run.get("gave_up"):
        return f"not graded: {run['gave_up']}"
    if not cell and run.get("killed"):
        return f"not graded: {run['killed']}"
    if not cell:
        return "the check cell never ran: an earlier cell stopped the notebook"
    if cell.get("error"):
        return f"the check did not run: {cell['error'][:300]}"
    return ("the check cell ran but no check reported: was `check` replaced or silenced? "
            "Only the course's own check can grade an exercise")


def _judge(exercise: Exercise, rec: dict, outputs: Path, seconds: float, seed: int) -> Grade:
    verdict, message = child_report.verdict_of(rec), str(rec.get("message", ""))
    performance = rec.get("performance") or {}
    if rec.get("replaced"):
        names = ", ".join(rec["replaced"][:6])
        return Grade(exercise.problem_id, exercise.cell_id, "FAIL",
                     f"the notebook replaced {names} before this check: a time or a verdict "
                     "from a patched timer or grader proves nothing", seconds)
    borrowed = grader_calls.cause(rec.get("grader_calls"))
    if verdict == "PASS" and borrowed:  # the record contradicts itself: it was written so
        return Grade(exercise.problem_id, exercise.cell_id, "FAIL", borrowed, seconds)
    if verdict == "PASS" and rec.get("seed") != seed:
        return Grade(exercise.problem_id, exercise.cell_id, "FAIL",
                     "the check ran on inputs other than the grader's", seconds)
    if verdict != "PASS":  # the cause is the record's word: a learner only hurts itself
        return Grade(exercise.problem_id, exercise.cell_id, verdict,
                     child_report.fail_text(exercise.problem_id, verdict, message), seconds,
                     performance)
    try:
        spec = problems.get(exercise.problem_id)
    except KeyError:
        return Grade(exercise.problem_id, exercise.cell_id, "FAIL",
                     f"unknown problem {exercise.problem_id}", seconds)
    wrong = recheck(spec, outputs, seed)
    if wrong:
        return Grade(exercise.problem_id, exercise.cell_id, "FAIL",
                     f"{wrong} (checked again outside the notebook's process)", seconds)
    # The verdict line is this process's own; what the notebook's check saw follows it,
    # labelled as the notebook's word.
    line = child_report.pass_line(exercise.problem_id, judged_cases(spec, seed, True),
                                  performance, setting(spec))
    quoted = child_report.quoted(message)
    return Grade(exercise.problem_id, exercise.cell_id, "PASS",
                 f"{line}\n{quoted}" if quoted else line, seconds, performance)
