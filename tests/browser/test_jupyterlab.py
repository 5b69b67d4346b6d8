"""Lab 00 in a real browser: JupyterLab started as `make lab` starts it, the learner's
notebook run whole through the UI (after `explore()`, which lets Run All pass the checks
not yet solved), and what a learner would see checked: the roofline chart (plotly), the
interactive roofline (ipywidgets) answering a change, a check card for every check, and
a browser console without errors.

That Run All reached the last cell is read from the notebook itself, saved through the
UI and fetched through Jupyter's contents API: JupyterLab does not render the prompts of
cells scrolled out of view, so the page alone cannot say. JupyterLab serves a copy of
labs/, so the save changes nothing in the repository."""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = "00_roofline.ipynb"
JUPYTER = Path(sys.executable).parent / "jupyter"

pytestmark = pytest.mark.browser

# JupyterLab settings for the test's own settings folder: nothing is saved to labs/ (no
# autosave), every cell stays in the page (no windowing) so that all can be looked at, and
# nothing is fetched from the internet.
SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                     "checkForUpdates": False},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Run All of lab 00 takes about 15 s alone on 2 cores; on a loaded CI machine, many times
# that. The limit is for a hang, not a slow machine.
RUN_ALL_LIMIT_S = 900


@pytest.fixture
def jupyterlab(tmp_path):
    """`make lab`'s command (jupyter lab --notebook-dir=labs) on a copy of labs/, headless
    on a free port with a token; yields (base url, token)."""
    if not JUPYTER.exists():
        pytest.skip(f"no JupyterLab at {JUPYTER} (make test installs it)")
    for plugin, values in SETTINGS.items():
        path = tmp_path / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    # The kernel must not think it runs under pytest: explore() is ignored there.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env.update(JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    shutil.copytree(ROOT / "labs", tmp_path / "labs")
    command = [str(JUPYTER), "lab", f"--notebook-dir={tmp_path / 'labs'}", "--no-browser",
               "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}",
               # The checkpoint JupyterLab makes on opening goes to tmp_path, not labs/.
               f"--FileCheckpoints.checkpoint_dir={tmp_path / 'checkpoints'}"]
    if os.getuid() == 0:
        command.append("--allow-root")
    log = (tmp_path / "jupyterlab.log").open("wb")
    lab = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if lab.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n"
                                + (tmp_path / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield base, token
    finally:
        os.killpg(lab.pid, signal.SIGTERM)  # the server shuts its kernels down
        try:
            lab.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
        log.close()


def _check_ids(notebook: Path) -> set[str]:
    """The problem ids of the notebook's check cells."""
    cells = json.loads(notebook.read_text())["cells"]
    return {match for cell in cells if cell["cell_type"] == "code"
            for match in re.findall(r'check\("([^"]+)"', "".join(cell["source"]))}


def _saved_code_cells(base: str, token: str) -> list[dict]:
    """The notebook's code cells as JupyterLab last saved it, through the contents API."""
    with urllib.request.urlopen(f"{base}/api/contents/{LAB}?content=1&token={token}",
                                timeout=30) as reply:
        notebook = json.load(reply)["content"]
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def _run_all_finished(page, base: str, token: str) -> list[dict]:
    """Wait until Run All has run every code cell: the kernel idle, and the notebook,
    saved through the UI, holding an execution count in each code cell. Returns them."""
    deadline = time.monotonic() + RUN_ALL_LIMIT_S
    while True:
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                               timeout=RUN_ALL_LIMIT_S * 1000)
        page.keyboard.press("Control+s")
        page.wait_for_timeout(1000)  # the save is a request of its own
        cells = _saved_code_cells(base, token)
        if cells and all(cell["execution_count"] is not None for cell in cells):
            return cells
        if time.monotonic() > deadline:
            ran = sum(cell["execution_count"] is not None for cell in cells)
            pytest.fail(f"Run All ran {ran} of {len(cells)} code cells in "
                        f"{RUN_ALL_LIMIT_S} s")
        page.wait_for_timeout(2000)


