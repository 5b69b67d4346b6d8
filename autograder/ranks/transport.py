"""How the learner's function gets into the rank processes.

A function written in a notebook cell lives in the Jupyter kernel's ``__main__``: no
other process can import it by name. So it travels by value, pickled with cloudpickle,
which writes a function's code, defaults, closure and the globals it uses. Functions of
the course (``rooflab.*``) and of installed packages travel by reference and are imported
in the ranks as usual; any other module's functions (a learner's ``my_ring.py``, a test
module, a file loaded by path) travel by value too, since the ranks may not find that
module on their path. The ranks also get the grader's ``sys.path`` and working folder, for
the modules such a function imports.

Without cloudpickle, plain pickle still sends a function that can be imported by name,
and a cell's function fails with a message that says what to install.
"""

from __future__ import annotations

import functools
import pickle
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

_INSTALLED = {Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
              if (p := sysconfig.get_paths().get(key))}


class CannotSend(Exception):
    """The function cannot be pickled for the ranks; the message says why, in words."""


def _importable_elsewhere(module: ModuleType) -> bool:
    """Would a fresh Python with the same sys.path import this module as it is here?"""
    if module.__name__ == "__main__":
        return False
    if module.__name__.split(".")[0] == "rooflab":
        return True
    file = getattr(module, "__file__", None)
    if file is None:  # built in
        return True
    path = Path(file).resolve()
    return any(path.is_relative_to(root) for root in _INSTALLED)


def pack(function: Callable, harness: Callable | None = None) -> bytes:
    """The function as bytes the ranks can load with ``unpack``; with ``harness`` (the
    grader's code that drives it on each rank, importable by name), what the ranks load
    is ``harness`` with ``function`` as its first argument."""
    sent = function if harness is None else functools.partial(harness, function)
    try:
        import cloudpickle
    except ImportError:
        try:
            return pickle.dumps(sent)
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            raise CannotSend(
                f"{_name(function)} cannot be sent to the rank processes without cloudpickle "
                f"({error}): `pip install cloudpickle`, or define it in a module") from None
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    by_value = module is not None and module.__name__ != "__main__" and \
        not _importable_elsewhere(module)
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return _dumps(sent)
    except Exception as error:  # noqa: BLE001 (whatever fails, the learner needs words)
        culprit = _first_unsendable(function)
        what = f"it uses {culprit}, which" if culprit else "something it uses"
        raise CannotSend(
            f"{_name(function)} cannot be sent to the rank processes: {what} cannot be "
            f"copied to another process ({type(error).__name__}: {error}). It may use only "
            "what can be: no open file, lock, thread or process group of this one; make "
            "such a thing on each rank, inside the function") from None
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def _dumps(item: object) -> bytes:
    """cloudpickle's bytes for ``item``, the operators of ``torch.ops`` and the namespaces
    of ``torch.classes`` sent by name (they hold C++ handles, which no pickle copies; each
    process has its own by that name). cloudpickle sends them when a function names
    them, as submodules of torch."""
    import io

    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            found = _torch_path(obj)
            if found is not None:
                return from_torch, found
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(item)
    return buffer.getvalue()


def _torch_path(obj: object) -> tuple[str, str] | None:
    """Where ``obj`` is under torch: ("ops", "c10d.allreduce_.default"), ("ops", "") for
    ``torch.ops`` itself, ("classes", "c10d") for a namespace of ``torch.classes``; None
    if it is none of its namespaces or operators."""
    torch = sys.modules.get("torch")
    ops, classes = getattr(torch, "_ops", None), getattr(torch, "_classes", None)
    if ops is not None:
        if isinstance(obj, ops._Ops):
            return "ops", ""
        if isinstance(obj, ops._OpNamespace):
            return "ops", obj.name
        if isinstance(obj, ops.OpOverloadPacket):
            return "ops", obj._qualified_op_name.replace("::", ".")
        if isinstance(obj, ops.OpOverload):
            packet = obj.overloadpacket._qualified_op_name.replace("::", ".")
            return "ops", f"{packet}.{obj._overloadname}"
    if classes is not None:
        if isinstance(obj, classes._Classes):
            return "classes", ""
        if isinstance(obj, classes._ClassNamespace):
            return "classes", obj.name
    return None


