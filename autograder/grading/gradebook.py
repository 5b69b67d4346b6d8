"""The gradebook: one result file per learner and lab as it is graded, and from them the
views an instructor and CI read: JSON, CSV, an HTML page, JUnit XML, the CSVs Canvas and
Moodle import (``exports.py``), and a page for each learner (``feedback.py``).

Every file is written whole or not at all (written beside, then renamed), so an
interrupted grading leaves only complete results, and ``--resume`` trusts what it finds.
Shards of one class (``--shard i/n``) each write their results; ``merge`` joins them.

A roster (``--roster``, a CSV whose first column is the learner) lets the views name the
learners who handed in nothing, and those graded who are not on it; its other columns,
where it has a header row, give the ids a learning platform matches learners by.
"""

from __future__ import annotations

import csv
import html
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree

from . import exports, shards
from .feedback import FEEDBACK, STYLE, fractions, points_text, section, write_pages

RESULTS = "results"  # one <learner>--<lab>.json each
FAILED = ("FAIL", "NOT IMPLEMENTED")  # NEEDS A GPU is neither a pass nor a failure


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def result_path(out: Path, learner: str, lab: str) -> Path:
    return out / RESULTS / f"{learner}--{lab}.json"


def graded(out: Path, learner: str, lab: str, digest: str | None = None) -> bool:
    """Whether this learner's lab has a result that graded it (``--resume`` skips it): not
    one that says it was not graded, for a clash of notebooks, and, given the ``digest`` of
    the notebook handed in now, not one of a notebook whose content has changed since."""
    try:
        result = json.loads(result_path(out, learner, lab).read_text())
    except (OSError, ValueError):
        return False
    return not result.get("clash") and (digest is None or result.get("sha256") == digest)


