"""Build the notebooks from the lab masters: ``rooflab build``.

Each lab has one master, ``book/NN_topic.md``, a MyST Markdown notebook (the text format
Jupyter Book and jupytext read): prose, and code cells fenced as ```` ```{code-cell} ````
with optional ``:tags: [...]``. From it the build writes two notebooks:

* ``solutions/NN_topic.ipynb``: complete;
* ``labs/NN_topic.ipynb``: each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region
  replaced by ``# YOUR CODE HERE`` and ``raise NotImplementedError()``, indentation kept;
  in CUDA C source (a string in the kernel module), a ``// BEGIN SOLUTION`` ...
  ``// END SOLUTION`` region becomes ``// YOUR CODE HERE``.

Kernel code is written once, in ``kernels/``. A code cell line
``# rooflab-inline: rooflab.kernels.vector_add:add_kernel,vector_add`` is replaced by the
source of those top-level definitions (functions and classes with their decorators, or
assignments such as a CUDA C source string), so the learner reads and
edits the kernel in the notebook while the tested module stays the single source.

A line ``# rooflab-scratch: rooflab.kernels.vector_add:add_kernel,vector_add`` is the same
exercise from a blank cell: the solution notebook has the definitions as ``rooflab-inline``
gives them; the learner's has only the last one's signature and docstring over a stub, and
a line that says which kernels to write above it. The learner writes the rest.

Notebooks are written without outputs and with stable cell ids, so building twice gives
the same bytes; ``rooflab build --check`` says which committed notebooks are stale.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import points

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
# The tag of a code cell that holds a solution region: the cells a learner writes, and the
# only ones `rooflab grade` takes from a submission (it restores every other from labs/).
SOLUTION_TAG = "solution"
C_BEGIN, C_END = "// BEGIN SOLUTION", "// END SOLUTION"
# Inside a solution region, the key lines of the answer (what a hint's last level shows)
# sit between these. Only the kernels carry them: the notebooks never show them. Where
# several exercises fill the same function (ZeRO-3, prefetching and mixed precision all
# fill ShardedLayer), a key marker names the problems whose key lines it opens:
# ``### KEY fsdp/prefetch``, or ``### KEY fsdp/zero3 fsdp/precision``. An unnamed one opens
# key lines of every problem whose answer is in the function.
KEY, END_KEY = "### KEY", "### END KEY"
C_KEY, C_END_KEY = "// KEY", "// END KEY"
KEY_MARKER = re.compile(r"^(?:###|//) (?:(END) KEY|KEY((?: [\w/]+)*))$")
INLINE = re.compile(r"^(\s*)# rooflab-inline: ([\w.]+):([\w,\s]+)$")
SCRATCH = re.compile(r"^# rooflab-scratch: ([\w.]+):([\w,\s]+)$")
MASTER_NAME = re.compile(r"^\d\d_[a-z0-9_]+\.md$")


@dataclass
class Cell:
    kind: str  # "markdown" or "code"
    source: str
    tags: list[str] = field(default_factory=list)


def front_matter(text: str) -> dict:
    """The YAML between a master's first two ``---`` lines (empty without them)."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    import yaml

    return yaml.safe_load("\n".join(lines[1:lines.index("---", 1)])) or {}


