"""The book's theme (book/theme/, Node's standard library only), called directly with node:
where a lab's launch button points, and which recorded outputs a lab page shows. No
browser and no built book needed; skipped where node is missing."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

THEME = Path(__file__).resolve().parents[2] / "book" / "theme"
FRONTMATTER = {"kernelspec": {"name": "python3"},
               "exports": [{"format": "ipynb", "filename": "00_roofline.ipynb",
                            "url": "/00_roofline-abc.ipynb"}]}
LOCAL = "http://localhost:8888/lab/tree/"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="no node (make book needs it)")


def node(expression: str, env: dict[str, str] | None = None):
    """The value of a JavaScript expression over the theme's server module, `s`."""
    script = f"const s = require('./server.js'); console.log(JSON.stringify({expression}));"
    environment = {k: v for k, v in os.environ.items() if k != "ROOFLAB_JUPYTERLAB_URL"}
    done = subprocess.run(["node", "-e", script], cwd=THEME, env={**environment, **(env or {})},
                          capture_output=True, text=True, timeout=30, check=True)
    return json.loads(done.stdout)


def launch_box(options: dict, env: dict[str, str] | None = None) -> str:
    return node(f"s.launchBox({json.dumps(FRONTMATTER)}, {json.dumps(options)}, null)", env)


def test_the_launch_button_goes_where_myst_yml_says():
    box = launch_box({"jupyterlab_url": LOCAL})
    assert f'href="{LOCAL}00_roofline.ipynb"' in box
    assert "make lab" in box and "localhost:8888" in box


def test_the_environment_points_the_launch_button_at_a_hub_or_removes_it():
    hub = "https://hub.example.edu/hub/user-redirect/lab/tree/rooflab/labs/"
    box = launch_box({"jupyterlab_url": LOCAL}, {"ROOFLAB_JUPYTERLAB_URL": hub})
    assert f'href="{hub}00_roofline.ipynb"' in box
    assert "hub.example.edu" in box and "make lab</code> starts on" not in box
    for off in ("none", ""):
        box = launch_box({"jupyterlab_url": LOCAL}, {"ROOFLAB_JUPYTERLAB_URL": off})
        assert "launch-link" not in box and "Download the notebook" in box
    assert "launch-link" not in launch_box({})


def _cell(source: str, outputs: list) -> dict:
    return {"cell_type": "code", "source": source, "outputs": outputs, "metadata": {}}


def test_a_lab_page_shows_recorded_outputs_only_under_the_code_they_came_from():
    chart = {"output_type": "display_data", "metadata": {},
             "data": {"image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg'/>",
                      "text/plain": "Chart: Roofline"}}
    printed = {"output_type": "stream", "name": "stdout", "text": "ridge at 20 <FLOP/byte>\n"}
    notebook = {"metadata": {"rooflab": {"recorded": {"measured": False, "date": "2026-11-27"}}},
                "cells": [_cell("roofline_figure(roof)\n", [printed, chart]),
                          _cell("print(1)", [printed]), _cell("print(1)", [])]}
    shown = node(f"""(() => {{
      const {{ output }} = require('./render.js');
      const r = s.recordedOutputs({json.dumps(notebook)});
      const html = (code) => r.outputsFor(code).map(output).join('');
      return [html('roofline_figure(roof)'), html('roofline_figure(roof, changed)'),
              html('print(1)'), html('print(1)'),
              s.launchBox({json.dumps(FRONTMATTER)}, {{}}, r)];
    }})()""")
    same, changed, first_twin, second_twin, box = shown
    assert '<img class="chart" src="data:image/svg+xml;base64,' in same
    assert 'alt="Chart: Roofline"' in same and "ridge at 20 &lt;FLOP/byte&gt;" in same
    assert changed == "" and "ridge" in first_twin and second_twin == ""
    assert "Recorded on a CPU on 2026-11-27: times are predictions." in box
