"""What a GPU session relies on when its time runs out: each failing test's report is
written to ROOFLAB_FAILURES as it fails, not only in pytest's summary at the end."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def test_each_failure_is_written_as_it_happens_and_passes_are_not(tmp_path):
    (tmp_path / "test_two.py").write_text(
        "def test_fails():\n    assert 1 + 1 == 3, 'arithmetic moved'\n\n"
        "def test_passes():\n    pass\n")
    log = tmp_path / "failures.log"
    env = {**os.environ, "ROOFLAB_FAILURES": str(log), "PYTHONPATH": str(TESTS)}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest",
                           "-p", "no:cacheprovider", str(tmp_path / "test_two.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    text = log.read_text()
    assert "test_two.py::test_fails (call)" in text
    assert "arithmetic moved" in text
    assert "test_passes" not in text
