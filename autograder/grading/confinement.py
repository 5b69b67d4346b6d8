"""How ``rooflab grade`` confines the notebooks it runs, decided once per grading.

Confined (the default), each notebook's kernel runs in a sandbox (``confine/``) that sees
the autograder and, over the installed ``rooflab.kernels``, the course's kernels without
their answers: a notebook that imports the course's kernel gets the stub a learner's own
install has. Where bubblewrap cannot run, grading stops and says why, unless the
instructor asks for ``--unconfined``; and unconfined, it still stops where the installed
kernels hold the answers, for any notebook could import them. The gradebook says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..confine import package_folder, why_unavailable
from ..course.answers import holds_answers, write_without_answers


class CannotConfine(ValueError):
    """Grading would let a notebook escape, or import the answers: the words say which."""


@dataclass
class Confinement:
    confined: bool
    read_only: list[Path] = field(default_factory=list)
    overlays: dict[Path, Path] = field(default_factory=dict)

    def execute_args(self) -> list[str]:
        """What execute.py is told."""
        if not self.confined:
            return ["--unconfined"]
        args = [arg for path in self.read_only for arg in ("--read-only", str(path))]
        return args + [arg for inside, outside in self.overlays.items()
                       for arg in ("--overlay", f"{inside}={outside}")]


def prepare(unconfined: bool, scratch: Path) -> Confinement:
    """The confinement for this grading; its release of the kernels goes in ``scratch``.
    Raises CannotConfine where grading must not go on."""
    kernels = package_folder("rooflab.kernels")
    if unconfined:
        answers = holds_answers(kernels)
        if answers:
            raise CannotConfine(
                f"--unconfined, but the installed rooflab.kernels ({kernels}) holds the "
                f"course's answers ({', '.join(answers[:3])}, ...): any notebook could import "
                "them. Grade confined, or in an environment installed from `rooflab release`")
        return Confinement(confined=False)
    why = why_unavailable()
    if why:
        raise CannotConfine(f"graded notebooks run in a sandbox, and {why}. Install it, or "
                            "give --unconfined to grade without one (the gradebook says so)")
    released = write_without_answers(kernels, scratch / "kernels")
    return Confinement(True, read_only=[package_folder("rooflab.autograder")],
                       overlays={kernels: released})
