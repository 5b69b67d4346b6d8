"""Hints, shown only when asked for: ``hint("softmax/online", 1)``.

Each problem has a few levels: a nudge, then the idea, and last the key lines of the answer:
the few lines of the course's solution that carry the idea, each part where its stub is,
with ``...`` for the solution's other lines, which stay the learner's to write. They are
read from the solution regions of ``kernels/``, where they sit between key markers, so they
are never a second copy that could drift. Where several exercises fill one function, each
shows only its own key lines: those of the markers that name it, and of unnamed ones; a
stub that holds none of them is not shown (the hint says which). The whole answer is in
the solved notebook.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .. import problems
from ..course.build import INLINE, definition_source, key_marker, masters, regions
from ..problem import Problem

ELIDED = "..."  # stands for the solution's lines a hint leaves out


def answer(spec: Problem) -> list[tuple[str, str]]:
    """(where, key lines) for each stub the exercise fills that holds some of its key
    lines, in order: where names the function (or CUDA C source) and, if it holds several
    stubs, which one."""
    return _shown(_stubs(spec))


def _shown(stubs: list[tuple[str, int, int, str]]) -> list[tuple[str, str]]:
    return [(_where(name, index, count), code) for name, index, count, code in stubs if code]


def _stubs(spec: Problem) -> list[tuple[str, int, int, str]]:
    """(function, index, how many, key lines) for every stub of the functions the exercise
    fills, in order; its key lines are "" where it holds none of them."""
    if not spec.answer_in:
        return []
    module = spec.solution.partition(":")[0]
    stubs = []
    for name in spec.answer_in:
        found = regions(definition_source(module, [name]))
        if not found:  # a release: kernels/ holds stubs, not answers
            return []
        stubs += [(name, index, len(found), key_lines(region, spec.id))
                  for index, region in enumerate(found)]
    return stubs


def _where(name: str, index: int, count: int) -> str:
    return f"in `{name}`" + (f", part {index + 1} of {count}" if count > 1 else "")


def _left_out(stubs: list[tuple[str, int, int, str]]) -> list[str]:
    """The stubs that hold none of the exercise's key lines, by function: `name` where
    none of its stubs does, else which parts of it."""
    places = []
    for name in dict.fromkeys(name for name, _, _, _ in stubs):
        codes = [code for owner, _, _, code in stubs if owner == name]
        empty = [str(index + 1) for index, code in enumerate(codes) if not code]
        if len(empty) == len(codes):
            places.append(f"`{name}`")
        elif empty:
            places.append(f"part{'s' if len(empty) > 1 else ''} {', '.join(empty)} of "
                          f"{len(codes)} in `{name}`")
    return places


def key_lines(region: str, problem: str) -> str:
    """A solution region's key lines for ``problem``, each in its place: the lines between
    the key markers that open its key lines (those naming it, and unnamed ones), and in
    place of each run of other lines one ``...`` at that run's indentation; "" where none of
    its key lines are in the region."""
    out: list[str] = []
    left_out: list[str] = []
    inside = shown = False
    for line in region.splitlines():
        marker = key_marker(line)
        if marker is not None:
            opens, names = marker
            inside = opens and (not names or problem in names)
            if inside:  # another problem's key lines stay in the run left out
                out += _elided(left_out)
                left_out = []
                shown = True
        elif inside:
            out.append(line)
        else:
            left_out.append(line)
    out += _elided(left_out)
    return "\n".join(out).strip("\n") if shown else ""


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
    stubs = _stubs(spec)
    if not _shown(stubs):
        return (f"{head}: the answer is not in this copy of the course; hint "
                f"{len(spec.hints)} is the last word here.")
    parts = "\n\n".join(f"{where}:\n\n{_indent(code)}" for where, code in _shown(stubs))
    left_out = _left_out(stubs)
    others = (f" Not shown, as none of this exercise's key lines are there: "
              f"{'; '.join(left_out)}." if left_out else "")
    notebook = solved_notebook(spec)
    whole = f" The whole answer is in {notebook}." if notebook else ""
    return (f"{head}: the key lines of the answer, as the course's solution writes them. "
            f"Each part goes in place of the stub it names (the YOUR CODE HERE line, and "
            f"the raise under it in Python), indented as shown from the stub's "
            f"indentation; each `{ELIDED}` stands for lines of the solution left out, "
            f"yours to write.{others}{whole}\n\n{parts}")


def hint(problem_id: str, level: int = 1) -> None:
    """Print hint number ``level`` (1 = a nudge, the last = the answer's key lines) for a
    problem."""
    print(text(problem_id, level))


def _indent(code: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in code.splitlines())
