"""Hints: the last level of every exercise is its answer, and pasted as written, in place
of the stubs it names, it passes the check."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import torch

from rooflab.autograder import all_problems, check
from rooflab.autograder.checking import hints
from rooflab.autograder.course.build import BEGIN, C_BEGIN, C_END, END
from rooflab.autograder.device import cuda

WITH_ANSWER = [spec for spec in all_problems() if spec.answer_in]
HEADER = re.compile(r"^in `(\w+)`(?:, part (\d+) of \d+)?:$")


def pasted_parts(text: str) -> list[tuple[str, str]]:
    """(name, code) for each part of a printed answer, the code as a learner copies it
    (the printed block, four spaces in)."""
    parts, lines = [], text.splitlines()
    for index, line in enumerate(lines):
        match = HEADER.match(line)
        if match:
            block = []
            for code in lines[index + 2:]:
                if HEADER.match(code):
                    break
                block.append(code[4:] if code.startswith("    ") else code)
            parts.append((match.group(1), "\n".join(block).strip("\n")))
    return parts


def _owner(tree: ast.Module, line: int) -> str:
    """The top-level function, class or assignment that line ``line`` (1-based) is in."""
    for node in tree.body:
        if node.lineno <= line <= node.end_lineno:
            if isinstance(node, ast.Assign):
                return node.targets[0].id
            return getattr(node, "name", "")
    return ""


def with_answer_pasted(source: str, parts: list[tuple[str, str]]) -> str:
    """The module as a learner who pasted ``parts`` has it: the regions the parts name
    replaced by the pasted code at the stub's indentation, every other region solved."""
    tree = ast.parse(source)
    queue = {name: [code for owner, code in parts if owner == name] for name, _ in parts}
    out, skipping = [], False
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if stripped in (BEGIN, C_BEGIN):
            owner = _owner(tree, number)
            if queue.get(owner):
                out += [indent + code if code else "" for code in
                        queue[owner].pop(0).splitlines()]
                skipping = True
            continue
        if stripped in (END, C_END):
            skipping = False
            continue
        if not skipping:
            out.append(line)
    assert not any(queue.values()), f"parts with no stub to go in: {queue}"
    return "\n".join(out) + "\n"


def load_pasted(spec, parts: list[tuple[str, str]], folder: Path):
    """The problem's solution function, from its module with ``parts`` pasted in."""
    module_name, _, function = spec.solution.partition(":")
    source = Path(importlib.util.find_spec(module_name).origin).read_text()
    path = folder / f"pasted_{module_name.rsplit('.', 1)[1]}.py"
    path.write_text(with_answer_pasted(source, parts))
    loader = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return getattr(module, function)


@pytest.mark.parametrize("spec", WITH_ANSWER, ids=[s.id for s in WITH_ANSWER])
def test_the_last_hint_pasted_as_written_passes_the_check(spec, tmp_path, capsys):
    hints.hint(spec.id, hints.levels(spec))
    parts = pasted_parts(capsys.readouterr().out)
    assert sorted({name for name, _ in parts}) == sorted(spec.answer_in)
    result = check(spec, load_pasted(spec, parts, tmp_path), show=False,
                   raise_on_failure=False, measure=False)
    if spec.kernel == "cupy" and not (torch.cuda.is_available() and not cuda.cupy_missing()):
        assert result.verdict == "NEEDS A GPU", result.message()  # compiled, not run
    else:
        assert result.passed, result.message()


def test_a_pasted_answer_without_its_guard_fails(tmp_path):
    """The test above can fail: paste online softmax's answer without the -inf guard, as
    an earlier level-3 hint had it, and the check catches it."""
    spec = next(s for s in all_problems() if s.id == "softmax/online")
    (name, code), = pasted_parts(hints.text(spec.id, hints.levels(spec)))
    unguarded = "\n".join(line for line in code.splitlines()
                          if not line.startswith("shift = ")).replace("shift", "m_new")
    result = check(spec, load_pasted(spec, [(name, unguarded)], tmp_path), show=False,
                   raise_on_failure=False, measure=False)
    assert not result.passed and "exp(-inf - (-inf)) = NaN" in result.message()
