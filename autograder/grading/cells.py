"""Which cells of a submission count: the learner's, and nothing else.

The build tags every code cell that holds a solution region ``solution`` (``course/build.py``). A
submission keeps those cells, and any cell the learner added; every other cell (the
set-up, the lesson's code, the checks) is put back exactly as the lab has it, matched by
its cell id. Deleting a check, editing it to pass, or moving it changes nothing but the
report, which names each protected cell that was not as the lab has it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from ..course.build import SOLUTION_TAG

CHECK_TAG = "check"
# check("lab/exercise", fn ...) in a check cell: the exercise it grades.
CHECK_CALL = re.compile(r"""\bcheck\(\s*["']([\w/]+)["']""")
# What the grader puts at the top of each check cell it runs (grade.with_cell_markers), so
# that the cell's record names it: ``MARKER_LINE + repr(cell id) + ")"``.
MARKER_LINE = '__import__("rooflab.autograder.checking.handin", fromlist=["_"]).at_cell('


@dataclass
class Exercise:
    """A check cell of the lab that grades an exercise (not a demonstration)."""

    cell_id: str
    problem_id: str


@dataclass
class Restored:
    """The notebook to run, and what the submission had changed outside its own cells."""

    notebook: dict
    changed: list[str] = field(default_factory=list)  # "check cell 00-006 deleted", ...
    added: int = 0  # cells the learner added (kept, in place)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _tags(cell: dict) -> list[str]:
    tags = cell.get("metadata", {}).get("tags", [])
    return tags if isinstance(tags, list) else []


def is_solution(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and SOLUTION_TAG in _tags(cell)


def exercises(lab: dict) -> list[Exercise]:
    """The graded exercises of a lab notebook, in order: its check cells, less the ones
    that show a failing check on purpose (``raise_on_failure=False``)."""
    found = []
    for cell in lab["cells"]:
        source = _source(cell)
        match = CHECK_CALL.search(source)
        if CHECK_TAG in _tags(cell) and match and "raise_on_failure=False" not in source:
            found.append(Exercise(cell["id"], match.group(1)))
    return found


def one_cell_each(found: list[Exercise]) -> list[Exercise]:
    """The first check cell of each exercise: one with a from-scratch way in and a
    scaffolded one has two, and is one exercise."""
    first: dict[str, Exercise] = {}
    for exercise in found:
        first.setdefault(exercise.problem_id, exercise)
    return list(first.values())


def restore(lab: dict, submission: dict) -> Restored:
    """The lab's notebook with the submission's solution cells (by id) and added cells in
    it. A submission whose cells have no ids (an old nbformat) is matched by the order of
    its solution-tagged cells."""
    theirs = {cell.get("id"): cell for cell in submission.get("cells", []) if cell.get("id")}
    own_solutions = [cell for cell in submission.get("cells", []) if is_solution(cell)]
    lab_ids = {cell["id"] for cell in lab["cells"]}
    restored = Restored(copy.deepcopy(lab))
    cells, solution_index = [], 0
    for cell in restored.notebook["cells"]:
        cell["source"] = _source(cell)
        if is_solution(cell):
            mine = theirs.get(cell["id"])
            if mine is None and not theirs and solution_index < len(own_solutions):
                mine = own_solutions[solution_index]
            solution_index += 1
            if mine is not None:
                cell["source"] = _source(mine)
            cells.append(cell)
        else:
            mine = theirs.get(cell["id"])
            kind = "check cell" if CHECK_TAG in _tags(cell) else f"{cell['cell_type']} cell"
            if theirs and mine is None:
                restored.changed.append(f"{kind} {cell['id']} deleted")
            elif mine is not None and _source(mine) != _source(cell):
                restored.changed.append(f"{kind} {cell['id']} edited")
            cells.append(cell)
        # The learner's own cells after this one, in their order, up to their next cell
        # that the lab also has.
        cells.extend(_added_after(cell["id"], submission, lab_ids))
    restored.added = len(cells) - len(restored.notebook["cells"])
    restored.notebook["cells"] = cells
    return restored


def _added_after(cell_id: str, submission: dict, lab_ids: set[str]) -> list[dict]:
    cells = submission.get("cells", [])
    start = next((i for i, cell in enumerate(cells) if cell.get("id") == cell_id), None)
    if start is None:
        return []
    added = []
    for cell in cells[start + 1:]:
        if cell.get("id") in lab_ids:
            break
        if cell.get("cell_type") == "code":
            added.append({"cell_type": "code", "id": cell.get("id") or f"added-{len(added)}",
                          "metadata": {}, "source": _source(cell), "outputs": [],
                          "execution_count": None})
    return added


def started(lab: dict, submission: dict) -> bool:
    """Whether the learner has begun this lab: a cell of theirs (a solution cell, by id)
    that is not as the lab hands it out, or a code cell they added."""
    theirs = {cell.get("id"): cell for cell in submission.get("cells", [])}
    lab_ids = {cell["id"] for cell in lab["cells"]}
    for cell in lab["cells"]:
        mine = theirs.get(cell["id"])
        if is_solution(cell) and mine is not None and _source(mine) != _source(cell):
            return True
    return any(cell.get("cell_type") == "code" and cell.get("id") not in lab_ids
               and _source(cell).strip() for cell in submission.get("cells", []))
