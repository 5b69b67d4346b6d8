"""Hints, shown only when asked for: ``hint("softmax/online", 1)``.

Each problem has a few levels: a nudge, then the idea, and last the answer itself, as the
course's solution writes it (read from the solution regions of ``kernels/``, so it is
never a second copy that could drift). The last level is meant to be pasted: each part in
place of the stub it names, ``# YOUR CODE HERE`` and ``raise NotImplementedError()``.
"""

from __future__ import annotations

from .. import problems
from ..course.build import definition_source, regions
from ..problem import Problem


def answer(spec: Problem) -> list[tuple[str, str]]:
    """(where, code) for each stub the exercise fills, in order: where names the
    function (or CUDA C source) and, if it holds several stubs, which one."""
    if not spec.answer_in:
        return []
    module = spec.solution.partition(":")[0]
    parts = []
    for name in spec.answer_in:
        found = regions(definition_source(module, [name]))
        if not found:  # a release: kernels/ holds stubs, not answers
            return []
        for index, code in enumerate(found):
            where = f"in `{name}`" + (f", part {index + 1} of {len(found)}"
                                     if len(found) > 1 else "")
            parts.append((where, code))
    return parts


def levels(spec: Problem) -> int:
    return len(spec.hints) + (1 if spec.answer_in else 0)


def text(problem_id: str, level: int = 1) -> str:
    """Hint number ``level`` for a problem, as ``hint`` prints it."""
    spec = problems.get(problem_id)
    total = levels(spec)
    if not total:
        return f"{problem_id} has no hints."
    level = min(max(level, 1), total)
    more = f" (hint {level + 1} says more)" if level < total else ""
    head = f"Hint {level}/{total} for {problem_id}"
    if level <= len(spec.hints):
        return f"{head}: {spec.hints[level - 1]}{more}"
    if not answer(spec):
        return (f"{head}: the answer is not in this copy of the course; hint "
                f"{len(spec.hints)} is the last word here.")
    parts = "\n\n".join(f"{where}:\n\n{_indent(code)}" for where, code in answer(spec))
    return (f"{head}: the answer, as the course's solution writes it. Paste each part in "
            f"place of the stub it names (the YOUR CODE HERE line, and the raise under it "
            f"in Python), at the stub's indentation.\n\n{parts}")


def hint(problem_id: str, level: int = 1) -> None:
    """Print hint number ``level`` (1 = a nudge, the last = the answer) for a problem."""
    print(text(problem_id, level))


def _indent(code: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in code.splitlines())