def from_torch(root: str, path: str) -> object:
    """``torch.<root>`` and the dotted ``path`` under it, in this process."""
    import torch

    found: object = getattr(torch, root)
    for part in filter(None, path.split(".")):
        found = getattr(found, part)
    return found


def _first_unsendable(function: Callable) -> str:
    """The first global or closure variable of ``function`` that cannot be pickled, in
    words ("`lock` (a _thread.lock)"), or "" if each can be on its own."""
    code = getattr(function, "__code__", None)
    names = getattr(function, "__globals__", {})
    used = [(name, names[name]) for name in (code.co_names if code else ()) if name in names]
    cells = zip(code.co_freevars if code else (), getattr(function, "__closure__", None) or (),
                strict=False)
    used += [(name, cell.cell_contents) for name, cell in cells if _filled(cell)]
    for name, value in used:
        if isinstance(value, ModuleType):
            continue  # sent by reference, or with the function's own module
        try:
            _dumps(value)
        except Exception:  # noqa: BLE001
            return f"`{name}` (a {type(value).__module__}.{type(value).__qualname__})"
    return ""


def unpack(payload: bytes) -> Callable:
    """The function again, in a rank (or the process that starts the ranks)."""
    return pickle.loads(payload)


def _name(function: Callable) -> str:
    return f"`{getattr(function, '__qualname__', None) or type(function).__name__}`"


def code_files(function: Callable) -> dict[str, list[tuple[int, int, str]]]:
    """Where the code sent with the function came from: function name -> [(first line,
    last line, file)]. cloudpickle writes every file name as "<dynamic-code>"; with this
    the grader can point a rank's traceback at the learner's own cell or file again. The
    methods of the classes sent by value are included: a learner's class in a cell."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    seen: set[int] = set()
    pending: list[object] = [function]
    while pending and len(seen) < 500:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, type):
            pending += _methods(item) if _sent_by_value(item) else []
            continue
        code = getattr(item, "__code__", None)
        if code is None and callable(item) and not isinstance(item, type):
            code = getattr(type(item).__call__, "__code__", None)  # a callable object
        if code is None:
            continue
        used: set[str] = set()  # the global names it and its nested functions use
        for inner in _codes(code):
            lines = [line for _, _, line in inner.co_lines() if line is not None]
            last = max(lines, default=inner.co_firstlineno)
            found.setdefault(inner.co_name, []).append(
                (inner.co_firstlineno, last, inner.co_filename))
            used.update(inner.co_names)
        names = getattr(item, "__globals__", {})
        pending += [names[name] for name in sorted(used) if callable(names.get(name))]
        pending += [cell.cell_contents for cell in getattr(item, "__closure__", None) or ()
                    if _filled(cell) and callable(cell.cell_contents)]
    return found


def _sent_by_value(cls: type) -> bool:
    """Does cloudpickle send this class by value (a notebook's, or a module's that the
    ranks may not import), so that its methods' file names become "<dynamic-code>"?"""
    module = sys.modules.get(cls.__module__)
    return module is None or not _importable_elsewhere(module)


def _methods(cls: type) -> list[object]:
    """The functions a class defines (properties' and static methods' too), and its
    bases, to walk as the function's own code."""
    found: list[object] = [base for base in cls.__bases__ if base is not object]
    for member in vars(cls).values():
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            found += [f for f in (member.fget, member.fset, member.fdel) if f is not None]
        elif callable(member):  # a method, or a class defined inside the class
            found.append(member)
    return found


def installed(filename: str) -> bool:
    """Is this file part of Python or of an installed package (never the learner's)?"""
    if filename.startswith("<"):
        return False
    try:
        path = Path(filename).resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    return any(path.is_relative_to(root) for root in _INSTALLED)


def _codes(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_lines"):
            yield from _codes(const)


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def real_file(files: dict[str, list[tuple[int, int, str]]], filename: str, line: int,
              name: str) -> str:
    """The file a rank's frame ("<dynamic-code>", line, function) really came from."""
    if filename != "<dynamic-code>":
        return filename
    for first, last, path in files.get(name, ()):
        if first <= line <= last:
            return path
    return filename
