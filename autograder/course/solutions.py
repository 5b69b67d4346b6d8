"""The course's own kernel for an exercise, where this copy of the course holds it.

A lab's charts run the learner's kernel once it has passed its check, and the course's
kernel from ``rooflab.kernels`` until then, so that no chart waits for an exercise. A
release (``rooflab release``) ships ``kernels/`` with every solution region replaced by
its stub: there the course's functions still import, but raise ``NotImplementedError``
(or fail further down) when they run. ``course_solution`` tells the two apart before
anything runs, by reading the module's source: a definition is a stub when it, or any
definition of ``kernels/`` it uses, holds a ``# YOUR CODE HERE`` line (``// YOUR CODE
HERE`` in CUDA C source), the line ``rooflab release`` puts in place of each answer.
Nothing is called to find out: a stub kernel may hang or crash rather than raise.

    if passed("coalescing/transpose"):
        transpose_fn = transpose  # the learner's, defined in the notebook
    else:
        transpose_fn = course_solution("transpose", "transpose")
    if transpose_fn is None:
        print("Solve exercise 3 (its check is above) to see this chart: it runs your kernel.")
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .build import BEGIN, C_BEGIN, C_END, END, stub

# The first line that `stub` (the build's, and the release's) writes in place of a solution
# region, in Python and in CUDA C: "# YOUR CODE HERE", "// YOUR CODE HERE".
STUB_LINES = tuple(stub(f"{begin}\n{end}").splitlines()[0]
                   for begin, end in ((BEGIN, END), (C_BEGIN, C_END)))
KERNELS = "rooflab.kernels"

# name -> (its source, the names it reads); name -> (the module it is imported from, its name)
Definitions = dict[str, tuple[str, set[str]]]
Imports = dict[str, tuple[str, str]]


def course_solution(module: str, name: str) -> Callable[..., Any] | None:
    """The course's ``name`` (a function or a class) from ``rooflab.kernels.<module>``, or
    ``None`` where that definition, or one it uses, is a stub in this copy of the course:
    a release, whose ``kernels/`` holds no answers.

    ``module`` is a module of ``kernels/`` by its short name (``"transpose"``), or any
    module by its dotted name. What a definition uses is followed through the module and
    through the modules of its own package it imports from, never run.
    """
    module_name = module if "." in module else f"{KERNELS}.{module}"
    if _uses_a_stub(module_name, name, set(), {}):
        return None
    return getattr(importlib.import_module(module_name), name)


def _uses_a_stub(module_name: str, name: str, seen: set[tuple[str, str]],
                 modules: dict[str, tuple[Definitions, Imports]]) -> bool:
    """Whether ``name`` of ``module_name``, or a definition it reaches, holds a stub.
    ``seen``: the definitions visited; ``modules``: each module read, read once."""
    if (module_name, name) in seen:
        return False
    seen.add((module_name, name))
    if module_name not in modules:
        modules[module_name] = _read(module_name)
    definitions, imported = modules[module_name]
    if name in imported:
        return _uses_a_stub(*imported[name], seen, modules)
    if name not in definitions:  # a builtin, torch, triton: not the course's to stub
        return False
    source, used = definitions[name]
    return (any(line.strip() in STUB_LINES for line in source.splitlines())
            or any(_uses_a_stub(module_name, other, seen, modules) for other in sorted(used)))


def _read(module_name: str) -> tuple[Definitions, Imports]:
    """The top-level definitions of a module, each as (its source, the names it reads),
    and the names it imports from the other modules of its package, each as (module,
    name). Read from the file: the module is not run."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module named {module_name!r}")
    source = Path(spec.origin).read_text()
    lines = source.splitlines()
    definitions: Definitions = {}
    imported: Imports = {}
    package = module_name.rpartition(".")[0]
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom):
            origin = (importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                  package) if node.level else node.module)
            if origin and origin.startswith(f"{package}."):
                for alias in node.names:
                    imported[alias.asname or alias.name] = (origin, alias.name)
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [target.id for target in targets if isinstance(target, ast.Name)]
        else:
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        text = "\n".join(lines[first - 1 : node.end_lineno])
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - set(names)
        for defined in names:
            definitions[defined] = (text, used)
    return definitions, imported
