"""Points: what each graded exercise earns, and what a learner's lab earns in all.

An exercise is worth the points its lab's master gives it (``course/points.py``; 1 by
default). A right answer earns the correctness part. The speed part, where the master
gives one, scales with the roofline fraction between two levels: measured, on a GPU. On a
CPU nothing is timed, so the instructor chooses (``--speed-on-cpu``): ``none`` grades
correctness alone (a right answer earns every point, and the gradebook says speed was not
graded), ``predicted`` counts the fraction predicted from the traced memory traffic, a
launch's fixed cost left out (at a CPU's small sizes it would outweigh everything else).

An exercise a CPU could only compile (NEEDS A GPU) keeps its worth and earns nothing
until a GPU grades it: the lab's points name it as pending.

A lab handed in after its deadline loses ``late_per_day`` of the points it earned for
each day or part of a day late, and earns at most ``late_cap`` of its points possible, if
given. A submission's time
is the date of its notebook: in its zip, on its file, or in a manifest the instructor
gives (``--submitted``), which is the only sound source for a git checkout.

Everything here is a pure function of a result and the settings, so ``--resume`` scores
an unchanged notebook again under new settings without running it.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .. import problems
from ..course.points import Points

SPEED_ON_CPU = ("none", "predicted")
DAY_S = 86400.0


@dataclass(frozen=True)
class Policy:
    speed_on_cpu: str = "none"
    # Deadlines, seconds since the epoch, by lab number ("01"); "" for every other lab.
    deadlines: dict[str, float] = field(default_factory=dict)
    late_per_day: float = 0.0  # of the lab's points, lost per day or part of a day late
    late_cap: float | None = None  # late work earns at most this share of the points

    def deadline(self, lab: str) -> float | None:
        return self.deadlines.get(lab[:2], self.deadlines.get(""))

    def as_dict(self) -> dict:
        """What a result records of the settings it was scored under."""
        return {"speed_on_cpu": self.speed_on_cpu, "deadlines": dict(sorted(
            self.deadlines.items())), "late_per_day": self.late_per_day,
            "late_cap": self.late_cap}


def parse_time(text: str) -> float:
    """An ISO 8601 date and time (``2026-12-01T23:59``, ``...Z``, ``...+01:00``) as seconds
    since the epoch; without a zone, the grading machine's. Raises ValueError."""
    when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when.timestamp() if when.tzinfo else when.astimezone().timestamp()


def read_submitted(path: Path) -> dict[tuple[str, str], float]:
    """A manifest of submission times, a CSV of ``learner,time`` or ``learner,lab,time``
    rows (a header row naming ``learner`` first is skipped; ``lab`` is its number, 01):
    (learner, lab or "") -> seconds since the epoch. Raises ValueError, naming the row."""
    try:
        rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"--submitted {path}: {error}") from None
    times = {}
    for number, row in enumerate(rows, 1):
        cells = [cell.strip() for cell in row]
        if not any(cells) or (number == 1 and cells[0].lower() == "learner"):
            continue
        if len(cells) not in (2, 3):
            raise ValueError(f"--submitted {path}, row {number}: learner,time or "
                             f"learner,lab,time, not {row}")
        learner, lab, when = (cells[0], "", cells[1]) if len(cells) == 2 else cells
        try:
            times[learner, lab[:2]] = parse_time(when)
        except ValueError:
            raise ValueError(f"--submitted {path}, row {number}: {when!r} is not an ISO "
                             "date and time (2026-12-01T23:59:00+01:00)") from None
    return times


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def worth(lab_table: dict[str, Points], exercise: str) -> Points:
    return lab_table.get(exercise, Points())


def exercise_points(grade: dict, points: Points, measured: bool, policy: Policy) -> dict:
    """What one exercise earns: ``earned`` of ``possible``, its parts, and why."""
    earned = {"possible": points.points, "correctness": 0.0, "speed": 0.0, "speed_basis": "",
              "why": ""}
    if grade["verdict"] != "PASS":
        earned["why"] = ("correctness pending: it needs a GPU to run"
                         if grade["verdict"] == "NEEDS A GPU" else "not passed")
    elif points.speed == 0:
        earned["correctness"] = points.points
    else:
        earned["correctness"] = points.correctness
        fraction, basis = _fraction(grade.get("performance") or {}, measured, policy)
        if basis == "not graded":  # correctness alone: the speed points go with it
            earned["correctness"] = points.points
            earned["why"] = "speed not graded on a CPU (--speed-on-cpu none)"
        elif fraction is None:
            earned["why"] = f"no roofline fraction was {basis}: no speed points"
        else:
            low, high = points.levels or _levels(grade["exercise"])
            share = min(1.0, max(0.0, (fraction - low) / (high - low)))
            earned["speed"] = round(points.speed * share, 4)
            earned["why"] = (f"speed: {basis} roofline fraction {fraction:.2f} between "
                             f"{low:g} and {high:g}")
        earned["speed_basis"] = basis
    earned["earned"] = round(earned["correctness"] + earned["speed"], 4)
    return earned


def _fraction(performance: dict, measured: bool, policy: Policy) -> tuple[float | None, str]:
    if measured:
        return _finite(performance.get("roofline_fraction")), "measured"
    if policy.speed_on_cpu == "predicted":  # the traffic's: see handin.performance
        return _finite(performance.get("predicted_traffic_fraction")), "predicted"
    return None, "not graded"


def _finite(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _levels(problem_id: str) -> tuple[float, float]:
    """The problem's own passing and excellent levels."""
    try:
        levels = problems.get(problem_id).levels
    except KeyError:
        return 0.0, 1.0
    return levels.passing, max(levels.excellent, levels.passing + 1e-9)


def late_days(submitted: float | None, deadline: float | None) -> int:
    """Days late, each part of a day counting as one; 0 when on time or either is unknown."""
    if submitted is None or deadline is None or submitted <= deadline:
        return 0
    return math.ceil((submitted - deadline) / DAY_S)


def score(result: dict, lab_table: dict[str, Points], policy: Policy) -> dict:
    """``result`` with the points of each grade and of the lab (before and after any late
    penalty) written in; returned for convenience."""
    measured = bool(result.get("measured", False))
    for grade in result["grades"]:
        grade["points"] = exercise_points(grade, worth(lab_table, grade["exercise"]),
                                          measured, policy)
    possible = sum(g["points"]["possible"] for g in result["grades"])
    before = sum(g["points"]["earned"] for g in result["grades"])
    deadline = policy.deadline(result["lab"])
    days = late_days(result.get("submitted"), deadline)
    earned, late = before, ""
    if days:
        earned = before * max(0.0, 1.0 - policy.late_per_day * days)
        if policy.late_cap is not None:
            earned = min(earned, policy.late_cap * possible)
        late = (f"{days} day{'s' * (days > 1)} late (deadline {iso(deadline)}): "
                f"{before:g} → {round(earned, 4):g} points")
    # Worth their points, and earning none until a GPU decides them: said, not silent.
    pending = [g["exercise"] for g in result["grades"] if g["verdict"] == "NEEDS A GPU"]
    result["points"] = {"earned": round(earned, 4), "possible": possible,
                        "before_penalty": round(before, 4), "late_days": days, "late": late,
                        "pending": pending}
    result["policy"] = policy.as_dict()
    return result
