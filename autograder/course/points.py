"""What each exercise of a lab is worth, as its master says.

A lab master may give its exercises points in its front matter (a default of 1 each)::

    ---
    grading:
      coalescing/vector_add: 2
      coalescing/transpose: {points: 3, speed: 1, levels: [0.3, 0.8]}
    ---

``points`` is the exercise's worth; ``speed``, how many of those points are for speed, the
rest being for a correct answer. The speed points scale with the roofline fraction between
two ``levels``: none at the first, all at the second (by default the problem's own
passing and excellent levels). The build writes the table into the lab notebook's
metadata, where ``rooflab grade`` reads it from the instructor's copy of the lab, never
from a submission.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

METADATA = "rooflab"  # the notebook metadata key: {"grading": {problem id: Points as a dict}}


@dataclass(frozen=True)
class Points:
    points: float = 1.0
    speed: float = 0.0  # of ``points``, those for speed; the rest are for a right answer
    levels: tuple[float, float] | None = None  # roofline fractions: no speed points .. all

    @property
    def correctness(self) -> float:
        return self.points - self.speed


def parse(front: dict, where: str) -> dict[str, Points]:
    """The ``grading:`` table of a master's front matter, checked. Raises ValueError,
    naming ``where`` and the entry, for anything an instructor could have mistyped."""
    table = front.get("grading") or {}
    if not isinstance(table, dict):
        raise ValueError(f"{where}: `grading:` maps problem ids to points")
    parsed = {}
    for problem_id, entry in table.items():
        if isinstance(entry, (int, float)) and not isinstance(entry, bool):
            entry = {"points": entry}
        if not isinstance(entry, dict) or set(entry) - {"points", "speed", "levels"}:
            raise ValueError(f"{where}: grading of {problem_id}: a number of points, or "
                             "{points: P, speed: S, levels: [LOW, HIGH]}")
        parsed[str(problem_id)] = _checked(Points(
            points=float(entry.get("points", 1.0)), speed=float(entry.get("speed", 0.0)),
            levels=tuple(entry["levels"]) if entry.get("levels") is not None else None),
            f"{where}: grading of {problem_id}")
    return parsed


def _checked(points: Points, where: str) -> Points:
    if not (math.isfinite(points.points) and points.points >= 0):
        raise ValueError(f"{where}: points must be a number ≥ 0, not {points.points}")
    if not 0 <= points.speed <= points.points:
        raise ValueError(f"{where}: speed points ({points.speed:g}) are part of the points "
                         f"({points.points:g}): between 0 and them")
    levels = list(points.levels or ())
    if points.levels is not None and not (
            len(levels) == 2 and all(isinstance(x, (int, float)) for x in levels)
            and 0 <= levels[0] < levels[1]):
        raise ValueError(f"{where}: levels are two roofline fractions, [LOW, HIGH], "
                         f"0 ≤ LOW < HIGH, not {levels}")
    return points


def as_metadata(table: dict[str, Points]) -> dict:
    """The table as the lab notebook's metadata holds it (JSON)."""
    return {METADATA: {"grading": {pid: {k: v for k, v in asdict(p).items() if v is not None}
                                   for pid, p in sorted(table.items())}}} if table else {}


def of_lab(notebook: dict) -> dict[str, Points]:
    """The table a lab notebook carries (empty: every exercise is worth 1)."""
    table = notebook.get("metadata", {}).get(METADATA, {}).get("grading", {})
    return {pid: Points(points=entry.get("points", 1.0), speed=entry.get("speed", 0.0),
                        levels=tuple(entry["levels"]) if entry.get("levels") else None)
            for pid, entry in table.items()}
