"""Recorded outputs for the book: each solved notebook run once, its outputs laid on the
learner's cells, so that the website shows the course's charts and check cards.

``python -m rooflab.autograder.course.record`` (``make record``) runs every
``solutions/NN_topic.ipynb`` with nbclient and writes ``book/recorded/NN_topic.ipynb``:
the learner's notebook, each cell with the outputs of the cell of the same id in the run,
where the two cells hold the same code. A cell the learner writes (a stub in the
learner's notebook) gets no outputs, so no solution shows on the site. What the page
cannot show is changed on the way:

* a plotly chart (``application/vnd.plotly.v1+json``, drawn by plotly.js in JupyterLab)
  becomes an SVG picture, drawn by plotly.js in headless Chromium (Playwright's, the
  browser tests' ``/usr/bin/chromium``; ``ROOFLAB_CHROMIUM`` names another);
* an interactive widget becomes a line naming its first choice, then what it drew for it;
* errors and anything that needs JavaScript are left out.

The notebook's metadata says where and when it ran (``metadata.rooflab.recorded``): the
book labels its outputs with it. Without a GPU the solutions run in Triton's interpreter,
and their numbers are predictions; a run on a GPU records measurements.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# What a static page can show, best first; anything else in an output is dropped.
SHOWN = ("image/svg+xml", "image/png", "image/jpeg", "text/html", "text/plain")
CHART_WIDTH = 760  # pixels: the width of the book's column of text
CHROMIUM = os.environ.get("ROOFLAB_CHROMIUM", "/usr/bin/chromium")
# Run in the kernel after the notebook: the device the outputs were made on.
DEVICE_PROBE = """\
import json as _json
from rooflab.autograder import current_device as _current_device
_device = _current_device()
print(_json.dumps({"name": _device.name, "measured": _device.can_measure, "mode": _device.mode}))
"""

Output = dict[str, Any]
Notebook = dict[str, Any]
DrawChart = Callable[[dict], str]  # a plotly figure (as JSON) -> an SVG document


@dataclass
class Recorded:
    """What one lab's recording holds, for the command's report."""

    lab: str
    seconds: float
    device: dict
    cells_with_outputs: int = 0
    charts: int = 0
    errors: list[str] = field(default_factory=list)


# --- from a run's outputs to what a static page shows -------------------------------------


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def chart_title(figure: dict) -> str:
    title = figure.get("layout", {}).get("title", "")
    if isinstance(title, dict):
        title = title.get("text", "")
    return str(title) or "a chart"


def chart_output(figure: dict, draw: DrawChart) -> Output:
    """A plotly figure as an SVG picture; its title is the text a reader without images
    (and the page's alt text) gets."""
    layout = figure.get("layout", {})
    return {
        "output_type": "display_data",
        "data": {"image/svg+xml": draw(figure), "text/plain": f"Chart: {chart_title(figure)}"},
        "metadata": {"image/svg+xml": {"width": layout.get("width", CHART_WIDTH),
                                       "height": layout.get("height", 450)}},
    }


def _widget_models(state: dict, model_id: str) -> list[dict]:
    """The widget's model and every model under it, depth first."""
    model = state.get(model_id)
    if model is None:
        return []
    found = [model]
    for child in model.get("state", {}).get("children", []):
        found += _widget_models(state, str(child).removeprefix("IPY_MODEL_"))
    return found


def _choice(widget: dict) -> str | None:
    """'card = H100 SXM' for a control with a description and a value; None otherwise."""
    state = widget.get("state", {})
    name = state.get("description")
    if not name or "OutputModel" in widget.get("model_name", ""):
        return None
    labels, index = state.get("_options_labels"), state.get("index")
    value = labels[index] if labels is not None and isinstance(index, int) else state.get("value")
    return None if value is None else f"{name} = {value}"


def widget_outputs(view: dict, state: dict, draw: DrawChart) -> list[Output]:
    """An interactive widget, still: a line with the choice it first showed, then what its
    output areas drew for that choice."""
    models = _widget_models(state, view.get("model_id", ""))
    choices = [c for c in map(_choice, models) if c]
    line = "Interactive in JupyterLab; shown here as first drawn"
    line += f": {', '.join(choices)}." if choices else "."
    note = {"output_type": "display_data", "metadata": {},
            "data": {"text/html": f'<p class="widget-note">{html.escape(line)}</p>',
                     "text/plain": line}}
    drawn = [out for model in models if "OutputModel" in model.get("model_name", "")
             for out in model.get("state", {}).get("outputs", [])]
    return [note, *book_outputs(drawn, state, draw)]


def _shown_data(data: dict) -> dict:
    shown = {mime: data[mime] for mime in SHOWN if mime in data}
    if "<script" in _text(shown.get("text/html", "")).lower():
        del shown["text/html"]  # the book's pages run no JavaScript
    if set(shown) == {"text/plain"} and _text(shown["text/plain"]).startswith("<IPython"):
        return {}  # the repr of a display object whose real form was dropped
    return shown


def book_output(output: Output, state: dict, draw: DrawChart) -> list[Output]:
    """One output of the run as the outputs a static page shows: none, one or several."""
    kind = output.get("output_type")
    if kind == "stream":
        return [{"output_type": "stream", "name": output["name"], "text": _text(output["text"])}]
    if kind not in ("display_data", "execute_result"):
        return []  # an error: the recording leaves it out, and the command reports it
    data = output.get("data", {})
    if PLOTLY in data:
        return [chart_output(data[PLOTLY], draw)]
    if WIDGET_VIEW in data:
        return widget_outputs(data[WIDGET_VIEW], state, draw)
    shown = _shown_data(data)
    if not shown:
        return []
    kept = {"output_type": "display_data", "data": shown,
            "metadata": {m: v for m, v in output.get("metadata", {}).items() if m in shown}}
    return [kept]


def book_outputs(outputs: list[Output], state: dict, draw: DrawChart) -> list[Output]:
    """A cell's outputs for the book, with consecutive writes to one stream joined."""
    shown: list[Output] = []
    for output in outputs:
        for out in book_output(output, state, draw):
            last = shown[-1] if shown else None
            if (out["output_type"] == "stream" and last and last["output_type"] == "stream"
                    and last["name"] == out["name"]):
                last["text"] += out["text"]
            else:
                shown.append(out)
    return shown


def learner_with_outputs(learner: Notebook, run: Notebook, draw: DrawChart,
                         recorded: dict) -> Notebook:
    """The learner's notebook, each code cell with the outputs of the run's cell of the same
    id where both hold the same code (a stub gets none: no solution is shown)."""
    state = run.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    ran = {cell.get("id"): cell for cell in run["cells"]}
    cells = []
    for cell in learner["cells"]:
        cell = dict(cell)
        twin = ran.get(cell.get("id"))
        if cell["cell_type"] == "code":
            same = twin is not None and _text(twin["source"]) == _text(cell["source"])
            cell["outputs"] = book_outputs(twin.get("outputs", []), state, draw) if same else []
            cell["execution_count"] = None
        cells.append(cell)
    metadata = {**learner.get("metadata", {}), "rooflab": {"recorded": recorded}}
    return {**learner, "cells": cells, "metadata": metadata}


def notebook_text(notebook: Notebook) -> str:
    """As `rooflab build` writes notebooks: one-space indents, sorted keys."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


# --- running the solved notebooks ---------------------------------------------------------


class ChartDrawer:
    """Draws plotly figures as SVG with plotly.js (the copy inside the plotly package) in
    one headless Chromium, opened for as many charts as are drawn in between."""

    def __enter__(self) -> ChartDrawer:
        import plotly
        from playwright.sync_api import sync_playwright

        if not os.access(CHROMIUM, os.X_OK):
            raise SystemExit(f"recording draws its charts in Chromium: none at {CHROMIUM} "
                             "(apt-get install chromium, or set ROOFLAB_CHROMIUM)")
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        self._page = self._browser.new_page()
        self._page.set_content("<!DOCTYPE html><html><body></body></html>")
        self._page.add_script_tag(path=str(Path(plotly.__file__).parent / "package_data"
                                           / "plotly.min.js"))
        return self

    def __exit__(self, *exc: object) -> None:
        self._browser.close()
        self._playwright.stop()

    def __call__(self, figure: dict) -> str:
        layout = figure.get("layout", {})
        return self._page.evaluate(
            """async ([figure, size]) => {
                 const url = await Plotly.toImage(
                   {data: figure.data || [], layout: figure.layout || {}},
                   {format: 'svg', width: size[0], height: size[1]});
                 return decodeURIComponent(url.slice(url.indexOf(',') + 1));
               }""",
            [figure, [layout.get("width", CHART_WIDTH), layout.get("height", 450)]])


def run_notebook(path: Path, timeout: int) -> tuple[Notebook, dict]:
    """Every cell of the notebook run in a fresh kernel, in its folder, past any error; and
    the device it ran on, as the course sees it."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(DEVICE_PROBE))
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            allow_errors=True, resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    probe = notebook.cells.pop()
    lines = "".join(o.get("text", "") for o in probe.outputs if o.output_type == "stream")
    device = json.loads(lines.strip().splitlines()[-1]) if lines.strip() else {}
    return json.loads(nbformat.writes(notebook)), device


def errors_of(run: Notebook) -> list[str]:
    return [f"cell {cell.get('id')}: {out.get('ename')}: {out.get('evalue')}"
            for cell in run["cells"] for out in cell.get("outputs", [])
            if out.get("output_type") == "error"]


def record_lab(root: Path, lab: str, out: Path, draw: DrawChart, timeout: int) -> Recorded:
    """Run solutions/<lab>.ipynb and write <out>/<lab>.ipynb."""
    started = time.monotonic()
    run, device = run_notebook(root / "solutions" / f"{lab}.ipynb", timeout)
    seconds = time.monotonic() - started
    recorded = {**device, "date": datetime.date.today().isoformat(),
                "seconds": round(seconds)}
    learner = json.loads((root / "labs" / f"{lab}.ipynb").read_text())
    notebook = learner_with_outputs(learner, run, draw, recorded)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{lab}.ipynb").write_text(notebook_text(notebook))
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    return Recorded(lab, seconds, device,
                    cells_with_outputs=sum(bool(c["outputs"]) for c in code),
                    charts=sum("image/svg+xml" in o.get("data", {})
                               for c in code for o in c["outputs"]),
                    errors=errors_of(run))


def labs_in(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "solutions").glob("[0-9][0-9]_*.ipynb"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rooflab.autograder.course.record",
        description="Run the solved notebooks and record their outputs for the book.")
    parser.add_argument("labs", nargs="*", help="labs to record, e.g. 00_roofline (all)")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the course's checkout")
    parser.add_argument("--out", type=Path, help="where to write (ROOT/book/recorded)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a cell may take")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    out = args.out or root / "book" / "recorded"
    labs = args.labs or labs_in(root)
    failed = False
    with ChartDrawer() as draw:
        for lab in labs:
            done = record_lab(root, lab, out, draw, args.timeout)
            print(f"{lab}: {done.seconds:.0f} s on {done.device.get('mode', '?')}; "
                  f"outputs under {done.cells_with_outputs} cells, charts: {done.charts}")
            for error in done.errors:
                failed = True
                print(f"  left out, an error: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