def read_master(text: str) -> list[Cell]:
    """Cells of a MyST Markdown notebook. ``+++`` splits markdown cells."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # front matter (kernelspec and the like)
        lines = lines[lines.index("---", 1) + 1 :]
    cells: list[Cell] = []
    prose: list[str] = []

    def flush_prose() -> None:
        for chunk in "\n".join(prose).split("\n+++\n"):
            if chunk.strip():
                cells.append(Cell("markdown", chunk.strip("\n")))
        prose.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```{code-cell}"):
            flush_prose()
            i += 1
            tags: list[str] = []
            if i < len(lines) and lines[i].startswith(":tags:"):
                tags = [t.strip() for t in lines[i].split(":", 2)[2].strip(" []").split(",")]
                i += 1
            code = []
            while lines[i] != "```":
                code.append(lines[i])
                i += 1
            cells.append(Cell("code", "\n".join(code).strip("\n"), [t for t in tags if t]))
        elif line.strip() == "+++":
            prose.append("+++")
        else:
            prose.append(line)
        i += 1
    flush_prose()
    return cells


def definition_source(module_name: str, names: list[str]) -> str:
    """Source of top-level functions/classes in a module, decorators included, in the
    order asked, separated by two blank lines."""
    module = importlib.import_module(module_name)
    path = Path(module.__file__)
    source = path.read_text()
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = _with_comments_above(lines, node.lineno, node.end_lineno)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            end = node.end_lineno
            # Keep comments that close the body (a trailing "### END SOLUTION").
            body_indent = node.col_offset + 1
            while end < len(lines) and lines[end].lstrip().startswith("#") and (
                    len(lines[end]) - len(lines[end].lstrip()) >= body_indent):
                end += 1
            found[node.name] = "\n".join(lines[start - 1 : end])
    missing = [name for name in names if name not in found]
    if missing:
        raise KeyError(f"{module_name} has no top-level {', '.join(missing)}")
    return "\n\n\n".join(found[name] for name in names)


def _with_comments_above(lines: list[str], first: int, last: int) -> str:
    """Lines first..last (1-based), with the comment lines right above them."""
    while first > 1 and lines[first - 2].startswith("#"):
        first -= 1
    return "\n".join(lines[first - 1 : last])


def inline(source: str) -> str:
    """Replace each ``# rooflab-inline: module:a,b`` line with the definitions' source."""
    out = []
    for line in source.splitlines():
        match = INLINE.match(line)
        if match:
            indent, module_name, names = match.groups()
            code = definition_source(module_name, [n.strip() for n in names.split(",")])
            out.extend(indent + code_line if code_line else "" for code_line in code.splitlines())
        else:
            out.append(line)
    return "\n".join(out)


def from_scratch(source: str, learner: bool) -> str:
    """Expand each ``# rooflab-scratch: module:a,b`` line: in the solution, as an inline
    line; in the learner's notebook, as ``b``'s signature and docstring over a solution
    region, under a comment naming what else to write (``a``, by its name only)."""
    out = []
    for line in source.splitlines():
        match = SCRATCH.match(line)
        if not match:
            out.append(line)
            continue
        module_name, names = match.groups()
        *helpers, entry = [name.strip() for name in names.split(",")]
        if not learner:
            out.append(f"# rooflab-inline: {module_name}:{','.join([*helpers, entry])}")
            continue
        if helpers:
            what = " and ".join([", ".join(helpers[:-1]), helpers[-1]] if len(helpers) > 1
                                else helpers)
            out += [f"# Write {what} here, above the function below", "# (the names and "
                    "signatures are yours to choose)."]
        out.extend(_signature_over_a_stub(definition_source(module_name, [entry])))
    return "\n".join(out)


def _signature_over_a_stub(source: str) -> list[str]:
    """A function's decorators and signature, the first paragraph of its docstring (the
    contract; what follows is the course's design notes), its body one solution region."""
    node = ast.parse(source).body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError(f"rooflab-scratch: {getattr(node, 'name', node)} is not a function")
    lines = source.splitlines()
    first = node.body[0]
    indent = " " * first.col_offset
    contract = (ast.get_docstring(node) or "").split("\n\n")[0]
    head = lines[: first.lineno - 1]
    if contract:
        text = "\n".join(f"{indent}{line}" if line else "" for line in contract.splitlines())
        head.append(f'{indent}"""{text.lstrip()}"""')
    return [*head, f"{indent}{BEGIN}", f"{indent}{END}"]


def key_marker(line: str) -> tuple[bool, tuple[str, ...]] | None:
    """For a line that is a key marker: whether it opens key lines (or ends them), and the
    problems it names (none: every problem). None for any other line."""
    match = KEY_MARKER.match(line.strip())
    if match is None:
        return None
    return match.group(1) is None, tuple((match.group(2) or "").split())


def solution(source: str) -> str:
    """The complete version: solution markers and key markers removed, code kept."""
    markers = (BEGIN, END, C_BEGIN, C_END)
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in markers and key_marker(line) is None)


