"""Shared test set-up. Importing the autograder first switches Triton to its interpreter on
a machine without a GPU, before any test module defines a kernel.

The suite runs in both worlds. A test that holds only in one says so with a marker:

* ``@pytest.mark.gpu``: needs a CUDA GPU (real timing, kernels at size); skipped without one.
* ``@pytest.mark.cpu("why")``: belongs to the CPU world (the interpreter's traces, the
  CPU-sized cases, the traffic model's predictions); skipped on a GPU, with the reason.

Everything else must pass in both.
"""

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
# Several workers on one GPU: each one's kernels run beside the others', so no check times
# anything here (correctness only), and the GPU tests, which time or fill the card, wait
# for `make gpu-test`, which has it to itself. Set before the autograder is imported,
# which reads it once; pytest-xdist sets the worker count before a worker loads this file.
if ON_GPU and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["ROOFLAB_SHARED_GPU"] = "1"

import rooflab.autograder  # noqa: E402, F401
from rooflab.autograder.device import gpu_shared  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Ceilings measured, raised or rejected by the tests go to a cache of their own, never
    the user's (set ROOFLAB_CACHE_DIR to choose it). Set here, before any worker or
    subprocess starts, so they all share it."""
    # `rooflab check` confines its child in bubblewrap, and refuses where it cannot run;
    # on such a machine the suite checks everything else unconfined (tests/test_sandbox.py
    # and the grading tests, which need it, are skipped there).
    from rooflab.autograder.confine import why_unavailable

    if why_unavailable():
        os.environ["ROOFLAB_UNCONFINED"] = "1"
    if "ROOFLAB_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["ROOFLAB_CACHE_DIR"] = config._rooflab_cache = tempfile.mkdtemp(
            prefix="rooflab-test-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    made = getattr(config, "_rooflab_cache", None)
    if made:
        import shutil

        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop("ROOFLAB_CACHE_DIR", None)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ROOFLAB_FAILURES set to a file, each failure is appended to it as it happens:
    a GPU session's run cut short by its time limit still leaves why its tests failed
    (pytest itself prints them only at the end)."""
    path = os.environ.get("ROOFLAB_FAILURES")
    # Under xdist the controller hears every worker's reports: write there only, once.
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as log:
            log.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ON_GPU and (cpu := item.get_closest_marker("cpu")) is not None:
            why = cpu.args[0] if cpu.args else "the CPU world"
            item.add_marker(pytest.mark.skip(reason=f"CPU world only: {why}"))
        elif not ON_GPU and item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif gpu_shared() and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=(
                "the GPU is shared by this run's workers: `make gpu-test` runs the GPU "
                "tests with the card to itself")))
