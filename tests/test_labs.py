"""Each learner notebook, run top to bottom, fails exactly at its exercise checks and
nowhere else (as nbgrader's `validate --invert` demands); a from-scratch way into an
exercise that also has a scaffolded one shows NOT IMPLEMENTED and stops nothing. The
solved notebooks are run by nbval (`make test` passes `--nbval-lax solutions/`), where
every cell must pass."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from rooflab.autograder.grading.execute import without_output_widgets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", LABS, ids=[p.stem for p in LABS])
def test_learner_notebook_fails_only_at_its_checks(path):
    notebook = nbformat.read(path, as_version=4)
    # As the grader runs it: nbclient's Output-widget frontend can miss a cell's reply.
    without_output_widgets(nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}})).execute()
    checks, unexpected = 0, []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        errors = [out for out in cell.outputs if out.output_type == "error"]
        is_check = "check" in cell.metadata.get("tags", [])
        checks += is_check
        if is_check and "scratch=True" in cell.source:
            # The from-scratch way into an exercise: unwritten, it stops nothing, and says so.
            shown = "".join(str(out.get("data", out.get("text", ""))) for out in cell.outputs)
            if errors or "not written yet" not in shown:
                unexpected.append(f"cell {index}: an unwritten from-scratch cell stopped the "
                                  "run or did not say it is unwritten")
        elif is_check and not errors:
            unexpected.append(f"cell {index}: a check passed on the unsolved notebook")
        elif is_check and errors[0].ename != "CheckFailed":
            unexpected.append(f"cell {index}: check raised {errors[0].ename}, not a verdict")
        elif not is_check and errors:
            unexpected.append(f"cell {index}: {errors[0].ename}: {errors[0].evalue[:200]}")
    assert checks > 0, "a lab without checks"
    assert not unexpected, "\n".join(unexpected)


def _imports_and_assignments(source: str) -> tuple[set[str], set[str], set[str]]:
    """Names a cell imports, names it assigns otherwise, and names it reads."""
    import ast

    # A cell magic's line (%%scaffold) is IPython's, not Python: the rest is the code.
    tree = ast.parse(source.split("\n", 1)[1] if source.startswith("%%") else source)
    imported, assigned = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            assigned.add(node.id)
    read = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return imported, assigned, read


@pytest.mark.parametrize("path", LABS, ids=[p.stem for p in LABS])
def test_what_a_cell_imports_for_later_cells_is_imported_in_the_first(path):
    """A learner skips a chart, or runs a cell on its own: no later cell may depend on a
    module imported by a cell other than the first. (A cell that picks the learner's
    kernel or the course's, importing the latter under a name it also assigns, defines a
    variable; that is a lesson's own step.)"""
    cells = [cell for cell in nbformat.read(path, as_version=4).cells
             if cell.cell_type == "code"]
    imported_in: dict[str, int] = {}
    wrong = []
    for index, cell in enumerate(cells):
        imported, assigned, read = _imports_and_assignments(cell.source)
        wrong += [f"cell {index} uses {name}, imported in cell {imported_in[name]}"
                  for name in sorted(read - imported - assigned)
                  if imported_in.get(name, 0) != 0]
        for name in imported - assigned:
            imported_in.setdefault(name, index)
    assert not wrong, "\n".join(wrong)
