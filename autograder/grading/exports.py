"""The gradebook as a learning platform imports it: one row per learner, one column per lab.

* ``grades-canvas.csv``: Canvas's gradebook layout. ``Student, ID, SIS User ID, SIS Login
  ID, Section``, then a column per lab; the second row, ``Points Possible``, holds each
  lab's points.
* ``grades-moodle.csv``: Moodle's grade import. ``Username, Email address, ID number``,
  then a column per lab, named with its points possible (``01_coalescing (out of 5)``);
  Moodle maps each column to a grade item as it imports.

A learner is matched on the platform by the roster's columns of the same names (``SIS
Login ID``, ``Username``, ... in any case); without them, by the name the submission
gave, in ``SIS Login ID`` and ``Username``. A lab a learner handed in nothing for earns 0,
and so does every lab of a learner on the roster who handed in nothing.
"""

from __future__ import annotations

import csv
import io

CANVAS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE = ["Username", "Email address", "ID number"]
# The roster column each one is taken from, where the roster has it (lower case); without
# it, the learner's name, for the columns named here.
ALSO_CALLED = {"Student": ("student", "name"), "ID": ("id",),
               "SIS User ID": ("sis user id", "sis_user_id"),
               "SIS Login ID": ("sis login id", "sis_login_id", "login"),
               "Section": ("section",), "Username": ("username", "user"),
               "Email address": ("email address", "email"),
               "ID number": ("id number", "idnumber", "id_number")}
BY_NAME = {"Student", "SIS Login ID", "Username"}


def lab_totals(results: list[dict]) -> tuple[list[str], dict[str, float],
                                            dict[tuple[str, str], float]]:
    """(the labs, in order; each lab's points possible; each (learner, lab)'s points)."""
    possible: dict[str, float] = {}
    earned: dict[tuple[str, str], float] = {}
    for result in results:
        points = result.get("points") or {}
        possible[result["lab"]] = max(possible.get(result["lab"], 0.0),
                                      float(points.get("possible", 0.0)))
        earned[result["learner"], result["lab"]] = float(points.get("earned", 0.0))
    return sorted(possible), possible, earned


def learners(results: list[dict], roster: list[str] | None) -> list[str]:
    """The roster's learners in its order, then anyone graded who is not on it."""
    graded = sorted({r["learner"] for r in results})
    listed = list(roster or [])
    return listed + [name for name in graded if name not in set(listed)]


def _identity(learner: str, columns: list[str], details: dict[str, dict[str, str]]) -> list[str]:
    row = {key.lower(): value for key, value in details.get(learner, {}).items()}
    cells = []
    for column in columns:
        found = next((row[name] for name in ALSO_CALLED[column] if row.get(name)), "")
        cells.append(found or (learner if column in BY_NAME else ""))
    return cells


def _number(value: float) -> str:
    return f"{round(value, 4):g}"


def canvas(results: list[dict], roster: list[str] | None = None,
           details: dict[str, dict[str, str]] | None = None) -> str:
    labs, possible, earned = lab_totals(results)
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(CANVAS + labs)
    writer.writerow(["Points Possible"] + [""] * (len(CANVAS) - 1)
                    + [_number(possible[lab]) for lab in labs])
    for learner in learners(results, roster):
        writer.writerow(_identity(learner, CANVAS, details or {})
                        + [_number(earned.get((learner, lab), 0.0)) for lab in labs])
    return text.getvalue()


def moodle(results: list[dict], roster: list[str] | None = None,
           details: dict[str, dict[str, str]] | None = None) -> str:
    labs, possible, earned = lab_totals(results)
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(MOODLE + [f"{lab} (out of {_number(possible[lab])})" for lab in labs])
    for learner in learners(results, roster):
        writer.writerow(_identity(learner, MOODLE, details or {})
                        + [_number(earned.get((learner, lab), 0.0)) for lab in labs])
    return text.getvalue()
