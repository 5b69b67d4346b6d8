"""The GPU session's script (bench/gpu-session.sh) names the kernels it profiles; each
name must still pick exactly one kernel of one benchmark, or a scarce GPU run profiles
nothing (or the wrong thing)."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "bench" / "gpu-session.sh"


def _profile_module():
    spec = importlib.util.spec_from_file_location("profile_driver", ROOT / "bench" / "profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _default_profiles() -> list[tuple[str, str, str]]:
    text = SCRIPT.read_text()
    block = re.search(r'^PROFILES=\$\{PROFILES:-"(.*?)"\}$', text, re.S | re.M).group(1)
    entries = block.replace("\\\n", "").split(";")
    return [tuple(entry.split("|")) for entry in entries]


def test_the_script_is_valid_bash_and_knows_the_profile_step():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    assert "profile)" in SCRIPT.read_text()


@pytest.mark.parametrize("entry", _default_profiles(), ids="|".join)
def test_each_profiled_name_picks_one_kernel(entry):
    bench, kernel, shape = entry
    picked = _profile_module().chosen(bench, kernel, shape, "cpu")
    assert len(picked) == 1, [(load.shape, name) for load, name, _ in picked]


def test_a_name_that_matches_nothing_is_an_error_not_an_empty_run(capsys):
    assert _profile_module().main(["kmeans", "no such kernel", "--list"]) == 2
    assert "no kernel of kmeans matches" in capsys.readouterr().err
