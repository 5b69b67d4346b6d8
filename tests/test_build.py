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
