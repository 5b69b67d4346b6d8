"""The built book (`make book`, in book/_build/html), served by a static HTTP server: every
page answers, a lab page is the learner's notebook with its launch link and the charts of
its recorded run, every concept page shows its picture and leads to its lab, and nothing of
the solutions is published. Skipped where the book has not been built."""

import functools
import html
import json
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "book" / "_build" / "html"
LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
RECORDED = ROOT / "book" / "recorded"
# The concept pages, in the order of the table of contents (book/myst.yml).
CONCEPTS = re.findall(r"file: concepts/([\w-]+)\.md", (ROOT / "book" / "myst.yml").read_text())
# The guides (the manual the README links to), in the same order.
GUIDES = re.findall(r"file: guides/([\w-]+)\.md", (ROOT / "book" / "myst.yml").read_text())
JUPYTERLAB = "http://localhost:8888/lab/tree/"

needs_book = pytest.mark.skipif(not (SITE / "index.html").exists(),
                                reason="the book is not built (make book)")
pytestmark = needs_book


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    """The built site on a local static HTTP server; yields its address."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=SITE))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _notebook(path: Path) -> dict:
    return json.loads(path.read_text())


def _title(path: Path) -> str:
    """A lab's title: the heading of its first cell."""
    first = "".join(_notebook(path)["cells"][0]["source"])
    return re.search(r"^# (.+)$", first, re.M).group(1).strip()


def _code_lines(path: Path) -> set[str]:
    """The notebook's lines of code long enough to be its own (not `return out`)."""
    return {line.strip() for cell in _notebook(path)["cells"] if cell["cell_type"] == "code"
            for line in "".join(cell["source"]).splitlines() if len(line.strip()) >= 24}


def _failed_requests(page) -> list[str]:
    failed = []
    page.on("requestfailed", lambda request: failed.append(f"failed: {request.url}"))
    page.on("response", lambda response: response.status >= 400
            and failed.append(f"{response.status}: {response.url}"))
    return failed


def test_the_solutions_are_not_published():
    """No line of code that only the solved notebooks have appears anywhere in the site."""
    published = []
    for path in SITE.rglob("*"):
        if path.suffix in (".html", ".json", ".ipynb", ".md"):
            text = path.read_text()
            published.append(html.unescape(re.sub(r"<[^>]+>", "", text)) if
                             path.suffix == ".html" else text)
    published = "\n".join(published)
    # What the learner gets: every cell of every lab, prose included (it quotes some lines).
    given = "\n".join("".join(cell["source"]) for lab in LABS for cell in _notebook(lab)["cells"])
    for lab in LABS:
        solved = ROOT / "solutions" / lab.name
        only_solved = {line for line in _code_lines(solved) if line not in given}
        assert only_solved, f"{solved.name} has no solution lines to look for"
        leaked = sorted(line for line in only_solved
                        if line in published or json.dumps(line)[1:-1] in published)
        assert not leaked, f"solution lines of {lab.name} in the site: {leaked[:5]}"


def _concept_title(name: str, folder: str = "concepts") -> str:
    front = (ROOT / "book" / folder / f"{name}.md").read_text()
    return re.search(r"^title: (.+)$", front, re.M).group(1).strip().strip('"')


@pytest.mark.browser
def test_every_page_answers_and_the_contents_list_labs_concepts_and_guides(site, page):
    failed = _failed_requests(page)
    page.goto(site + "/")
    links = page.locator("nav.toc a")
    assert links.all_text_contents() == (["Start here"] + [_title(lab) for lab in LABS]
                                         + [_concept_title(name) for name in CONCEPTS]
                                         + [_concept_title(name, "guides") for name in GUIDES])
    hrefs = [link.get_attribute("href") for link in links.all()]
    assert hrefs[len(LABS) + 1:] == ([f"/concepts/{name}" for name in CONCEPTS]
                                     + [f"/guides/{name}" for name in GUIDES])
    for href, title in zip(hrefs, links.all_text_contents(), strict=True):
        page.goto(site + href)
        if href != "/":
            assert page.locator("article h1").inner_text() == title, href
        assert page.locator("nav.toc li.current").count() == 1, href
    for lab, href in zip(LABS, hrefs[1:], strict=False):  # each lab launches its notebook
        page.goto(site + href)
        assert page.locator("a.launch-link").get_attribute("href") == JUPYTERLAB + lab.name
    assert failed == []
    assert page.console_errors == []


