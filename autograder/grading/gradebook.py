"""The gradebook: one result file per learner and lab as it is graded, and from them the
views an instructor and CI read: JSON, CSV, an HTML page, JUnit XML.

Every file is written whole or not at all (written beside, then renamed), so an
interrupted grading leaves only complete results, and ``--resume`` trusts what it finds.
Shards of one class (``--shard i/n``) each write their results; ``merge`` joins them.

A roster (``--roster``, a CSV whose first column is the learner) lets the views name the
learners who handed in nothing, and those graded who are not on it.
"""

from __future__ import annotations

import csv
import html
import io
import json
import shutil
from pathlib import Path
from xml.etree import ElementTree

RESULTS = "results"  # one <learner>--<lab>.json each


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def result_path(out: Path, learner: str, lab: str) -> Path:
    return out / RESULTS / f"{learner}--{lab}.json"


def graded(out: Path, learner: str, lab: str) -> bool:
    """Whether this learner's lab has a result that graded it (``--resume`` skips it); a
    result that says it was not graded, for a clash of notebooks, does not count."""
    try:
        return not json.loads(result_path(out, learner, lab).read_text()).get("clash")
    except (OSError, ValueError):
        return False


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
    try:
        rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"--roster {path}: {error}") from None
    names = [row[0].strip() for row in rows if row and row[0].strip()]
    if names and names[0].lower() == "learner":
        names = names[1:]
    if not names:
        raise ValueError(f"--roster {path}: no learner in it (the first column names them)")
    return list(dict.fromkeys(names))  # each once, in the roster's order


def against_roster(results: list[dict], roster: list[str]) -> tuple[list[str], list[str]]:
    """(the roster's learners without any result, the learners graded but not on it)."""
    seen = {r["learner"] for r in results}
    return [name for name in roster if name not in seen], sorted(seen - set(roster))


def write_views(out: Path, roster: list[str] | None = None) -> list[Path]:
    """gradebook.json, .csv, .html and junit.xml from every result in ``out``; with a
    roster, they also name who handed in nothing and who is not on it."""
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
    }
    for name, text in views.items():
        write_atomic(out / name, text)
    return [out / name for name in views]


def merge(shards: list[Path], out: Path, roster: list[str] | None = None) -> list[Path]:
    """Join the results of several shards into ``out`` and write its views. Raises
    ValueError, before copying anything, where a shard folder does not exist (a mistyped
    folder, a job that never ran), or where two shards hold one learner's lab. A shard
    with no result is fine: with more shards than notebooks, some get none."""
    owner: dict[str, Path] = {}  # result file name: the shard it comes from
    for shard in shards:
        if not shard.is_dir():
            raise ValueError(f"--merge: the shard folder {shard} does not exist")
        for path in sorted((shard / RESULTS).glob("*.json")):
            if path.name in owner:
                raise ValueError(f"--merge: {path.stem} is in two shards, {owner[path.name]} "
                                 f"and {shard}: each learner's lab belongs to one shard")
            owner[path.name] = shard
    for name, shard in owner.items():
        target = out / RESULTS / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not (target.exists() and target.samefile(shard / RESULTS / name)):
            shutil.copyfile(shard / RESULTS / name, target)
    return write_views(out, roster)


def _fraction(grade: dict) -> tuple[str, str]:
    """(measured roofline fraction, predicted one), as text; "" where there is none."""
    perf = grade.get("performance") or {}
    measured = perf.get("roofline_fraction")
    predicted = perf.get("predicted_roofline_fraction")
    return (f"{measured:.3f}" if measured is not None else "",
            f"{predicted:.3f}" if predicted is not None else "")


COLUMNS = ["learner", "lab", "exercise", "verdict", "points", "roofline_fraction",
           "predicted_roofline_fraction", "check_seconds", "notebook_seconds", "message"]


def _csv(results: list[dict], missing: list[str]) -> str:
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(COLUMNS)
    for result in results:
        for grade in result["grades"]:
            measured, predicted = _fraction(grade)
            writer.writerow([result["learner"], result["lab"], grade["exercise"],
                             grade["verdict"], int(grade["verdict"] == "PASS"), measured,
                             predicted, grade["seconds"], result["seconds"],
                             grade["message"].splitlines()[0] if grade["message"] else ""])
    for learner in missing:  # on the roster, and no result: a row, so no one is forgotten
        writer.writerow([learner, "", "", "MISSING", 0, "", "", "", "", "handed in nothing"])
    return text.getvalue()


