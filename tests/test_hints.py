"""Hints: the last level of every exercise shows the key lines of its answer, each where it
goes, and they are the solution's own: with the solution's other lines around them (the
learner's part), they make the solved module, which passes its check (test_solutions.py
runs it). A long region shows only a few of its lines."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from rooflab import kernels
from rooflab.autograder import all_problems, check
from rooflab.autograder.checking import hints
from rooflab.autograder.course.build import (
    BEGIN,
    C_BEGIN,
    C_END,
    C_END_KEY,
    C_KEY,
    END,
    END_KEY,
    KEY,
    definition_source,
    regions,
    solution,
)

WITH_ANSWER = [spec for spec in all_problems() if spec.answer_in]
HEADER = re.compile(r"^in `(\w+)`(?:, part (\d+) of \d+)?:$")
KEY_MARKERS = (KEY, END_KEY, C_KEY, C_END_KEY)
LONG = 6  # a region of more lines than this is more than its key lines
WHITEBOARD = 10  # the most lines of code a hint's key lines may hold


def pasted_parts(text: str) -> list[tuple[str, str]]:
    """(name, code) for each part of a printed hint, the code as a learner copies it (the
    printed block, four spaces in)."""
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


def solved_regions(spec, name: str) -> list[str]:
    """The solution's regions in ``name``, as the solved notebook has them (no key
    markers)."""
    source = definition_source(spec.solution.partition(":")[0], [name])
    return regions("\n".join(line for line in source.splitlines()
                             if line.strip() not in KEY_MARKERS))


def filled_in(shown: str, region: str) -> str | None:
    """The lines a hint shows with each ``...`` replaced by the solution's lines it stands
    for (at least one line of code: the learner's part), or None where the lines shown are
    not the solution's own, in its order, at its indentation."""
    pattern = [r"((?:[ \t]*\n)*)"]
    for line in shown.splitlines():
        if line.strip() == hints.ELIDED:
            pattern.append(r"((?:[ \t]*\n)*[^\n]*\S[^\n]*\n(?:[^\n]*\n)*?)")
        elif not line.strip():
            pattern.append(r"((?:[ \t]*\n)+)")
        else:
            pattern.append(f"({re.escape(line)}\n)")
    pattern.append(r"((?:[ \t]*\n)*)")
    match = re.fullmatch("".join(pattern), region + "\n")
    if match is None:
        return None
    pieces = iter(match.groups())
    out = [next(pieces)]
    for line in shown.splitlines():
        taken = next(pieces)
        out.append(f"{line}\n" if line.strip() and line.strip() != hints.ELIDED else taken)
    out.append(next(pieces))
    return "".join(out)[:-1]


def filled_parts(spec, text: str) -> list[tuple[str, str]]:
    """Each part of a printed last hint, filled in with the rest of the solution."""
    parts = pasted_parts(text)
    remaining = {name: solved_regions(spec, name) for name in spec.answer_in}
    filled = []
    for name, shown in parts:
        region = remaining[name].pop(0)
        code = filled_in(shown, region)
        assert code is not None, f"{spec.id}, in {name}: {shown!r} is not the solution's"
        filled.append((name, code))
    assert not any(remaining.values()), f"{spec.id}: parts not shown: {remaining}"
    return filled


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
        if not skipping and stripped not in KEY_MARKERS:
            out.append(line)
    assert not any(queue.values()), f"parts with no stub to go in: {queue}"
    return "\n".join(out)


def module_source(spec) -> str:
    module_name = spec.solution.partition(":")[0]
    return Path(importlib.util.find_spec(module_name).origin).read_text()


def load_pasted(spec, parts: list[tuple[str, str]], folder: Path):
    """The problem's solution function, from its module with ``parts`` pasted in."""
    module_name, _, function = spec.solution.partition(":")
    path = folder / f"pasted_{module_name.rsplit('.', 1)[1]}.py"
    path.write_text(with_answer_pasted(module_source(spec), parts) + "\n")
    loader = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return getattr(module, function)


@pytest.mark.parametrize("spec", WITH_ANSWER, ids=[s.id for s in WITH_ANSWER])
def test_the_key_lines_with_the_rest_of_the_solution_make_the_solved_module(spec, capsys):
    hints.hint(spec.id, hints.levels(spec))
    parts = filled_parts(spec, capsys.readouterr().out)
    assert sorted({name for name, _ in parts}) == sorted(spec.answer_in)
    source = module_source(spec)
    assert with_answer_pasted(source, parts) == solution(source)


@pytest.mark.parametrize("spec", WITH_ANSWER, ids=[s.id for s in WITH_ANSWER])
def test_the_last_hint_is_the_key_lines_not_a_long_region_whole(spec):
    shown_parts = pasted_parts(hints.text(spec.id, hints.levels(spec)))
    solved = [region for name in spec.answer_in for region in solved_regions(spec, name)]
    for (name, shown), region in zip(shown_parts, solved, strict=True):
        key = [line for line in shown.splitlines()
               if line.strip() and line.strip() != hints.ELIDED]
        code = [line for line in key if not line.strip().startswith(("#", "//"))]
        lines = [line for line in region.splitlines() if line.strip()]
        assert code, f"{spec.id}: no key line in {name}"
        assert len(code) <= WHITEBOARD, f"{spec.id}: {len(code)} key lines in {name}"
        if len(lines) > LONG:
            assert len(key) < len(lines), f"{spec.id}: all {len(lines)} lines of {name}"


def test_every_answer_marks_its_key_lines_and_the_marks_leave_no_trace():
    """Each region an exercise names marks its key lines. Where the build and a release
    drop a region, its key markers go with it: so they sit only inside regions, in pairs.
    And the solved notebooks' code has none."""
    for spec in WITH_ANSWER:
        module = spec.solution.partition(":")[0]
        for name in spec.answer_in:
            for region in regions(definition_source(module, [name])):
                assert {KEY, C_KEY} & {line.strip() for line in region.splitlines()}, \
                    f"{spec.id}: no key lines marked in {name}"
    for path in sorted(Path(kernels.__file__).parent.glob("*.py")):
        region = key = False
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            where, stripped = f"{path.name}:{number}", line.strip()
            if stripped in (BEGIN, C_BEGIN, END, C_END):
                assert not key, f"{where}: a key section left open"
                region = stripped in (BEGIN, C_BEGIN)
            elif stripped in KEY_MARKERS:
                assert region, f"{where}: a key marker outside a solution region"
                assert key == (stripped in (END_KEY, C_END_KEY)), f"{where}: unpaired"
                key = not key
        assert not any(line.strip() in KEY_MARKERS
                       for line in solution(path.read_text()).splitlines())


def test_the_key_lines_of_online_softmax_with_the_rest_around_them_pass_its_check(
        tmp_path):
    spec = next(s for s in all_problems() if s.id == "softmax/online")
    text = hints.text(spec.id, hints.levels(spec))
    assert "The whole answer is in solutions/03_softmax.ipynb." in text
    result = check(spec, load_pasted(spec, filled_parts(spec, text), tmp_path), show=False,
                   raise_on_failure=False, measure=False)
    assert result.passed, result.message()


def test_key_lines_that_are_not_the_solutions_own_are_caught():
    """The first test can fail: online softmax's key lines without the -inf guard (as an
    earlier hint had them), or one of them moved out of its loop, are not the solution's."""
    spec = next(s for s in all_problems() if s.id == "softmax/online")
    (name, shown), = pasted_parts(hints.text(spec.id, hints.levels(spec)))
    region, = solved_regions(spec, name)
    assert filled_in(shown, region) is not None
    unguarded = "\n".join(line for line in shown.splitlines()
                          if not line.startswith("shift = ")).replace("shift", "m_new")
    assert filled_in(unguarded, region) is None
    assert filled_in(shown.replace("m_new = ", "    m_new = "), region) is None
