"""Hints: the last level of every exercise shows the key lines of its answer, each where it
goes, and they are the solution's own: with the solution's other lines around them (the
learner's part), they make the solved module, which passes its check (test_solutions.py
runs it). A long region shows only a few of its lines, and no hint more than a third of
its answer, nor another exercise's key lines."""

import ast
import importlib.util
import math
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
    END,
    definition_source,
    key_marker,
    regions,
    solution,
)

WITH_ANSWER = [spec for spec in all_problems() if spec.answer_in]
HEADER = re.compile(r"^in `(\w+)`(?:, part (\d+) of \d+)?:$")
LONG = 6  # a region of more lines than this is more than its key lines
WHITEBOARD = 10  # the most lines of code a hint's key lines may hold in one part
TOTAL = 12  # ... and in all its parts together
SHARE = 3  # a hint shows at most one line of code in SHARE of the regions it is drawn from


def pasted_parts(text: str) -> list[tuple[str, int, str]]:
    """(name, index, code) for each part of a printed hint: the function, which of its
    stubs (0 for the first), and the code as a learner copies it (the printed block, four
    spaces in)."""
    parts, lines = [], text.splitlines()
    for index, line in enumerate(lines):
        match = HEADER.match(line)
        if match:
            block = []
            for code in lines[index + 2:]:
                if HEADER.match(code):
                    break
                block.append(code[4:] if code.startswith("    ") else code)
            parts.append((match.group(1), int(match.group(2) or 1) - 1,
                          "\n".join(block).strip("\n")))
    return parts


def solved_regions(spec, name: str) -> list[str]:
    """The solution's regions in ``name``, as the solved notebook has them (no key
    markers)."""
    source = definition_source(spec.solution.partition(":")[0], [name])
    return regions("\n".join(line for line in source.splitlines()
                             if key_marker(line) is None))


def code_lines(code: str) -> list[str]:
    """The lines of code in a block, as their text: not blank, comments or ``...``."""
    return [line.strip() for line in code.splitlines() if line.strip()
            and line.strip() != hints.ELIDED and not line.strip().startswith(("#", "//"))]


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


def filled_parts(spec, text: str) -> list[tuple[str, int, str]]:
    """Each part of a printed last hint, filled in with the rest of the solution: with
    the lines each ``...`` stands for, other exercises' key lines among them."""
    filled = []
    for name, index, shown in pasted_parts(text):
        assert name in spec.answer_in, f"{spec.id}: {name} is not in its answer"
        code = filled_in(shown, solved_regions(spec, name)[index])
        assert code is not None, f"{spec.id}, in {name}: {shown!r} is not the solution's"
        filled.append((name, index, code))
    return filled


def _owner(tree: ast.Module, line: int) -> str:
    """The top-level function, class or assignment that line ``line`` (1-based) is in."""
    for node in tree.body:
        if node.lineno <= line <= node.end_lineno:
            if isinstance(node, ast.Assign):
                return node.targets[0].id
            return getattr(node, "name", "")
    return ""


def with_answer_pasted(source: str, parts: list[tuple[str, int, str]]) -> str:
    """The module as a learner who pasted ``parts`` has it: the regions the parts name
    replaced by the pasted code at the stub's indentation, every other region solved."""
    tree = ast.parse(source)
    queue = {(name, index): code for name, index, code in parts}
    seen: dict[str, int] = {}
    out, skipping = [], False
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if stripped in (BEGIN, C_BEGIN):
            owner = _owner(tree, number)
            seen[owner] = seen.get(owner, -1) + 1
            code = queue.pop((owner, seen[owner]), None)
            if code is not None:
                out += [indent + pasted if pasted else "" for pasted in code.splitlines()]
                skipping = True
            continue
        if stripped in (END, C_END):
            skipping = False
            continue
        if not skipping and key_marker(line) is None:
            out.append(line)
    assert not queue, f"parts with no stub to go in: {queue}"
    return "\n".join(out)


def module_source(spec) -> str:
    module_name = spec.solution.partition(":")[0]
    return Path(importlib.util.find_spec(module_name).origin).read_text()


def load_pasted(spec, parts: list[tuple[str, int, str]], folder: Path):
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
    """Each part filled in, as above, and pasted in place of its stub. A stub that holds
    none of the exercise's key lines is not shown, and the hint says where it is."""
    hints.hint(spec.id, hints.levels(spec))
    text = capsys.readouterr().out
    parts = filled_parts(spec, text)
    assert parts, f"{spec.id}: no key lines"
    shown = {(name, index) for name, index, _ in parts}
    said = next((line for line in text.splitlines() if "Not shown, as" in line), "")
    for name in spec.answer_in:
        if any((name, index) not in shown for index in range(len(solved_regions(spec, name)))):
            assert f"`{name}`" in said.partition("Not shown, as")[2], \
                f"{spec.id}: a stub of {name} is neither shown nor said to be left out"
    source = module_source(spec)
    assert with_answer_pasted(source, parts) == solution(source)


