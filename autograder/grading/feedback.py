"""Feedback to each learner, in ``DIR/feedback/<learner>/``, a folder that can be handed to
that learner as it is:

* ``<lab>.ipynb``: their notebook as the grader ran it, each check's card in its output
  (written as the lab is graded);
* ``index.html``: one page with each lab's exercises, verdicts, causes and points.

Each page is made from that learner's own results and nothing else, so no folder holds
another learner's name, grade or code. The class's page (``gradebook.py``) is made of the
same sections, one per learner and lab.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from .cells import MARKER_LINE

FEEDBACK = "feedback"

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


def folder(out: Path, learner: str) -> Path:
    return out / FEEDBACK / learner


def keep_notebook(executed: Path, out: Path, learner: str, lab: str) -> None:
    """The notebook as graded, for its learner, without the lines the grader put at the top
    of each check cell (``cells.MARKER_LINE``)."""
    try:
        notebook = json.loads(executed.read_text())
    except (OSError, ValueError):
        return  # the notebook never ran to the end: the page says there is none
    for cell in notebook.get("cells", []):
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else source
        if text.startswith(MARKER_LINE):
            cell["source"] = text.split("\n", 1)[1] if "\n" in text else ""
    target = folder(out, learner) / f"{lab}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(notebook))
    partial.replace(target)


def fractions(grade: dict) -> tuple[str, str]:
    """(measured roofline fraction, predicted one), as text; "" where there is none."""
    perf = grade.get("performance") or {}
    measured = perf.get("roofline_fraction")
    predicted = perf.get("predicted_roofline_fraction")
    return (f"{measured:.3f}" if measured is not None else "",
            f"{predicted:.3f}" if predicted is not None else "")


def points_text(earned: dict | None) -> str:
    if not earned:
        return ""
    return f"{earned['earned']:g} / {earned['possible']:g}"


def section(result: dict, anchor: bool = True, notebook: str = "") -> str:
    """One learner's lab: what ran, what was put back, and each exercise's verdict,
    points, roofline fraction and message. ``notebook``: a link to the notebook as graded."""
    esc = html.escape
    r = result
    key = f"{r['learner']}--{r['lab']}"
    points = r.get("points") or {}
    head = (f"<h2{f' id={esc(key)!r}' if anchor else ''}>{esc(r['learner'])} · "
            f"{esc(r['lab'])}" + (f" · {points_text(points)} points" if points else "")
            + f"</h2><p class='note'>{esc(r['notebook'])}, {r['seconds']:.1f} s, "
            f"{esc(r.get('mode', ''))}{'' if r.get('confined', True) else ', <b>unconfined</b>'}"
            + (f", handed in {esc(r['submitted_iso'])} ({esc(r.get('submitted_from', ''))})"
               if r.get("submitted_iso") else "")
            + (f" · <a href='{esc(notebook)}'>the notebook as graded</a>" if notebook else "")
            + "</p>")
    parts = [head]
    if points.get("late"):
        parts.append(f"<div class='warn'><b>Late:</b> {esc(points['late'])}</div>")
    if points.get("pending"):
        parts.append(f"<div class='warn'><b>Pending a GPU:</b> "
                     f"{esc(', '.join(points['pending']))} compiled here, and earn their "
                     "points once graded on a GPU (rooflab grade --resume there).</div>")
    for line in r.get("changed", []):
        parts.append(f"<div class='warn'>Protected cell restored: {esc(line)}</div>")
    for line in r.get("problems", []):
        parts.append(f"<div class='warn'>{esc(line)}</div>")
    parts.append("<table><tr><th>exercise</th><th>verdict</th><th class='num'>points</th>"
                 "<th class='num'>roofline</th><th class='num'>time (s)</th><th>message</th>"
                 "</tr>")
    for g in r["grades"]:
        measured, guess = fractions(g)
        traffic = (g.get("performance") or {}).get("predicted_traffic_fraction")
        figure = measured or (f"{guess} (predicted)" if guess else "")
        if not measured and traffic is not None:  # what --speed-on-cpu predicted grades
            figure += f"<br>{traffic:.2f} in its traffic"
        why = (g.get("points") or {}).get("why", "")
        message = g["message"] + (f"\n[points: {why}]" if why and why != "not passed" else "")
        parts.append(f"<tr><td>{esc(g['exercise'])}</td><td class='v "
                     f"{esc(g['verdict'].split()[0])}'>{esc(g['verdict'])}</td>"
                     f"<td class='num'>{points_text(g.get('points'))}</td>"
                     f"<td class='num'>{figure}</td><td class='num'>{g['seconds']:.1f}</td>"
                     f"<td><div class='msg'>{esc(message)}</div></td></tr>")
    parts.append("</table>")
    return "".join(parts)


def page(learner: str, results: list[dict], out: Path) -> str:
    """A learner's own page: every lab of theirs in ``results`` (which must all be theirs)."""
    assert all(r["learner"] == learner for r in results)
    esc = html.escape
    earned = sum((r.get("points") or {}).get("earned", 0) for r in results)
    possible = sum((r.get("points") or {}).get("possible", 0) for r in results)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>rooflab feedback: "
             f"{esc(learner)}</title><style>{STYLE}</style></head><body>"
             f"<h1>Feedback for {esc(learner)}</h1><p class='note'>{len(results)} "
             f"lab{'s' * (len(results) != 1)} graded, {earned:g} of {possible:g} points. "
             "Each exercise was decided by the grader, outside your notebook, with every "
             "answer checked again; the notebook beside this page shows what your checks "
             "showed when it ran.</p>"]
    for result in results:
        here = folder(out, learner) / f"{result['lab']}.ipynb"
        parts.append(section(result, anchor=False,
                             notebook=here.name if here.exists() else ""))
    parts.append("</body></html>\n")
    return "".join(parts)


def write_pages(out: Path, results: list[dict], write) -> list[Path]:
    """``index.html`` in each learner's folder, from their results alone; ``write(path,
    text)`` writes a file whole."""
    by_learner: dict[str, list[dict]] = {}
    for result in results:
        by_learner.setdefault(result["learner"], []).append(result)
    written = []
    for learner, theirs in by_learner.items():
        path = folder(out, learner) / "index.html"
        write(path, page(learner, theirs, out))
        written.append(path)
    return written
