"""`rooflab build`: one master per lab makes the learner's and the solved notebook."""

import json
import shutil
from pathlib import Path

import pytest

from rooflab.autograder.cli import EXIT_FAIL, EXIT_PASS, main
from rooflab.autograder.course import build

ROOT = Path(__file__).resolve().parents[1]

MASTER = """\
---
kernelspec:
  name: python3
  display_name: Python 3
---

# A lab

Some prose.

```{code-cell} ipython3
import math
```

More prose.
+++
A second markdown cell.

```{code-cell} ipython3
:tags: [check, nbval-ignore-output]
def area(r):
    ### BEGIN SOLUTION
    return math.pi * r * r
    ### END SOLUTION
```
"""


def test_read_master_splits_cells_and_reads_tags():
    cells = build.read_master(MASTER)
    assert [c.kind for c in cells] == ["markdown", "code", "markdown", "markdown", "code"]
    assert cells[0].source == "# A lab\n\nSome prose."
    assert cells[3].source == "A second markdown cell."
    assert cells[4].tags == ["check", "nbval-ignore-output"]
    assert cells[4].source.startswith("def area(r):")


def test_stub_keeps_indentation_and_solution_drops_markers():
    source = build.read_master(MASTER)[4].source
    assert build.stub(source) == (
        "def area(r):\n    # YOUR CODE HERE\n    raise NotImplementedError()")
    assert build.solution(source) == "def area(r):\n    return math.pi * r * r"


def test_unclosed_solution_region_is_an_error():
    with pytest.raises(ValueError, match="without"):
        build.stub("### BEGIN SOLUTION\nx = 1")


def test_inline_brings_the_kernel_from_kernels_with_its_decorator_and_markers():
    source = build.inline("# rooflab-inline: rooflab.kernels.vector_add:add_kernel,vector_add")
    assert source.startswith("@triton.jit\ndef add_kernel(")
    assert "### END SOLUTION" in source  # the trailing marker comment comes along
    assert "\n\n\ndef vector_add(" in source
    learner = build.stub(source)
    assert "tl.load" not in learner and "raise NotImplementedError()" in learner
    assert "def vector_add(" in learner  # the wrapper is given, the kernel body is the task


def test_inline_names_a_missing_definition():
    with pytest.raises(KeyError, match="no top-level nothing_here"):
        build.inline("# rooflab-inline: rooflab.kernels.vector_add:nothing_here")


def test_notebooks_are_deterministic_and_without_outputs():
    cells = build.read_master(MASTER)
    first = build.notebook_json(cells, "07_demo", learner=True)
    assert first == build.notebook_json(cells, "07_demo", learner=True)
    notebook = json.loads(first)
    assert notebook["nbformat"] == 4 and notebook["nbformat_minor"] == 5
    ids = [c["id"] for c in notebook["cells"]]
    assert len(set(ids)) == len(ids)
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    # The master's tags, and "solution" on the cell with a solution region (the one a
    # grader takes from a submission), in either notebook.
    assert code[0]["metadata"] == {}
    assert code[1]["metadata"]["tags"] == ["check", "nbval-ignore-output", "solution"]
    solved = json.loads(build.notebook_json(cells, "07_demo", learner=False))
    assert [c["metadata"] for c in solved["cells"]] == [c["metadata"] for c in notebook["cells"]]


def test_committed_notebooks_match_their_masters():
    """Editing a master without rebuilding fails here."""
    assert build.masters(ROOT), "no lab masters found"
    stale = build.build(ROOT, check_only=True)
    assert not stale, f"stale notebooks (run `rooflab build`): {stale}"


