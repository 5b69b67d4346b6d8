"""Which of the grader's own functions a plain-Python candidate called.

A plain-Python exercise (a cost formula, a timer, a sharding plan) launches no kernel
whose work can be watched: a candidate that hands back the grader's reference, calls it,
or times with the grader's own timer computes right answers. So while such a candidate
runs, every Python call is watched (``sys.setprofile``, and ``threading``'s for the threads
it starts), and each call from the learner's code into the grader's is noted by name: the
grader fails the exercise on it. So is whatever takes the candidate out of the watch:
switching the profiler off, or a thread it started before the check, still running.

Whose a frame is, its code tells. The grader's code is every code object of the modules of
``rooflab.autograder``, by identity (a file name can be made up; a code object of the
grader's cannot). A library's (the standard library, site-packages) acts for whoever
called it, so that the learner calling the grader through ``threading`` or ``functools``
is still the learner calling it. Everything else is the learner's (a notebook cell, the
candidate's file).

Not every call into the grader is a borrowed answer. A candidate may call what it was
handed (a stand-in GPU's methods, a loss function) and the grader's open parts (``OPEN``:
the face, the device queries, the traffic model); the grader's instruments run inside its
calls unasked (the recorder's dispatch mode, the tracer's hooks, the time limit).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType

from ..problem import registered

PACKAGE = "rooflab.autograder"
FOLDER = Path(__file__).resolve().parents[1]
LIBRARY = tuple(sorted({str(Path(p).resolve()) + os.sep for p in (
    sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"],
    sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}))
LEARNER, GRADER, LIBRARY_SIDE = "learner", "grader", "library"
# The grader's code a candidate may call, or that runs inside its calls unasked: the
# face, what a lab shows of the device, the traffic model, and the instruments.
OPEN = ("__init__.py", "problem.py", "device/__init__.py", "device/datasheet.py",
        "device/versions.py", "device/cuda.py", "model/", "evidence/",
        "checking/time_limit.py")
# Hooks of the grader's that torch calls inside a candidate's ops (a dispatch mode).
HOOKS = {"__torch_dispatch__", "__torch_function__"}
UNWATCHED = "unwatched: "  # a note of what took the candidate out of the watch


class _GraderCode:
    """The ids of the grader's code objects, and of its open ones, gathered from its
    modules (again whenever more of them have been imported)."""

    def __init__(self) -> None:
        self.modules = 0
        self.seen: set = set()  # the (name, module) pairs of sys.modules looked at
        self.all: set[int] = set()
        self.open: set[int] = set()
        self._keep: list[CodeType] = []  # the code objects themselves, so ids stay theirs

    def refresh(self) -> None:
        # Cheap when nothing of the grader's was imported (or imported again) since: it
        # runs on every pause. (A set difference of (name, module) pairs runs in C.)
        try:
            fresh = sys.modules.items() - self.seen
        except TypeError:  # something unhashable put in sys.modules: look at everything
            fresh = set(sys.modules.items())
        else:
            self.seen |= fresh
        if not any(name == PACKAGE or name.startswith(PACKAGE + ".") for name, _ in fresh):
            return
        modules = [m for name, m in list(sys.modules.items())
                   if (name == PACKAGE or name.startswith(PACKAGE + ".")) and m is not None]
        self.modules = len(modules)
        for module in modules:
            file = os.path.realpath(getattr(module, "__file__", None) or "")
            self._add(_codes_of(module, file), _is_open(file))
        # What the problems hold but no module names: a reference written as a lambda in
        # the call that registers its problem, say.
        for problem in list(registered().values()):
            for value in vars(problem).values():
                function = inspect.unwrap(getattr(value, "func", value)) \
                    if callable(value) and not isinstance(value, type) else None
                code = getattr(function, "__code__", None)
                if isinstance(code, CodeType):
                    file = os.path.realpath(code.co_filename)
                    if file.startswith(str(FOLDER) + os.sep):
                        self._add(_nested(code, file, set()), _is_open(file))

    def _add(self, codes: Iterator[CodeType], is_open: bool) -> None:
        for code in codes:
            if id(code) not in self.all:
                self._keep.append(code)
                self.all.add(id(code))
                if is_open:
                    self.open.add(id(code))


def _is_open(file: str) -> bool:
    return os.path.relpath(file, FOLDER).replace(os.sep, "/").startswith(OPEN)


def _nested(code: CodeType, file: str, seen: set[int]) -> Iterator[CodeType]:
    """``code`` and the code it nests (lambdas, inner functions), from ``file`` only."""
    if id(code) in seen or os.path.realpath(code.co_filename) != file:
        return
    seen.add(id(code))
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _nested(const, file, seen)


def _codes_of(module: object, file: str) -> Iterator[CodeType]:
    """Every code object defined in ``module`` (whose source is ``file``): its functions,
    its classes' methods, and what they nest (lambdas, inner functions). A decorator's
    wrapper (contextlib's, functools') is not the module's code: what it wraps is."""
    name = getattr(module, "__name__", "")
    seen: set[int] = set()

    def nested(code: CodeType) -> Iterator[CodeType]:
        yield from _nested(code, file, seen)

    def members(namespace: dict, depth: int) -> Iterator[CodeType]:
        for value in list(namespace.values()):
            value = inspect.unwrap(getattr(value, "__func__", value)) \
                if callable(value) and not isinstance(value, type) else value
            if isinstance(value, property):
                for part in (value.fget, value.fset, value.fdel):
                    if part is not None and hasattr(part, "__code__"):
                        yield from nested(part.__code__)
            elif inspect.isfunction(value) and value.__module__ == name:
                yield from nested(value.__code__)
            elif isinstance(value, type) and value.__module__ == name and depth < 3:
                yield from members(dict(vars(value)), depth + 1)

    yield from members(dict(vars(module)), 0)


