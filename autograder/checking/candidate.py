"""The candidate a command line names: ``FILE.py:FUNCTION`` or ``MODULE:FUNCTION``.

Two kinds of failure are told apart: the command line is wrong (``UsageError``: no such
file, no such function; ``rooflab`` exits 2), or the learner's file cannot even be loaded
(``CandidateError``: a syntax error, an import that fails; a FAIL, exit 1). ``rooflab
check`` loads the candidate in the child that runs it (``isolated.py``), never in the
grader's own process.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path


class UsageError(Exception):
    """The command line is wrong (exit 2), as opposed to the kernel (exit 1)."""


class CandidateError(Exception):
    """The learner's file could not even be loaded (exit 1: their bug, not a usage error)."""


def _where(error: BaseException) -> str:
    """The error and the line of the learner's file that caused it."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} (line {error.lineno}: {(error.text or '').strip()})"
    frames = traceback.extract_tb(error.__traceback__)
    place = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
    return f"{type(error).__name__}: {error}{place}"


def check_target(spec: str) -> None:
    """The usage errors that need no import: a malformed target, a missing file."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise UsageError(f"expected FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    if target.endswith(".py") and not Path(target).is_file():
        raise UsageError(f"no such file: {target}")


def load_function(spec: str) -> Callable:
    """``path/to/file.py:func`` or ``package.module:func`` -> the function."""
    check_target(spec)
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:
            raise CandidateError(f"could not load {target}: {_where(error)}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as error:
            if error.name and target.startswith(error.name):
                raise UsageError(f"no module named {target!r}") from None
            raise CandidateError(f"could not import {target}: {_where(error)}") from None
        except Exception as error:
            raise CandidateError(f"could not import {target}: {_where(error)}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UsageError(f"{target} has no function {name!r}")
    return function
