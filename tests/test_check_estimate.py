"""A check that will take long in the interpreter says so, with its estimate, once its
first two cases are done; a quick one says nothing."""

import time

import torch

from rooflab.autograder import check
from rooflab.autograder.checking import engine
from rooflab.kernels.vector_add import vector_add


def slow_per_element(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The course's kernel, with a wait that grows with the size, as tl.sort's does."""
    time.sleep(2e-5 * x.numel())
    return vector_add(x, y)


def test_a_check_that_will_take_long_says_how_long(capsys, monkeypatch):
    monkeypatch.setattr(engine, "LONG_CHECK_S", 0.05)
    result = check("coalescing/vector_add", slow_per_element, show=True,
                   raise_on_failure=False, measure=False)
    out = capsys.readouterr().out
    assert result.passed, result.message()
    if not engine.device_layer.interpreter_enabled():
        assert "should take about" not in out  # nothing is slow on a GPU
        return
    [said] = [line for line in out.splitlines() if "should take about" in line]
    assert said.startswith("coalescing/vector_add: its first cases took ")
    assert " more (each stops at its time limit)" in said


def test_a_quick_check_says_nothing_of_time(capsys):
    result = check("coalescing/vector_add", vector_add, show=True, raise_on_failure=False,
                   measure=False)
    assert result.passed
    assert "should take about" not in capsys.readouterr().out