@pytest.mark.parametrize("spec", WITH_ANSWER, ids=[s.id for s in WITH_ANSWER])
def test_the_last_hint_is_the_key_lines_not_a_long_region_whole(spec):
    for name, index, shown in pasted_parts(hints.text(spec.id, hints.levels(spec))):
        region = solved_regions(spec, name)[index]
        key = [line for line in shown.splitlines()
               if line.strip() and line.strip() != hints.ELIDED]
        code = [line for line in key if not line.strip().startswith(("#", "//"))]
        lines = [line for line in region.splitlines() if line.strip()]
        assert code, f"{spec.id}: no key line in {name}"
        assert len(code) <= WHITEBOARD, f"{spec.id}: {len(code)} key lines in {name}"
        if len(lines) > LONG:
            assert len(key) < len(lines), f"{spec.id}: all {len(lines)} lines of {name}"


@pytest.mark.parametrize("spec", WITH_ANSWER, ids=[s.id for s in WITH_ANSWER])
def test_the_last_hint_is_a_few_lines_a_third_of_the_answer_and_its_exercises_own(spec):
    """At most TOTAL lines of code in all its parts, and at most a third of those of the
    solution regions they are drawn from (each region's third rounded up to a whole line:
    a part shows one line at least). And where another problem's answer is in one of the
    same functions, none of the lines of code either shows from it is the other's: each
    shows the key lines of its own exercise."""
    def shown(problem) -> list[tuple[str, list[str]]]:
        return [(name, code_lines(code)) for name, _, code in
                pasted_parts(hints.text(problem.id, hints.levels(problem)))]

    counts = {name: 0 for name in spec.answer_in}
    for name, lines in shown(spec):
        counts[name] += len(lines)
    total = sum(counts.values())
    third = {name: sum(math.ceil(len(code_lines(region)) / SHARE)
                       for region in solved_regions(spec, name)) for name in spec.answer_in}
    assert total <= TOTAL, f"{spec.id}: {total} lines of code, {counts}"
    assert total <= sum(third.values()), \
        f"{spec.id}: {total} lines of code, {counts}; a third of the answer is {third}"
    module = spec.solution.partition(":")[0]
    for other in WITH_ANSWER:
        if other is spec or other.solution.partition(":")[0] != module:
            continue
        for name in sorted(set(spec.answer_in) & set(other.answer_in)):
            mine = {line for owner, lines in shown(spec) if owner == name for line in lines}
            theirs = {line for owner, lines in shown(other) if owner == name for line in lines}
            assert not mine & theirs, \
                f"{spec.id} shows {other.id}'s key lines in {name}: {sorted(mine & theirs)}"


def test_every_answer_marks_its_key_lines_and_the_marks_leave_no_trace():
    """Each exercise marks key lines in the functions it names, and a marker names only
    problems whose answer is in its function. Where the build and a release drop a region,
    its key markers go with it: so they sit only inside regions, in pairs. And the solved
    notebooks' code has none."""
    answered_by: dict[tuple[str, str], set[str]] = {}
    for spec in WITH_ANSWER:
        for name in spec.answer_in:
            answered_by.setdefault((spec.solution.partition(":")[0], name), set()).add(spec.id)
    marked = set()
    for (module, name), problems in answered_by.items():
        for region in regions(definition_source(module, [name])):
            markers = [marker for line in region.splitlines() if (marker := key_marker(line))]
            named = {problem for _, names in markers for problem in names}
            assert named <= problems, f"{name} is not in {sorted(named - problems)}'s answer"
            marked |= {problem for problem in problems for opens, names in markers
                       if opens and (not names or problem in names)}
    assert marked == {spec.id for spec in WITH_ANSWER}, \
        f"no key lines marked: {sorted({spec.id for spec in WITH_ANSWER} - marked)}"
    for path in sorted(Path(kernels.__file__).parent.glob("*.py")):
        region = key = False
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            where, stripped, marker = f"{path.name}:{number}", line.strip(), key_marker(line)
            if stripped in (BEGIN, C_BEGIN, END, C_END):
                assert not key, f"{where}: a key section left open"
                region = stripped in (BEGIN, C_BEGIN)
            elif marker is not None:
                assert region, f"{where}: a key marker outside a solution region"
                assert key != marker[0], f"{where}: unpaired"
                key = marker[0]
            else:
                assert not re.match(r"(###|//)\s*(END\s*)?KEY\b", stripped), \
                    f"{where}: not a key marker as the build reads them: {stripped!r}"
        assert not any(key_marker(line) is not None
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
    earlier hint had them), or one of them indented into another block, are not the
    solution's."""
    spec = next(s for s in all_problems() if s.id == "softmax/online")
    (name, _, shown), = pasted_parts(hints.text(spec.id, hints.levels(spec)))
    region, = solved_regions(spec, name)
    assert filled_in(shown, region) is not None
    unguarded = "\n".join(line for line in shown.splitlines()
                          if not line.startswith("shift = ")).replace("shift", "m_new")
    assert filled_in(unguarded, region) is None
    assert filled_in(shown.replace("d = d * ", "    d = d * "), region) is None
