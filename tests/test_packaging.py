"""The layout installs as rooflab.* and nothing else: no top-level `autograder` or `kernels`
(PyPI packages already import under both names)."""

import subprocess
import sys


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