def _junit(results: list[dict]) -> str:
    suites = ElementTree.Element("testsuites", name="rooflab grade")
    for result in results:
        grades = result["grades"]
        failed = [g for g in grades if g["verdict"] != "PASS"]
        suite = ElementTree.SubElement(
            suites, "testsuite", name=f"{result['learner']}.{result['lab']}",
            tests=str(len(grades)), failures=str(len(failed)), errors="0",
            time=f"{result['seconds']:.3f}")
        for grade in grades:
            case = ElementTree.SubElement(suite, "testcase", classname=result["learner"],
                                          name=grade["exercise"], time=f"{grade['seconds']:.3f}")
            if grade["verdict"] != "PASS":
                failure = ElementTree.SubElement(case, "failure",
                                                 message=grade["message"][:200])
                failure.text = grade["message"]
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 72rem;
       color: #1f2328; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.note { color: #57606a; margin: .2rem 0 1rem; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #d0d7de;
         vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.v { font-weight: 600; white-space: nowrap; }
.PASS { color: #1a7f37; } .FAIL { color: #cf222e; } .NOT { color: #9a6700; }
.NEEDS { color: #0969da; }
.msg { font-family: ui-monospace, monospace; font-size: 12.5px; white-space: pre-wrap;
       max-height: 7.5em; overflow: auto; color: #424a53; }
.warn { background: #fff8c5; border: 1px solid #d4a72c; padding: .4rem .6rem;
        border-radius: 6px; margin: .4rem 0; }
"""


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
    parts.append("<table><tr><th>learner</th><th>lab</th><th class='num'>passed</th>"
                 "<th class='num'>time (s)</th><th>notes</th></tr>")
    for r in results:
        passed = sum(g["verdict"] == "PASS" for g in r["grades"])
        notes = "; ".join([*r.get("changed", []), *r.get("problems", [])][:3])
        parts.append(f"<tr><td><a href='#{esc(r['learner'])}--{esc(r['lab'])}'>"
                     f"{esc(r['learner'])}</a></td><td>{esc(r['lab'])}</td>"
                     f"<td class='num'>{passed} / {len(r['grades'])}</td>"
                     f"<td class='num'>{r['seconds']:.1f}</td><td>{esc(notes)}</td></tr>")
    for learner in missing:
        parts.append(f"<tr><td>{esc(learner)}</td><td></td><td class='num'></td>"
                     "<td class='num'></td><td class='v FAIL'>handed in nothing</td></tr>")
    parts.append("</table>")
    for r in results:
        parts.append(f"<h2 id='{esc(r['learner'])}--{esc(r['lab'])}'>{esc(r['learner'])} · "
                     f"{esc(r['lab'])}</h2><p class='note'>{esc(r['notebook'])}, "
                     f"{r['seconds']:.1f} s, {esc(r.get('mode', ''))}"
                     f"{'' if r.get('confined', True) else ', <b>unconfined</b>'}</p>")
        for line in r.get("changed", []):
            parts.append(f"<div class='warn'>Protected cell restored: {esc(line)}</div>")
        for line in r.get("problems", []):
            parts.append(f"<div class='warn'>{esc(line)}</div>")
        parts.append("<table><tr><th>exercise</th><th>verdict</th><th class='num'>roofline"
                     "</th><th class='num'>time (s)</th><th>message</th></tr>")
        for g in r["grades"]:
            measured, guess = _fraction(g)
            figure = measured or (f"{guess} (predicted)" if guess else "")
            parts.append(f"<tr><td>{esc(g['exercise'])}</td><td class='v "
                         f"{esc(g['verdict'].split()[0])}'>{esc(g['verdict'])}</td>"
                         f"<td class='num'>{figure}</td><td class='num'>{g['seconds']:.1f}</td>"
                         f"<td><div class='msg'>{esc(g['message'])}</div></td></tr>")
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "".join(parts)
