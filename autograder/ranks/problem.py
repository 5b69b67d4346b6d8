"""A problem whose candidate runs on every rank of a process group (``kernel="ranks"``).

It is a ``Problem`` with three differences, so that the registry, ``rooflab list``,
hints and the tests that walk every problem treat it like any other:

* each case names its world size, ``case.sizes["ranks"]``;
* ``make_inputs(case, generator, device)`` returns one tuple of arguments per rank
  (and ``harness``, if any, runs the candidate with them);
* ``grade(case, inputs, outputs, logs)`` judges a case once every rank has returned:
  the answers (one per rank) and each rank's record of its torch.distributed calls,
  returning the case's ``CaseResult``. Hangs, crashes and exceptions never reach it:
  ``checking/rank_check.py`` reports those itself, rank by rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..evidence.compare import CaseResult
from ..problem import Case, Problem
from .record import RankLog

KIND = "ranks"


@dataclass
class RanksProblem(Problem):
    kernel: str | None = KIND
    timed: bool = False  # gloo on a CPU says nothing about NVLink: counts are graded
    grade: Callable[[Case, list[tuple], list[object], list[RankLog]], CaseResult] | None = None
    # The grader's code that drives the candidate on each rank, ``harness(candidate,
    # *inputs)``: a training loop around a learner's sharding, say. None: the rank calls
    # ``candidate(*inputs)`` itself. It must be importable by name (a module function).
    harness: Callable | None = None
    # Modules the launcher imports once before forking the ranks: those the harness or
    # the candidate would import lazily on every rank (torch.optim's first optimizer
    # imports torch._dynamo, 800 modules and two seconds, per rank).
    preload: tuple[str, ...] = ()
    # Seconds each case may take once its ranks have joined, unless check(time_limit=...)
    # or $ROOFLAB_TIME_LIMIT says otherwise: a deadlock should not keep a learner waiting
    # two minutes, and a right answer on these sizes takes milliseconds.
    time_limit_s: float = 15.0


def world_size(case: Case) -> int:
    return case.sizes["ranks"]
