"""Hints, shown only when asked for: ``hint("softmax/online", 1)``.

Each problem has a few levels: a nudge, then the idea, and last the key lines of the answer:
the few lines of the course's solution that carry the idea, each part where its stub is,
with ``...`` for the solution's other lines, which stay the learner's to write. They are
read from the solution regions of ``kernels/``, where they sit between key markers, so they
are never a second copy that could drift. The whole answer is in the solved notebook.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .. import problems
from ..course.build import (
    C_END_KEY,
    C_KEY,
    END_KEY,
    INLINE,
    KEY,
    definition_source,
    masters,
    regions,
)
from ..problem import Problem

ELIDED = "..."  # stands for the solution's lines a hint leaves out


def answer(spec: Problem) -> list[tuple[str, str]]:
    """(where, key lines) for each stub the exercise fills, in order: where names the
    function (or CUDA C source) and, if it holds several stubs, which one."""
    if not spec.answer_in:
        return []
    module = spec.solution.partition(":")[0]
    parts = []
    for name in spec.answer_in:
        found = regions(definition_source(module, [name]))
        if not found:  # a release: kernels/ holds stubs, not answers
            return []
        for index, region in enumerate(found):
            where = f"in `{name}`" + (f", part {index + 1} of {len(found)}"
                                     if len(found) > 1 else "")
            parts.append((where, key_lines(region)))
    return parts


def key_lines(region: str) -> str:
    """A solution region's key lines, each in its place: the lines between its key markers,
    and in place of each run of other lines one ``...`` at that run's indentation."""
    out: list[str] = []
    left_out: list[str] = []
    inside = False
    for line in region.splitlines():
        stripped = line.strip()
        if stripped in (KEY, C_KEY, END_KEY, C_END_KEY):
            out += _elided(left_out)
            left_out = []
            inside = stripped in (KEY, C_KEY)
        elif inside:
            out.append(line)
        else:
            left_out.append(line)
    out += _elided(left_out)
    return "\n".join(out).strip("\n")


def _elided(lines: list[str]) -> list[str]:
    """What a hint shows for lines it leaves out: one ``...``, or nothing for blank ones."""
    code = [line for line in lines if line.strip()]
    if not code:
        return [""] if lines else []
    indent = min(len(line) - len(line.lstrip()) for line in code)
    return [" " * indent + ELIDED]


def solved_notebook(spec: Problem) -> str:
    """Where the course's whole answer to a problem is: its lab's solved notebook, as
    ``solutions/NN_topic.ipynb``, or "" where this copy of the course has none."""
    module = spec.solution.partition(":")[0]
    found = importlib.util.find_spec(module)
    if not found or not found.origin or not spec.answer_in:
        return ""
    root = Path(found.origin).parents[1]  # kernels/ sits at the top of the course
    for master in masters(root):
        for line in master.read_text().splitlines():
            match = INLINE.match(line)
            if match and match.group(2) == module and spec.answer_in[0] in [
                    name.strip() for name in match.group(3).split(",")]:
                notebook = Path("solutions") / master.with_suffix(".ipynb").name
                return notebook.as_posix() if (root / notebook).exists() else ""
    return ""


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
    notebook = solved_notebook(spec)
    whole = f" The whole answer is in {notebook}." if notebook else ""
    return (f"{head}: the key lines of the answer, as the course's solution writes them. "
            f"Each part goes in place of the stub it names (the YOUR CODE HERE line, and "
            f"the raise under it in Python), indented as shown from the stub's "
            f"indentation; each `{ELIDED}` stands for lines of the solution left out, "
            f"yours to write.{whole}\n\n{parts}")


def hint(problem_id: str, level: int = 1) -> None:
    """Print hint number ``level`` (1 = a nudge, the last = the answer's key lines) for a
    problem."""
    print(text(problem_id, level))


def _indent(code: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in code.splitlines())
