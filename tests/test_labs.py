"""Each learner notebook, run top to bottom, fails exactly at its exercise checks and
nowhere else (as nbgrader's `validate --invert` demands). The solved notebooks are run by
nbval (`make test` passes `--nbval-lax solutions/`), where every cell must pass."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", LABS, ids=[p.stem for p in LABS])
def test_learner_notebook_fails_only_at_its_checks(path):
    notebook = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    checks, unexpected = 0, []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        errors = [out for out in cell.outputs if out.output_type == "error"]
        is_check = "check" in cell.metadata.get("tags", [])
        checks += is_check
        if is_check and not errors:
            unexpected.append(f"cell {index}: a check passed on the unsolved notebook")
        elif is_check and errors[0].ename != "AssertionError":
            unexpected.append(f"cell {index}: check raised {errors[0].ename}, not a verdict")
        elif not is_check and errors:
            unexpected.append(f"cell {index}: {errors[0].ename}: {errors[0].evalue[:200]}")
    assert checks > 0, "a lab without checks"
    assert not unexpected, "\n".join(unexpected)