@pytest.mark.browser
def test_a_lab_page_is_the_learner_notebook_with_its_launch_link(site, page, screenshot):
    lab = LABS[0]
    failed = _failed_requests(page)
    page.goto(site + "/")
    page.locator("nav.toc a", has_text=_title(lab)).click()
    page.wait_for_load_state()
    assert page.locator("article h1").inner_text() == _title(lab)
    launch = page.locator("aside.launch a.launch-link")
    assert launch.get_attribute("href") == JUPYTERLAB + lab.name
    assert "make lab" in page.locator("aside.launch").inner_text()
    code_cells = sum(cell["cell_type"] == "code" for cell in _notebook(lab)["cells"])
    assert page.locator("article .cell").count() == code_cells
    text = page.locator("article").inner_text()
    assert "# YOUR CODE HERE" in text and "raise NotImplementedError()" in text
    # The download is the learner's notebook, byte for byte.
    download = page.locator("aside.launch a.download").get_attribute("href")
    assert (SITE / download.lstrip("/")).read_bytes() == lab.read_bytes()
    screenshot(page, "book-lab-00_roofline")
    assert failed == []
    assert page.console_errors == []


@pytest.mark.browser
def test_a_concept_page_shows_its_chart_and_leads_to_its_lab(site, page, screenshot):
    failed = _failed_requests(page)
    page.goto(site + "/concepts/roofline")
    assert page.locator("article h1").inner_text() == "The roofline"
    chart = page.locator("article img[src$='.svg']")
    assert chart.count() == 1
    chart.scroll_into_view_if_needed()
    assert page.evaluate("img => img.complete && img.naturalWidth > 0", chart.element_handle())
    assert page.locator("article pre").count() >= 1  # the rule, as text
    page.locator("article h1").scroll_into_view_if_needed()
    screenshot(page, "book-concept-roofline")
    page.locator("article a", has_text="lab 00").click()
    page.wait_for_load_state()
    assert page.locator("article h1").inner_text() == _title(LABS[0])
    assert failed == []
    assert page.console_errors == []


def _loaded(page, image) -> bool:
    image.evaluate("img => img.scrollIntoView({block: 'center'})")
    return page.evaluate("img => img.complete && img.naturalWidth > 0", image.element_handle())


@pytest.mark.browser
def test_a_lab_page_shows_the_charts_and_check_cards_of_its_recorded_run(site, page, screenshot):
    lab = LABS[0]
    about = _notebook(RECORDED / lab.name)["metadata"]["rooflab"]["recorded"]
    failed = _failed_requests(page)
    page.goto(site + "/")
    page.locator("nav.toc a", has_text=_title(lab)).click()
    page.wait_for_load_state()
    label = page.locator("aside.launch .recorded").inner_text()
    origin = about["name"] if about["measured"] else "a CPU"
    assert f"Recorded on {origin} on {about['date']}" in label
    assert about["measured"] or "times are predictions" in label
    charts = page.locator("article .cell .outputs img.chart")
    assert charts.count() >= 1
    assert all(_loaded(page, chart) for chart in charts.all())
    assert charts.first.get_attribute("alt").startswith("Chart: Roofline")
    # A chart sits under the cell that drew it, a check card under its check cell.
    drawn = page.locator("article .cell", has=page.locator("img.chart")).first
    assert "roofline_figure(" in drawn.locator("pre.code").inner_text()
    checks = page.locator("article .cell", has=page.locator(".cell-label"))
    assert any("PASS" in check.inner_text() for check in checks.all())
    charts.first.evaluate("img => img.scrollIntoView({block: 'center'})")
    screenshot(page, "book-lab-00_roofline-chart")
    assert failed == []
    assert page.console_errors == []


@pytest.mark.browser
def test_every_concept_page_shows_its_picture(site, page, screenshot):
    failed = _failed_requests(page)
    for name in CONCEPTS:
        page.goto(site + f"/concepts/{name}")
        picture = page.locator("article img")
        assert picture.count() == 1, name
        assert _loaded(page, picture), name
        assert len(picture.get_attribute("alt")) > 40, f"{name}: say what the picture shows"
        if name == "tiling":
            screenshot(page, "book-concept-tiling")
    assert failed == []
    assert page.console_errors == []