def test_build_check_fails_after_a_master_changes(tmp_path, capsys):
    for folder in ("book", "labs", "solutions"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    assert main(["build", "--check", "--root", str(tmp_path)]) == EXIT_PASS
    master = build.masters(tmp_path)[0]
    master.write_text(master.read_text() + "\nOne more sentence.\n")
    assert main(["build", "--check", "--root", str(tmp_path)]) == EXIT_FAIL
    assert "stale: labs/" in capsys.readouterr().out
    assert main(["build", "--root", str(tmp_path)]) == EXIT_PASS  # rebuild
    assert main(["build", "--check", "--root", str(tmp_path)]) == EXIT_PASS


# --- the outputs recorded for the book (`make record`, book/recorded/) ---------------------


def _code(cell_id: str, source: str, outputs: list, tags: tuple[str, ...] = ()) -> dict:
    return {"cell_type": "code", "id": cell_id, "source": source, "outputs": outputs,
            "execution_count": None, "metadata": {"tags": list(tags)} if tags else {}}


def test_a_recording_lays_what_a_page_can_show_on_the_learners_unchanged_cells():
    from rooflab.autograder.course import record

    figure = {"data": [], "layout": {"title": {"text": "Roofline"}, "height": 300}}
    printed = [{"output_type": "stream", "name": "stdout", "text": "ridge "},
               {"output_type": "stream", "name": "stdout", "text": "at 20\n"}]
    widget = {"output_type": "display_data", "metadata": {}, "data": {
        "text/plain": "interactive(...)",
        record.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0}}}
    state = {"box": {"model_name": "VBoxModel",
                     "state": {"children": ["IPY_MODEL_pick", "IPY_MODEL_out"]}},
             "pick": {"model_name": "DropdownModel", "state": {
                 "description": "card", "index": 1, "_options_labels": ["H100", "L4"]}},
             "out": {"model_name": "OutputModel", "state": {"outputs": [
                 {"output_type": "display_data", "metadata": {},
                  "data": {record.PLOTLY: figure}}]}}}
    run = {"metadata": {"widgets": {record.WIDGET_STATE: {"state": state}}}, "cells": [
        _code("a", "plot()", [*printed, {"output_type": "display_data", "metadata": {},
                                         "data": {record.PLOTLY: figure}}]),
        _code("b", "def f():\n    return 42", [{"output_type": "stream", "name": "stdout",
                                                 "text": "the answer\n"}], ("solution",)),
        _code("c", "check()", [{"output_type": "error", "ename": "E", "evalue": "",
                                "traceback": []},
                               {"output_type": "display_data", "metadata": {}, "data": {
                                   "text/html": "<script>x()</script>",
                                   "text/plain": "<IPython.core.display.HTML object>"}}]),
        _code("d", "explore_widget()", [widget])]}
    learner = {"metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4,
               "nbformat_minor": 5, "cells": [
                   {"cell_type": "markdown", "id": "m", "source": "# Lab", "metadata": {}},
                   *[_code(c["id"], c["source"], [], tuple(c["metadata"].get("tags", [])))
                     for c in run["cells"]]]}
    stub_source = "def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    learner["cells"][2]["source"] = stub_source

    def draw(fig: dict) -> str:
        return f"<svg>{record.chart_title(fig)}</svg>"

    about = {"name": "cpu", "measured": False, "date": "2026-11-27"}
    notebook = record.learner_with_outputs(learner, run, draw, about)
    plot, stub, check, explore = notebook["cells"][1:]
    assert plot["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": "ridge at 20\n"},
        {"output_type": "display_data", "data": {"image/svg+xml": "<svg>Roofline</svg>",
                                                 "text/plain": "Chart: Roofline"},
         "metadata": {"image/svg+xml": {"width": record.CHART_WIDTH, "height": 300}}}]
    assert stub["outputs"] == [] and "YOUR CODE HERE" in stub["source"]  # no answer shown
    assert check["outputs"] == []  # the error, and HTML that needs a script, left out
    note, chart = explore["outputs"]
    assert "first drawn: card = L4." in note["data"]["text/plain"]
    assert chart["data"]["image/svg+xml"] == "<svg>Roofline</svg>"
    assert notebook["metadata"]["rooflab"]["recorded"] == about
    assert "widgets" not in notebook["metadata"]
    assert json.loads(record.notebook_text(notebook)) == notebook


def test_the_committed_recordings_are_learner_notebooks_with_their_origin():
    recorded = sorted((ROOT / "book" / "recorded").glob("[0-9][0-9]_*.ipynb"))
    labs = {p.name for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb")}
    assert recorded and {p.name for p in recorded} <= labs
    assert sum(p.stat().st_size for p in recorded) < 4 * 2**20  # the book stays light
    for path in recorded:
        notebook = json.loads(path.read_text())
        about = notebook["metadata"]["rooflab"]["recorded"]
        assert {"date", "measured", "name"} <= set(about), path.name
        for cell in notebook["cells"]:
            if "solution" in cell.get("metadata", {}).get("tags", []):
                assert cell["outputs"] == [], f"{path.name} {cell['id']}: outputs on a stub"
