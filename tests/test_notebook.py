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
    assert errors and errors[0].ename == "AssertionError"
    assert "calls the library (aten.add)" in errors[0].evalue
    failing_html = [out.data["text/html"] for out in _outputs(failing, "display_data")]
    assert failing_html and "FAIL" in failing_html[0]
