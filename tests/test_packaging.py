"""The layout installs as rooflab.* and nothing else: no top-level `autograder` or `kernels`
(PyPI packages already import under both names)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _import(name: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"import {name}; print({name}.__file__)"],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_rooflab_packages_import_from_anywhere(tmp_path):
    for name in ("rooflab.autograder", "rooflab.kernels.vector_add"):
        done = _import(name, str(tmp_path))
        assert done.returncode == 0, done.stderr


def test_no_top_level_autograder_or_kernels_is_installed(tmp_path):
    for name in ("autograder", "kernels"):
        done = _import(name, str(tmp_path))
        # Either absent, or (if some unrelated PyPI package is installed) not ours.
        assert done.returncode != 0 or "rooflab" not in done.stdout


def test_every_package_of_the_tree_is_listed_for_the_wheel():
    """setuptools installs the packages pyproject.toml lists, and only those: a new
    sub-package missing from the list would be missing from every non-editable install."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(["rooflab", *init.parent.relative_to(ROOT).parts])
             for folder in ("autograder", "kernels")
             for init in (ROOT / folder).rglob("__init__.py")}
    assert listed == found
