"""Which of the grader's own functions a plain-Python candidate called.

A plain-Python exercise (a cost formula, a timer, a sharding plan) launches no kernel
whose work can be watched: a candidate that hands back the grader's reference, calls it,
or times with the grader's own timer computes right answers. So while such a candidate
runs, every Python call is watched (``sys.setprofile``, and ``threading``'s for the threads
it starts), and each call from the learner's code into the grader's is noted by name: the
grader fails the exercise on it.

Whose a frame is, its file tells: the grader's package; a library (the standard library,
site-packages), which acts for whoever called it, so that the learner calling the grader
through ``threading`` or ``functools`` is still the learner calling it; else the
learner's (a notebook cell, the candidate's file). What the grader hands the candidate (a
stand-in GPU's methods, a loss function) the candidate may call; and the grader's own
instruments run inside the candidate's calls unasked (the recorder's dispatch mode, the
tracer's hooks, the time limit's signal handler): those are not the learner's calls.
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

GRADER = str(Path(__file__).resolve().parents[1]) + os.sep
LIBRARY = tuple(sorted({str(Path(p).resolve()) + os.sep for p in (
    sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"],
    sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}))
LEARNER, GRADER_SIDE = "learner", "grader"
# The grader's code that runs inside a candidate's call without being called by it.
INSTRUMENTS = tuple(GRADER + part for part in (f"evidence{os.sep}", f"model{os.sep}",
                                               f"checking{os.sep}time_limit.py"))
HOOKS = {"__torch_dispatch__", "__torch_function__"}


@functools.cache
def whose(filename: str) -> str:
    """"grader", "library" or "learner", for code from ``filename``."""
    path = os.path.realpath(filename) if filename.startswith(os.sep) else filename
    if path.startswith(GRADER):
        return GRADER_SIDE
    if path.startswith(LIBRARY) or filename.startswith("<frozen"):
        return "library"
    return LEARNER


def cause(calls: object) -> str:
    """Why a candidate that called the grader fails, in words ("" if it called none).
    ``calls``: the names, as a check noted them, or as a record carried them (read
    whatever came: a record may be anything)."""
    if not calls:
        return ""
    calls = [str(c) for c in calls] if isinstance(calls, list) else [str(calls)]
    return (f"calls the grader's own {', '.join(calls[:4])}: this exercise is answered by "
            "your own code, not by the grader's")


def as_learner(candidate: Callable) -> Callable:
    """``candidate``, entered through a frame of the learner's own: a candidate that *is*
    one of the grader's functions (or a partial of one) is then a call from the learner
    into the grader, like any other."""
    namespace: dict = {}
    exec(compile("def candidate(*args, **kwargs):\n    return f(*args, **kwargs)\n",
                 "<candidate>", "exec"), {"f": candidate}, namespace)
    return namespace["candidate"]


def allowed_code(handed: object, depth: int = 3) -> set[CodeType]:
    """The grader's code a candidate may call, of what it was handed: functions, and the
    methods of objects, in containers ``depth`` deep (the arguments, and two more)."""
    allowed: set[CodeType] = set()
    function = getattr(handed, "__func__", handed)
    if inspect.isfunction(function):
        allowed.add(function.__code__)
    elif isinstance(handed, (tuple, list, dict)) and depth > 0:
        items = handed.values() if isinstance(handed, dict) else handed
        for item in items:
            allowed |= allowed_code(item, depth - 1)
    elif not isinstance(handed, type) and whose(_file_of(type(handed))) == GRADER_SIDE:
        for klass in type(handed).__mro__:
            for member in vars(klass).values():
                member = getattr(member, "__func__", member)
                if inspect.isfunction(member):
                    allowed.add(member.__code__)
    return allowed


def inherited(candidate: object) -> list[str]:
    """The grader's methods a candidate class takes over by subclassing one of its
    classes (called from the grader's side, they would not be seen as the learner's)."""
    if not isinstance(candidate, type):
        return []
    return sorted(f"{base.__module__}.{base.__qualname__}" for base in candidate.__mro__[1:]
                  if whose(_file_of(base)) == GRADER_SIDE)


def _file_of(klass: type) -> str:
    """The file a class is defined in ("<builtin>" where it has none)."""
    try:
        return inspect.getfile(klass)
    except (TypeError, OSError):  # a built-in or C extension class
        return "<builtin>"


class Watch:
    """The calls noted while watching, by name, in the order first seen."""

    def __init__(self, allowed: set[CodeType]):
        self.allowed = allowed
        self.calls: list[str] = []
        self._stacks = threading.local()

    def _stack(self, first: str) -> list[str]:
        stack = getattr(self._stacks, "value", None)
        if stack is None:
            stack = self._stacks.value = [first]
        return stack

    def _called(self, code: CodeType) -> bool:
        """Whether grader code entered from the learner's side was the learner's call."""
        return not (code in self.allowed or code.co_name in HOOKS
                    or os.path.realpath(code.co_filename).startswith(INSTRUMENTS))

    def profile(self, first: str) -> Callable:
        def on_event(frame: FrameType, event: str, arg: object) -> None:
            stack = self._stack(first)
            if event == "return":
                if len(stack) > 1:
                    stack.pop()
                return
            if event != "call":
                return
            code = frame.f_code
            side = whose(code.co_filename)
            if side == "library":
                side = stack[-1]
            elif side == LEARNER and stack[-1] == GRADER_SIDE:
                # The grader calls the learner: what it hands over may be called back.
                self.allowed |= allowed_code(tuple(frame.f_locals.values()))
            elif side == GRADER_SIDE and stack[-1] == LEARNER and self._called(code):
                name = f"{frame.f_globals.get('__name__', '?')}." \
                       f"{getattr(code, 'co_qualname', code.co_name)}"
                if name not in self.calls:
                    self.calls.append(name)
            stack.append(side)

        return on_event


@contextlib.contextmanager
def watching(allowed: set[CodeType]) -> Iterator[Watch]:
    """Watch every Python call in this thread (from the grader's side) and in the threads
    started meanwhile (from the learner's)."""
    watch = Watch(allowed)
    previous, previous_threads = sys.getprofile(), threading.getprofile()
    threading.setprofile(watch.profile(LEARNER))
    sys.setprofile(watch.profile(GRADER_SIDE))
    try:
        yield watch
    finally:
        sys.setprofile(previous)
        threading.setprofile(previous_threads)
