"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium (`apt-get install
chromium`), driven by Playwright. A test marked ``browser`` is skipped where either is
missing; ROOFLAB_CHROMIUM names another Chromium binary.

Each test gets a fresh profile and a page that records what would show in the browser's
console: ``console_errors`` lists every console error and uncaught page error."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("ROOFLAB_CHROMIUM", "/usr/bin/chromium")
# Screenshots for a person to look at (git-ignored).
SCREENSHOTS = ROOT / "build" / "screenshots"
# What this kind of machine needs: no sandbox as root, no GPU, and no traffic of Chromium's
# own (updates, sync, field trials) that would wait on a network it cannot reach.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not (shutil.which(CHROMIUM) or os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture
def page():
    """A page in a fresh headless Chromium, with ``page.console_errors``."""
    missing = chromium_missing()
    if missing:
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        # A fresh --user-data-dir: Playwright takes it as the persistent context's folder.
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1400, "height": 1000})
        page = context.pages[0] if context.pages else context.new_page()
        page.console_errors = []
        page.on("console", lambda message: message.type == "error"
                and page.console_errors.append(f"console: {message.text} ({message.location})"))
        page.on("pageerror", lambda error: page.console_errors.append(f"page error: {error}"))
        try:
            yield page
        finally:
            context.close()


@pytest.fixture
def screenshot():
    """screenshot(page, name): save a PNG of the page's viewport under build/screenshots/."""
    def take(page, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path))
        return path
    return take
