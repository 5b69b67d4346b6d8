"""What the grading tests share: the course's kernel module with a bug put in (a mutant),
a problem cut down to the cases that show one bug, and the verdict on correctness alone.

A mutant is kernels/<module>.py with a few lines changed: the bug a learner would write.
Grading it on the one kind of case that shows its bug keeps the suite fast; the full
problems run once each in test_solutions.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from types import ModuleType

import torch

from rooflab import kernels
from rooflab.autograder import CheckResult, check, get_problem
from rooflab.autograder.problem import Problem

KERNELS = Path(kernels.__file__).parent
ON_GPU = torch.cuda.is_available()


def grade(problem: str | Problem, fn, seed: int | None = None) -> CheckResult:
    """The verdict on correctness and structure, in either world (speed is graded in
    test_solutions.py), without a card or an exception."""
    return check(problem, fn, show=False, raise_on_failure=False, measure=False, seed=seed)


def only(problem: str | Problem, *notes: str, dtypes: tuple = ()) -> Problem:
    """The problem with only its cases (in this world) of the given notes, and of the
    given dtypes if any."""
    spec = get_problem(problem) if isinstance(problem, str) else problem
    cases = [case for case in spec.cases(ON_GPU)
             if case.note in notes and (not dtypes or case.dtype in dtypes)]
    assert cases, f"no case of {spec.id} has the notes {notes}"
    return dataclasses.replace(spec, cpu_cases=cases, gpu_cases=cases)


def mutant(tmp_path: Path, module: str, *edits: tuple[str, str],
           name: str | None = None) -> ModuleType:
    """kernels/<module>.py with each (old, new) edit made, each ``old`` found exactly
    once, imported under ``name`` (default: mutant_<module>)."""
    source = (KERNELS / f"{module}.py").read_text()
    for old, new in edits:
        assert source.count(old) == 1, f"{old!r} is not once in kernels/{module}.py"
        source = source.replace(old, new)
    path = tmp_path / f"{name or 'mutant_' + module}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