_grader = _GraderCode()


def refresh() -> None:
    """Gather the code of the grader's modules imported since the last time."""
    _grader.refresh()


def side_of(code: CodeType) -> str:
    """"grader", "library" or "learner", for a frame running ``code``."""
    return GRADER if id(code) in _grader.all else _side_of_file(code.co_filename)


@functools.cache
def _side_of_file(filename: str) -> str:
    """"library" or "learner", for code that is not the grader's, from its file."""
    path = os.path.realpath(filename) if filename.startswith(os.sep) else filename
    if path.startswith(LIBRARY) or filename.startswith("<frozen"):
        return LIBRARY_SIDE
    return LEARNER


def cause(calls: object) -> str:
    """Why a candidate that called the grader fails, in words ("" if it called none).
    ``calls``: the names, as a check noted them, or as a record carried them (read
    whatever came: a record may be anything)."""
    if not calls:
        return ""
    notes = [str(c) for c in calls] if isinstance(calls, list) else [str(calls)]
    called = [n for n in notes if not n.startswith(UNWATCHED)]
    unwatched = [n.removeprefix(UNWATCHED) for n in notes if n.startswith(UNWATCHED)]
    parts = [f"calls the grader's own {', '.join(called[:4])}"] if called else []
    if unwatched:
        parts.append(f"ran out of the grader's watch ({'; '.join(unwatched[:3])})")
    if not called:  # only a way out of the watch: nothing says it borrowed an answer
        return (f"{parts[0]}: what runs there is out of the grader's sight, so the work "
                "cannot be graded as this code's: stop it (or run it after the check), and "
                "check again")
    return (f"{' and '.join(parts)}: this exercise is answered by your own code, not by the "
            "grader's")


def as_learner(candidate: Callable) -> Callable:
    """``candidate``, entered through a frame of the learner's own: a candidate that *is*
    one of the grader's functions (or a partial of one) is then a call from the learner
    into the grader, like any other."""
    namespace: dict = {}
    exec(compile("def candidate(*args, **kwargs):\n    return f(*args, **kwargs)\n",
                 "<candidate>", "exec"), {"f": candidate}, namespace)
    return namespace["candidate"]


def allowed_code(handed: object, depth: int = 3) -> set[int]:
    """The ids of the grader's code a candidate may call, of what it was handed:
    functions, and the methods of objects, in containers ``depth`` deep (the arguments,
    and two more)."""
    allowed: set[int] = set()
    function = getattr(handed, "__func__", handed)
    if inspect.isfunction(function):
        allowed.add(id(function.__code__))
    elif isinstance(handed, (tuple, list, dict)) and depth > 0:
        items = handed.values() if isinstance(handed, dict) else handed
        for item in items:
            allowed |= allowed_code(item, depth - 1)
    elif not isinstance(handed, type) and _is_graders(type(handed)):
        for klass in type(handed).__mro__:
            for member in vars(klass).values():
                member = getattr(member, "__func__", member)
                if inspect.isfunction(member):
                    allowed.add(id(member.__code__))
    return allowed


def inherited(candidate: object) -> list[str]:
    """The grader's classes a candidate class subclasses: their methods, called from the
    grader's side, would not be seen as the learner's calls."""
    if not isinstance(candidate, type):
        return []
    return sorted(f"{base.__module__}.{base.__qualname__}" for base in candidate.__mro__[1:]
                  if _is_graders(base))


