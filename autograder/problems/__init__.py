"""The course's problems, one module per lab. Importing this package registers them: every
module here but the helpers is imported, so a new lab's problems need no list to join.

A problem module says what an exercise is (``problem.py``) and may judge it with the
evidence a check gathers (``evidence/``), on N ranks (``ranks/``), against the course's
own kernels (``rooflab.kernels``), from a kernel's trace (``model/``) or on the device
(``device/``). The engine above (``checking/``) finds a problem here by its id.
"""

import importlib
import pkgutil

from ..problem import Problem, registered

_HELPERS = {"traced"}  # shared by the problem modules; it registers nothing

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _HELPERS:
        importlib.import_module(f"{__name__}.{_module.name}")


def get(problem_id: str) -> Problem:
    """The problem with this id ("<lab>/<exercise>"); KeyError, naming the known ones, if
    there is none."""
    try:
        return registered()[problem_id]
    except KeyError:
        known = ", ".join(sorted(registered()))
        raise KeyError(f"unknown problem {problem_id!r}; known problems: {known}") from None


def all_problems() -> list[Problem]:
    """Every registered problem, by id."""
    return [spec for _, spec in sorted(registered().items())]