def regions(source: str) -> list[str]:
    """The code inside each solution region (Python's ``###`` markers or CUDA C's
    ``//`` ones), dedented: what a learner writes in place of each stub."""
    import textwrap

    found, inside = [], None
    for line in source.splitlines():
        stripped = line.strip()
        if stripped in (BEGIN, C_BEGIN):
            inside = []
        elif stripped in (END, C_END):
            found.append(textwrap.dedent("\n".join(inside)))
            inside = None
        elif inside is not None:
            inside.append(line)
    return found


# The line a Python stub raises from. A check that sees the learner's code raise from it
# says "not implemented yet" rather than "failed".
STUB_RAISE = "raise NotImplementedError()"


def is_stub_raise(line: str) -> bool:
    """Whether a line of source is a stub's raise (with or without the brackets)."""
    return line.strip() in (STUB_RAISE, STUB_RAISE[:-2])


# The course's own kernels. In a copy without answers (``rooflab release``) they are stubs:
# a stub's raise from one of them is the course's, reached by code that called it instead
# of writing the exercise, not the learner's own stub.
KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def course_stub(filename: str, function: str, line: str) -> str:
    """``rooflab.kernels.<module>.<function>`` when this frame is a stub's raise in the
    course's kernels; "" otherwise."""
    try:
        inside = Path(filename).resolve().relative_to(KERNELS)
    except (OSError, ValueError):
        return ""
    if not is_stub_raise(line):
        return ""
    return ".".join(("rooflab.kernels", *inside.with_suffix("").parts, function))


def course_stub_called(name: str) -> str:
    """The words for a check whose candidate reached one of the course's stubs."""
    return (f"your code called {name}, which this copy of the course ships as a stub "
            "(its kernels come without their answers): write the exercise's code yourself")


def stub(source: str) -> str:
    """The learner's version: each solution region becomes a stub at its indentation."""
    out, inside = [], False
    for line in source.splitlines():
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if stripped == BEGIN:
            out += [f"{indent}# YOUR CODE HERE", f"{indent}{STUB_RAISE}"]
            inside = True
        elif stripped == C_BEGIN:
            out.append(f"{indent}// YOUR CODE HERE")
            inside = True
        elif stripped in (END, C_END):
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN} without {END}")
    return "\n".join(out)


def notebook_json(cells: list[Cell], stem: str, learner: bool, metadata: dict | None = None
                  ) -> str:
    """A notebook (nbformat 4.5) as JSON text: no outputs, stable ids, sorted keys;
    ``metadata`` added to the notebook's (the points of its exercises)."""
    nb_cells = []
    for index, cell in enumerate(cells):
        source, tags = cell.source, list(cell.tags)
        if cell.kind == "code":
            source = inline(from_scratch(source, learner))
            if regions(source):  # the learner's to write: a grader takes it from them
                tags.append(SOLUTION_TAG)
            source = stub(source) if learner else solution(source)
        entry = {
            "cell_type": cell.kind,
            "id": f"{stem[:2]}-{index:03d}",
            "metadata": {"tags": tags} if tags else {},
            "source": source.splitlines(keepends=True),
        }
        if cell.kind == "code":
            entry.update(execution_count=None, outputs=[])
        nb_cells.append(entry)
    notebook = {
        "cells": nb_cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
            **(metadata or {}),
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def masters(root: Path) -> list[Path]:
    return sorted(p for p in (root / "book").glob("*.md") if MASTER_NAME.match(p.name))


def outputs(master: Path, root: Path) -> dict[Path, str]:
    """The two notebooks a master builds into, by path."""
    text = master.read_text()
    cells = read_master(text)
    grading = points.as_metadata(points.parse(front_matter(text), master.name))
    name = master.with_suffix(".ipynb").name
    return {
        root / "labs" / name: notebook_json(cells, master.stem, True, grading),
        root / "solutions" / name: notebook_json(cells, master.stem, False, grading),
    }


def build(root: Path, check_only: bool = False) -> list[Path]:
    """Write (or, with ``check_only``, compare) every notebook. Returns the stale ones."""
    stale = []
    for master in masters(root):
        for path, text in outputs(master, root).items():
            if not path.exists() or path.read_text() != text:
                stale.append(path)
                if not check_only:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
    return stale
