"""The course's kernels with and without their answers.

``kernels/`` holds every solution region; a learner's copy of the course holds stubs in
their place. ``rooflab release`` writes that copy, and ``rooflab grade`` mounts it over the
installed package inside the sandbox, so that a graded notebook imports what a learner's
own install would give it: the helpers, and a stub where an answer was.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .build import BEGIN, C_BEGIN, stub


def without_answers(source: str) -> str:
    """A kernels/ module with each solution region replaced by its stub."""
    return stub(source) + ("\n" if source.endswith("\n") else "")


def holds_answers(kernels: Path) -> list[str]:
    """The modules of the folder ``kernels`` that hold a solution region."""
    return [path.name for path in sorted(kernels.glob("*.py"))
            if any(line.strip() in (BEGIN, C_BEGIN)
                   for line in path.read_text().splitlines())]


def write_without_answers(kernels: Path, into: Path) -> Path:
    """Copy the folder ``kernels`` into ``into`` (a new folder), every module stubbed."""
    shutil.copytree(kernels, into, ignore=shutil.ignore_patterns("__pycache__"))
    for module in sorted(into.glob("*.py")):
        module.write_text(without_answers(module.read_text()))
    return into