def _outputs_text(cell: dict) -> str:
    """What a saved cell shows: its streams, and its HTML and plain text results."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append("".join(output.get("text", "")))
        data = output.get("data", {})
        parts.append("".join(data.get("text/html", data.get("text/plain", ""))))
    return "".join(parts)


def test_lab_00_runs_in_jupyterlab_with_its_chart_widget_and_check_cards(
        page, jupyterlab, screenshot):  # page first: no JupyterLab started without Chromium
    base, token = jupyterlab
    notebook = ROOT / "labs" / LAB
    as_shipped = notebook.read_bytes()

    page.goto(f"{base}/lab/tree/{LAB}?token={token}")
    panel = page.locator(".jp-NotebookPanel")
    cells = panel.locator(".jp-CodeCell")
    shipped_cells = sum(cell["cell_type"] == "code"
                        for cell in json.loads(as_shipped)["cells"])
    page.wait_for_function(  # every cell rendered, and the kernel started
        f"""() => document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell').length
                 === {shipped_cells}
              && document.querySelector(
                 ".jp-Notebook-ExecutionIndicator[data-status='idle']") !== null""",
        timeout=120_000, polling=250)

    # explore() in a new cell right after the first, which imports it: through the UI.
    cells.first.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.type("explore()")
    page.keyboard.press("Escape")
    assert cells.count() == shipped_cells + 1
    assert cells.nth(1).locator(".jp-InputArea-editor").inner_text().strip() == "explore()"

    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    # The kernel turns busy first, or the idle indicator would end the wait at once.
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator:not([data-status='idle'])",
                           timeout=60_000)
    saved = _run_all_finished(page, base, token)
    assert len(saved) == shipped_cells + 1
    counts = [cell["execution_count"] for cell in saved]
    assert counts == sorted(counts), counts  # top to bottom, each once
    assert "".join(saved[1]["source"]).strip() == "explore()"
    assert "Exploring" in _outputs_text(saved[1])

    # The roofline chart: a plotly figure, drawn.
    chart = panel.locator(".jp-OutputArea .js-plotly-plot").first
    chart.locator("svg.main-svg").first.wait_for(timeout=60_000)
    assert "Roofline" in chart.locator(".gtitle").text_content()
    assert chart.locator(".scatterlayer .trace").count() >= 3  # fp32, tf32 and bf16 roofs
    chart.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    chart_png = screenshot(page, "jupyterlab-00_roofline-chart")

    # The interactive roofline: three dropdowns (card, dtype, operation) that answer.
    widget = panel.locator(".jp-OutputArea .widget-interact")
    widget.wait_for(timeout=60_000)
    dropdowns = widget.locator(".widget-dropdown select")
    assert dropdowns.count() == 3
    dropdowns.nth(2).select_option("softmax, 4096 x 50257")
    widget.locator(".widget-output", has_text="softmax, 4096 x 50257 in bf16").wait_for(
        timeout=60_000)
    widget.locator(".widget-output .js-plotly-plot svg.main-svg").first.wait_for(
        timeout=60_000)
    widget.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    widget_png = screenshot(page, "jupyterlab-00_roofline-widget")

    # A check card for every check cell: the learner's stubs are not implemented yet. What
    # each cell shows is read from the saved notebook; the first card is looked at.
    html = ["".join(output.get("data", {}).get("text/html", "")) for cell in saved
            for output in cell.get("outputs", [])]
    cards = [re.search(r"<code>([^<]+)</code>", shown) for shown in html
             if re.search(r"NOT IMPLEMENTED|FAIL|PASS", shown)]
    assert {card.group(1) for card in cards if card} == _check_ids(notebook)
    card = panel.locator(".jp-OutputArea .jp-RenderedHTMLCommon",
                         has_text=re.compile(r"NOT IMPLEMENTED|FAIL|PASS")).first
    card.scroll_into_view_if_needed()
    assert card.locator("b").first.inner_text() == "NOT IMPLEMENTED"
    card_png = screenshot(page, "jupyterlab-00_roofline-check-card")

    assert page.console_errors == []
    assert notebook.read_bytes() == as_shipped, "the test changed labs/"
    assert all(png.stat().st_size > 0 for png in (chart_png, widget_png, card_png))