def _is_graders(klass: type) -> bool:
    module = getattr(klass, "__module__", "") or ""
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _qualified(frame: FrameType) -> str:
    """module.Class.function for the frame (Python 3.10 has no ``co_qualname``)."""
    code = frame.f_code
    name = getattr(code, "co_qualname", None)
    if name is None:
        owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
        owner = owner if isinstance(owner, type) else type(owner) if owner is not None else None
        name = f"{owner.__qualname__}.{code.co_name}" if owner is not None else code.co_name
    return f"{frame.f_globals.get('__name__', '?')}.{name}"


class Watch:
    """The calls noted while watching, by name, in the order first seen."""

    def __init__(self, allowed: set[int]):
        self.allowed = allowed
        self.calls: list[str] = []
        self._stacks = threading.local()

    def note(self, text: str) -> None:
        if text not in self.calls:
            self.calls.append(text)

    def _stack(self, first: str) -> list[str]:
        stack = getattr(self._stacks, "value", None)
        if stack is None:
            stack = self._stacks.value = [first]
        return stack

    def profile(self, first: str) -> Callable:
        def on_event(frame: FrameType, event: str, arg: object) -> None:
            stack = self._stack(first)
            if event == "return":
                if len(stack) > 1:
                    stack.pop()
                return
            if event == "c_call":
                if arg is sys.setprofile and stack[-1] == LEARNER:
                    self.note(UNWATCHED + "sys.setprofile")
                return
            if event != "call":
                return
            code = frame.f_code
            side = side_of(code)
            if side == LIBRARY_SIDE:
                if stack[-1] == LEARNER and code is _SETPROFILE:
                    self.note(UNWATCHED + "threading.setprofile")
                side = stack[-1]
            elif side == LEARNER and stack[-1] == GRADER:
                # The grader calls the learner: what it hands over may be called back.
                self.allowed |= allowed_code(tuple(frame.f_locals.values()))
            elif side == GRADER and stack[-1] == LEARNER and id(code) not in self.allowed \
                    and id(code) not in _grader.open and code.co_name not in HOOKS:
                self.note(_qualified(frame))
            stack.append(side)

        on_event.watch = self  # type: ignore[attr-defined]
        return on_event


_SETPROFILE = threading.setprofile.__code__


def threads_of_its_own(pools: bool = True) -> list[str]:
    """Threads running now that could work for the candidate unwatched: the learner's
    own, and (with ``pools``) thread pools' workers, which run whatever is submitted to
    them."""
    found = []
    for thread in threading.enumerate():
        if thread is threading.current_thread() or not thread.is_alive():
            continue
        target = getattr(thread, "_target", None)
        if target is None and type(thread).run is not threading.Thread.run:
            target = type(thread).run
        code = getattr(getattr(target, "__func__", target), "__code__", None)
        if code is None:
            continue
        pool = pools and code.co_name == "_worker" and "concurrent" in code.co_filename
        if pool or side_of(code) == LEARNER:
            found.append(f"{UNWATCHED}thread {thread.name!r}, started before the check")
    return found


@contextlib.contextmanager
def inside_a_launch() -> Iterator[None]:
    """A lighter watch while a kernel launch runs in this thread under ``watching``. The
    interpreter's own Python makes thousands of calls a program, all of them a library's:
    there only a call of the grader's closed code matters (a kernel body, run as Python,
    can make one), and no stack of sides is needed to tell. (It made a watched k-means
    five times slower.) Frames entered meanwhile also return meanwhile, so the full
    watch's stack is as it was when it resumes."""
    current = sys.getprofile()
    watch = getattr(current, "watch", None)
    if not isinstance(watch, Watch):
        yield
        return

    def on_event(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            code = frame.f_code
            if id(code) in _grader.all and id(code) not in _grader.open and \
                    id(code) not in watch.allowed and code.co_name not in HOOKS:
                watch.note(_qualified(frame))
        elif event == "c_call" and arg is sys.setprofile and id(frame.f_code) not in _grader.all:
            watch.note(UNWATCHED + "sys.setprofile")

    sys.setprofile(on_event)
    try:
        yield
    finally:
        if sys.getprofile() is not on_event:
            watch.note(UNWATCHED + "sys.setprofile")
        sys.setprofile(current)


@contextlib.contextmanager
def watching(allowed: set[int]) -> Iterator[Watch]:
    """Watch every Python call in this thread (from the grader's side) and in the threads
    started meanwhile (from the learner's)."""
    refresh()
    watch = Watch(allowed)
    for text in threads_of_its_own():
        watch.note(text)
    previous, previous_threads = sys.getprofile(), threading.getprofile()
    mine = watch.profile(GRADER)
    threading.setprofile(watch.profile(LEARNER))
    sys.setprofile(mine)
    try:
        yield watch
    finally:
        if sys.getprofile() is not mine:
            watch.note(UNWATCHED + "sys.setprofile")
        sys.setprofile(previous)
        threading.setprofile(previous_threads)
