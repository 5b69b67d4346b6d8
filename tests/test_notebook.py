"""`check` inside a real Jupyter kernel: HTML feedback on success, a failed cell on failure."""

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

SETUP = """\
from rooflab.autograder import check
from rooflab.kernels.vector_add import vector_add
import torch
"""


def _run(*cells: str) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     allow_errors=True)
    client.execute()
    return notebook


def _outputs(cell, kind):
    return [out for out in cell.outputs if out.output_type == kind]


def test_check_in_a_notebook_shows_html_and_fails_the_cell_on_a_bug():
    notebook = _run(
        SETUP,
        'result = check("coalescing/vector_add", vector_add)',
        'result.passed, result.verdict',
        'check("coalescing/vector_add", lambda x, y: torch.add(x, y))',
    )
    setup, passing, value, failing = notebook.cells
    assert not _outputs(setup, "error")

    html = [out.data["text/html"] for out in _outputs(passing, "display_data")]
    assert html and "PASS" in html[0] and "coalescing/vector_add" in html[0]
    assert "<table" in html[0]
    assert not _outputs(passing, "error")

    assert "(True, 'PASS')" in _outputs(value, "execute_result")[0].data["text/plain"]

    errors = _outputs(failing, "error")
    assert errors and errors[0].ename == "CheckFailed"  # an AssertionError
    assert "calls the library (aten.add)" in errors[0].evalue
    failing_html = [out.data["text/html"] for out in _outputs(failing, "display_data")]
    assert failing_html and "FAIL" in failing_html[0]


def test_a_failing_check_shows_the_card_and_one_short_line_not_the_graders_frames():
    notebook = _run(SETUP, 'check("coalescing/vector_add", lambda x, y: torch.add(x, y))')
    (error,) = _outputs(notebook.cells[1], "error")
    assert error.ename == "CheckFailed"
    assert len(error.traceback) == 1, error.traceback
    assert "FAIL coalescing/vector_add" in error.traceback[0]
    assert "the card above says more" in error.traceback[0]
    assert "engine.py" not in "".join(error.traceback)


def test_explore_lets_run_all_reach_the_end_and_pytest_ignores_it():
    explore = """\
import os
os.environ.pop("PYTEST_CURRENT_TEST", None)  # as in JupyterLab, not under pytest
from rooflab.autograder import explore
explore()
"""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        SETUP, explore, 'result = check("coalescing/vector_add", lambda x, y: x + y)',
        'print("reached the end", result.verdict)')]
    # No allow_errors: like Run All, the first cell that raises would stop the run.
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    assert "reached the end FAIL" in _outputs(notebook.cells[3], "stream")[0].text
    card = [out.data["text/html"] for out in _outputs(notebook.cells[2], "display_data")]
    assert card and "FAIL" in card[0]

    under_pytest = _run(SETUP, "from rooflab.autograder import explore\nexplore()",
                        'check("coalescing/vector_add", lambda x, y: x + y)')
    assert _outputs(under_pytest.cells[2], "error"), "explore() must not weaken nbval"
