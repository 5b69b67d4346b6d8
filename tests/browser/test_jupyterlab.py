"""Lab 00 in a real browser: JupyterLab started as `make lab` starts it, the learner's
notebook run whole through the UI (after `explore()`, which lets Run All pass the checks
not yet solved), and what a learner would see checked: the roofline chart (plotly), the
interactive roofline (ipywidgets) answering a change, a check card for every check, and
a browser console without errors."""

import json
import os
import re
import secrets
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


@pytest.fixture
def jupyterlab(tmp_path):
    """`make lab`'s command (jupyter lab --notebook-dir=labs), headless on a free port with
    a token; yields (base url, token)."""
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
    command = [str(JUPYTER), "lab", "--notebook-dir=labs", "--no-browser", "--ip=127.0.0.1",
               f"--port={port}", "--ServerApp.port_retries=0",
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
    # Done when every code cell has its execution count: Run All reached the last cell.
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll(
                '.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')];
            return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
        }""", timeout=300_000, polling=500)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=60_000)
    assert "Exploring" in cells.nth(1).locator(".jp-OutputArea").inner_text()

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

    # A check card for every check cell: the learner's stubs are not implemented yet.
    cards = panel.locator(".jp-OutputArea .jp-RenderedHTMLCommon",
                          has_text=re.compile(r"NOT IMPLEMENTED|FAIL|PASS"))
    shown = {card.locator("code").first.inner_text() for card in cards.all()}
    assert shown == _check_ids(notebook)
    assert cards.first.locator("b").first.inner_text() == "NOT IMPLEMENTED"
    cards.first.scroll_into_view_if_needed()
    card_png = screenshot(page, "jupyterlab-00_roofline-check-card")

    assert page.console_errors == []
    assert notebook.read_bytes() == as_shipped, "the test changed labs/"
    assert all(png.stat().st_size > 0 for png in (chart_png, widget_png, card_png))
