"""``rooflab release OUT/``: the course as a learner receives it, without the answers.

The repository holds every answer: the solution regions in ``kernels/``, the lab masters in
``book/``, the solved notebooks in ``solutions/``. A release is what a workshop hands out:

* the learner notebooks (``labs/``) and the autograder, as they are;
* ``kernels/`` with every solution region (``### BEGIN SOLUTION`` … ``### END SOLUTION``, or
  ``// BEGIN SOLUTION`` in CUDA C) replaced by its stub, so what a learner may import (the
  helpers, the playground matmul's host code) still imports;
* no ``solutions/``, no masters, none of the course's own tests: the release's tests check
  that each learner notebook runs and fails only at its checks;
* the same ``make lab`` and ``make test``.

The hints' last level, the answer's key lines, reads the solution regions of ``kernels/``:
in a release there are none, and it says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..course.answers import without_answers
from ..course.build import BEGIN, C_BEGIN, C_END, END

# What a learner gets, as it is in the repository.
AS_IS = ["README.md", "Makefile", "pyproject.toml", ".gitignore", "autograder", "ci", "labs",
         "tests/conftest.py", "tests/test_labs.py"]


def release(root: Path, out: Path) -> list[Path]:
    """Write the learner distribution of the course at ``root`` into ``out`` (which must
    not exist yet, or be empty). Returns the files written."""
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: a release goes into a new folder")
    if not any((root / "labs").glob("[0-9][0-9]_*.ipynb")) or not (root / "kernels").is_dir():
        raise FileNotFoundError(f"{root.resolve()} is not the course's repository (no labs/ "
                                "notebooks, or no kernels/): give --root")
    for name in AS_IS:
        source = root / name
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(
                "__pycache__", ".ipynb_checkpoints"))
        elif source.exists():
            shutil.copy2(source, target)
    for module in sorted((root / "kernels").glob("*.py")):
        target = out / "kernels" / module.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(without_answers(module.read_text()))
    return sorted(path for path in out.rglob("*") if path.is_file())


def solution_lines(root: Path) -> set[str]:
    """Every line that only the answers hold: the lines inside the solution regions of
    kernels/ and of the lab masters, stripped, less the ones that also appear outside
    them (a ``return out`` proves nothing) and the ones too short to tell (a bracket)."""
    inside, outside = set(), set()
    for path in [*sorted((root / "kernels").glob("*.py")), *sorted((root / "book").glob("*.md"))]:
        region = False
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped in (BEGIN, C_BEGIN):
                region = True
            elif stripped in (END, C_END):
                region = False
            elif stripped and not stripped.startswith(("#", "//")):
                (inside if region else outside).add(stripped)
    return {line for line in inside - outside if len(line) >= 12}