def load_results(out: Path) -> list[dict]:
    found = []
    for path in sorted((out / RESULTS).glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:
            continue  # not one of ours: a result is written whole or not at all
    return sorted(found, key=lambda r: (r["learner"], r["lab"]))


def read_roster(path: Path) -> list[str]:
    """The learners of a roster CSV: its first column, a header cell ``learner`` skipped.
    Raises ValueError where it cannot be read or names no one."""
    return load_roster(path)[0]


def load_roster(path: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(the learners of a roster CSV, its first column, in its order, each once; each
    learner's other columns where it has a header row, ``learner,SIS Login ID,Section``:
    the ids a learning platform matches learners by). Read once, so a pipe serves. Raises
    ValueError where it cannot be read or names no one."""
    try:
        rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"--roster {path}: {error}") from None
    rows = [[cell.strip() for cell in row] for row in rows if row and row[0].strip()]
    header = rows[0] if rows and _is_header(rows[0]) else None
    if header:
        rows = rows[1:]
    names = list(dict.fromkeys(row[0] for row in rows))  # each once, in the roster's order
    if not names:
        raise ValueError(f"--roster {path}: no learner in it (the first column names them)")
    # A short row leaves its last columns blank.
    details = {row[0]: dict(zip(header[1:], row[1:], strict=False)) for row in rows} \
        if header else {}
    return names, details


def _is_header(row: list[str]) -> bool:
    """A roster's first row names its columns when it starts with ``learner`` or names a
    column a learning platform matches by (``Student``, ``SIS Login ID``, ``Username``,
    ...): a learner is never called so."""
    known = {"learner"} | {name for names in exports.ALSO_CALLED.values() for name in names}
    return row[0].lower() == "learner" or any(cell.lower() in known for cell in row)


def against_roster(results: list[dict], roster: list[str]) -> tuple[list[str], list[str]]:
    """(the roster's learners without any result, the learners graded but not on it)."""
    seen = {r["learner"] for r in results}
    return [name for name in roster if name not in seen], sorted(seen - set(roster))


def write_views(out: Path, roster: list[str] | None = None,
                details: dict[str, dict[str, str]] | None = None) -> list[Path]:
    """gradebook.json, .csv, .html, junit.xml, the Canvas and Moodle CSVs, and each
    learner's feedback page, from every result in ``out``; with a roster, they also name
    who handed in nothing and who is not on it."""
    results = load_results(out)
    book: dict = {"results": results}
    missing: list[str] = []
    if roster is not None:
        missing, book["not_on_roster"] = against_roster(results, roster)
        book["missing"] = missing
    views = {
        "gradebook.json": json.dumps(book, indent=1),
        "gradebook.csv": _csv(results, missing),
        "gradebook.html": _html(results, missing, book.get("not_on_roster", [])),
        "junit.xml": _junit(results),
        "grades-canvas.csv": exports.canvas(results, roster, details),
        "grades-moodle.csv": exports.moodle(results, roster, details),
    }
    for name, text in views.items():
        write_atomic(out / name, text)
    write_pages(out, results, write_atomic)
    return [out / name for name in views]


def merge(folders: list[Path], out: Path, roster: list[str] | None = None,
          details: dict[str, dict[str, str]] | None = None,
          say: Callable[[str], None] = lambda line: None) -> list[Path]:
    """Join the results of several shards into ``out`` and write its views. Raises
    ValueError, before copying anything, where a shard folder does not exist (a mistyped
    folder, a job that never ran), where the shards' manifests are not the n finished
    shares of one grading, each once (``shards.check``), where a shard holds a result of
    a learner not its own, where two shards hold one learner's lab, or where ``out``
    already holds results from elsewhere. A shard with no result is fine: with more shards
    than learners, some get none. Folders without a manifest (gradings without --shard)
    are joined as they are, and ``say`` says that nothing checked them."""
    owner: dict[str, Path] = {}  # result file name: the shard it comes from
    for folder in folders:
        if not folder.is_dir():
            raise ValueError(f"--merge: the shard folder {folder} does not exist")
    try:
        if not shards.check(folders):
            say("--merge: these folders have no shard manifest (graded without --shard): "
                "nothing checks that together they are the whole class")
    except ValueError as error:
        raise ValueError(f"--merge: {error}") from None
    for folder in folders:
        manifest = shards.read(folder)
        for path in sorted((folder / RESULTS).glob("*.json")):
            if path.name in owner:
                raise ValueError(f"--merge: {path.stem} is in two shards, {owner[path.name]} "
                                 f"and {folder}: each learner's lab belongs to one shard")
            learner = path.stem.rsplit("--", 1)[0]
            if manifest is not None and learner not in manifest["learners"]:
                raise ValueError(f"--merge: {path} is a result of {learner}, who is not a "
                                 f"learner of that shard ({manifest['shard']}/"
                                 f"{manifest['of']}): it was not graded there")
            owner[path.name] = folder
    theirs = {folder.resolve() for folder in folders}
    if out.resolve() not in theirs:
        stale = sorted(p.name for p in (out / RESULTS).glob("*.json") if p.name not in owner)
        if stale:
            raise ValueError(f"--merge: {out} already holds results that are in none of these "
                             f"shards ({', '.join(stale[:3])}{', ...' if len(stale) > 3 else ''}"
                             "): merge into a new folder")
    for name, folder in owner.items():
        _copy(folder / RESULTS / name, out / RESULTS / name)
    for folder in folders:  # each learner's notebooks as graded
        for notebook in sorted((folder / FEEDBACK).glob("*/*.ipynb")):
            _copy(notebook, out / notebook.relative_to(folder))
    return write_views(out, roster, details)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if not (target.exists() and target.samefile(source)):
        shutil.copyfile(source, target)


COLUMNS = ["learner", "lab", "exercise", "verdict", "points", "points_possible",
           "roofline_fraction", "predicted_roofline_fraction", "check_seconds",
           "notebook_seconds", "message"]


def _csv(results: list[dict], missing: list[str]) -> str:
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(COLUMNS)
    for result in results:
        for grade in result["grades"]:
            measured, predicted = fractions(grade)
            points = grade.get("points") or {}
            writer.writerow([result["learner"], result["lab"], grade["exercise"],
                             grade["verdict"], f"{points.get('earned', 0):g}",
                             f"{points.get('possible', 0):g}", measured, predicted,
                             grade["seconds"], result["seconds"],
                             grade["message"].splitlines()[0] if grade["message"] else ""])
    for learner in missing:  # on the roster, and no result: a row, so no one is forgotten
        writer.writerow([learner, "", "", "MISSING", 0, "", "", "", "", "",
                         "handed in nothing"])
    return text.getvalue()


def _junit(results: list[dict]) -> str:
    suites = ElementTree.Element("testsuites", name="rooflab grade")
    for result in results:
        grades = result["grades"]
        # NEEDS A GPU is not a failure: a CPU could not run it, and a GPU job will.
        failed = [g for g in grades if g["verdict"] in FAILED]
        pending = [g for g in grades if g["verdict"] == "NEEDS A GPU"]
        suite = ElementTree.SubElement(
            suites, "testsuite", name=f"{result['learner']}.{result['lab']}",
            tests=str(len(grades)), failures=str(len(failed)), errors="0",
            skipped=str(len(pending)), time=f"{result['seconds']:.3f}")
        for grade in grades:
            case = ElementTree.SubElement(suite, "testcase", classname=result["learner"],
                                          name=grade["exercise"], time=f"{grade['seconds']:.3f}")
            if grade["verdict"] in FAILED:
                failure = ElementTree.SubElement(case, "failure",
                                                 message=grade["message"][:200])
                failure.text = grade["message"]
            elif grade["verdict"] == "NEEDS A GPU":
                ElementTree.SubElement(case, "skipped", message=grade["message"][:200])
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _html(results: list[dict], missing: list[str], not_on_roster: list[str]) -> str:
    esc = html.escape
    modes = sorted({r.get("mode", "") for r in results})
    predicted = any(m.startswith("CPU") for m in modes)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>rooflab gradebook"
             f"</title><style>{STYLE}</style></head><body><h1>Gradebook</h1>"]
    parts.append(f"<p class='note'>{len(results)} results, one per learner and lab, on "
                 f"{esc(', '.join(modes)) or 'no device'}. "
                 + ("On a CPU nothing is timed: roofline fractions are <b>predicted</b> from "
                    "the traced memory traffic, not measured." if predicted else
                    "Roofline fractions are measured on the GPU named above.") + "</p>")
    unconfined = [r for r in results if r.get("confined") is False]
    if unconfined:
        parts.append(f"<div class='warn'><b>Unconfined:</b> {len(unconfined)} of "
                     f"{len(results)} notebooks ran without the sandbox (--unconfined), with "
                     "the grader's rights: they could read other submissions and write "
                     "outside their folder.</div>")
    clashes = [r for r in results if r.get("clash")]
    if clashes:
        parts.append("<div class='warn'><b>Not graded:</b> "
                     + esc("; ".join(f"{r['learner']} {r['lab']}" for r in clashes))
                     + ". Each was handed in as several notebooks, and none of them was "
                     "graded: keep one, or grade with --pick newest.</div>")
    if not_on_roster:
        parts.append(f"<div class='warn'><b>Not on the roster:</b> "
                     f"{esc(', '.join(not_on_roster))}</div>")
    policies = {json.dumps(r.get("policy", {}), sort_keys=True) for r in results}
    if len(policies) > 1:
        parts.append("<div class='warn'><b>Scored under different settings:</b> the "
                     "results were given points under more than one --speed-on-cpu, "
                     "--deadline or late rule; grade again with --resume to score them all "
                     "alike.</div>")
    parts.append("<table><tr><th>learner</th><th>lab</th><th class='num'>passed</th>"
                 "<th class='num'>points</th><th class='num'>time (s)</th><th>notes</th></tr>")
    for r in results:
        passed = sum(g["verdict"] == "PASS" for g in r["grades"])
        late = (r.get("points") or {}).get("late", "")
        pending = (r.get("points") or {}).get("pending", [])
        notes = "; ".join([*([late] if late else []),
                           *([f"pending a GPU: {', '.join(pending)}"] if pending else []),
                           *r.get("changed", []), *r.get("problems", [])][:3])
        parts.append(f"<tr><td><a href='#{esc(r['learner'])}--{esc(r['lab'])}'>"
                     f"{esc(r['learner'])}</a></td><td>{esc(r['lab'])}</td>"
                     f"<td class='num'>{passed} / {len(r['grades'])}</td>"
                     f"<td class='num'>{points_text(r.get('points'))}</td>"
                     f"<td class='num'>{r['seconds']:.1f}</td><td>{esc(notes)}</td></tr>")
    for learner in missing:
        parts.append(f"<tr><td>{esc(learner)}</td><td></td><td class='num'></td>"
                     "<td class='num'></td><td class='num'></td>"
                     "<td class='v FAIL'>handed in nothing</td></tr>")
    parts.append("</table>")
    parts.extend(section(r) for r in results)
    parts.append("</body></html>\n")
    return "".join(parts)
