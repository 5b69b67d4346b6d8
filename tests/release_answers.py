"""Run on a release's ``rooflab`` (its ``kernels/`` stubbed): which answers it still ships.

For every problem, prints one JSON line: whether its named solution is a stub there, and
each other callable of that solution's module that is not a stub and takes the same
arguments (its first parameter named as the solution's), with the verdict of a check of
it, on the problem's first case and, if that passes, on every case. A release ships an
answer where such a callable passes. Used by tests/test_release.py.
"""

import ast
import dataclasses
import importlib
import inspect
import json
import sys

from rooflab.autograder import all_problems, check
from rooflab.autograder.course.solutions import course_solution


def positional(function) -> tuple[list[str], int]:
    """Its positional parameters' names, and how many of them have no default."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return [], 0
    named = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [p.name for p in named], sum(p.default is p.empty for p in named)


def others(module_name: str, solution) -> list[str]:
    """The public callables of ``module_name`` (not the solution, not stubs, not Triton
    kernels) that could be handed in where ``solution`` is."""
    module = importlib.import_module(module_name)
    names, required = positional(solution)
    found = []
    for node in ast.parse(inspect.getsource(module)).body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        function = course_solution(module_name, node.name)
        if function is None or function is solution or hasattr(function, "run"):
            continue
        theirs, theirs_required = positional(function)
        # Called as the solution is: with at least its required arguments, at most all.
        if theirs[:1] == names[:1] and theirs_required <= len(names) and len(theirs) >= required:
            found.append(node.name)
    return found


def verdict(spec, function) -> str:
    """PASS or why not: the first case alone, then every case if that one passes."""
    first = dataclasses.replace(spec, cpu_cases=spec.cpu_cases[:1],
                                gpu_cases=spec.gpu_cases[:1])
    for problem in (first, spec):
        result = check(problem, function, show=False, raise_on_failure=False, measure=False)
        if not result.passed:
            return result.verdict
    return "PASS"


def main() -> None:
    for spec in all_problems():
        module_name, _, name = spec.solution.rpartition(":")
        stubbed = course_solution(module_name, name) is None
        solution = getattr(importlib.import_module(module_name), name)
        tried = {other: verdict(spec, getattr(importlib.import_module(module_name), other))
                 for other in ([] if inspect.isclass(solution) else others(module_name,
                                                                           solution))}
        print(json.dumps({"problem": spec.id, "stubbed": stubbed, "others": tried}),
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
