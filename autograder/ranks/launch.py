"""Run a function on N ranks for each case, from the grader's side, and read back the runs.

``run`` writes a job folder (the pickled function, each case's inputs per rank), has the
launcher (``launcher.py``) started in a process group of its own, forked by this
process's warm fork server (``forkserver.py``) or, where there is none, as a fresh Python,
and waits. The launcher forks the
ranks of each case, keeps each case's time limit and reaps its ranks; this side only
keeps an outer limit, for a launcher that never gets going (a learner's module that loops
when imported). However the wait ends (done, the outer limit, a KeyboardInterrupt from
Jupyter's stop button), the launcher is told to end its ranks, then its whole process
group is killed, before ``run`` returns or raises, and the job folder is removed: no
process and no file is left.

This process never joins a process group and never runs the learner's function, so
nothing the ranks do can hang it or take it down: the Jupyter kernel lives on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import forkserver, record, transport

# Importing torch and loading the function in the launcher: several seconds on a busy
# 2-core machine. Only a launcher that never starts meets this limit.
START_S = 120.0
SLACK_S = 30.0  # beyond the sum of every limit, before this side stops waiting
JOIN_S = 60.0  # for the ranks of a case to form their process group
GRACE_S = 0.5  # after one rank fails, for the others to finish or fail too
TERM_S = 2.0  # for a launcher told to stop to end its ranks
POLL_S = 0.01


@dataclass
class RankRun:
    """One rank of one case, as the grader found it afterwards."""

    rank: int
    status: int | None  # exit code; -N when killed by signal N; None if never reaped
    killed: bool  # by the launcher, at the time limit or after another rank failed
    log: record.RankLog
    output: object = None  # the tensor it returned, or "returned <type>", or None
    printed: str = ""  # its stdout, the last lines
    errors: str = ""  # its stderr, the last lines
    exited: float | None = None  # time.monotonic() when the launcher found it gone

    @property
    def left(self) -> bool:
        """It ended on its own before its candidate returned: ``os._exit``, a crash in
        native code, a signal; not raised (the rank then waits) nor killed."""
        return (self.status is not None and not self.killed and not self.log.returned
                and self.log.raised is None and not self.log.failed)


@dataclass
class CaseRun:
    """One case on all its ranks. ``ended``: "returned" (every rank returned), "time
    limit", "a rank failed", "join limit", or "not run"."""

    world: int
    ended: str
    limit: float
    seconds: float = 0.0
    ranks: list[RankRun] = field(default_factory=list)


@dataclass
class Launch:
    cases: list[CaseRun]
    error: str = ""  # the function could not be sent or loaded, or the launcher failed
    pids: list[int] = field(default_factory=list)  # the launcher's and every rank's


def run(function: Callable, cases: Sequence[tuple[int, list[tuple]]], limit: float,
        join_limit: float | None = None, grace: float | None = None,
        harness: Callable | None = None, preload: Sequence[str] = ()) -> Launch:
    """Call ``function(*inputs[rank])`` on every rank of each (world size, inputs) case,
    each case in fresh processes joined in a gloo process group; with ``harness``,
    ``harness(function, *inputs[rank])``. ``limit``: seconds per case once its ranks have
    joined (0: none). ``preload``: modules the launcher imports once, before it forks
    the ranks, that each rank would otherwise import for itself (seconds each, on N ranks
    at once)."""
    try:
        payload = transport.pack(function, harness)
    except transport.CannotSend as error:
        return Launch([], error=str(error))
    job = Path(tempfile.mkdtemp(prefix="rooflab-ranks-"))
    try:
        return _run(job, payload, cases, limit, JOIN_S if join_limit is None else join_limit,
                    GRACE_S if grace is None else grace, preload)
    finally:
        shutil.rmtree(job, ignore_errors=True)


def _run(job: Path, payload: bytes, cases, limit: float, join_limit: float,
         grace: float, preload: Sequence[str] = ()) -> Launch:
    (job / "function.pkl").write_bytes(payload)
    for index, (_, inputs) in enumerate(cases):
        (job / f"case{index}").mkdir()
        torch.save(list(inputs), job / f"case{index}" / "inputs.pt")
    # The ranks are gloo processes on CPU tensors in both worlds. Hidden GPUs keep the
    # launcher from initialising CUDA (importing rooflab asks torch for the device) and
    # then forking, which CUDA does not survive, and keep its memory off the card.
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    (job / "job.json").write_text(json.dumps({
        "cases": [{"world": world} for world, _ in cases], "limit": limit,
        "join_limit": join_limit, "grace": grace, "parent": os.getpid(),
        "preload": list(preload), "cwd": os.getcwd(), "environment": environment,
        "sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path]}))
    outer = START_S + SLACK_S + len(cases) * (join_limit + limit + grace) \
        if limit > 0 else None
    launcher = forkserver.launcher(job, environment) or _Fresh(job, environment)
    late = False
    try:
        late = not _wait(launcher, outer)
    finally:
        _end(launcher)
    return _read(job, cases, limit, launcher.pid, late)


class _Fresh:
    """A launcher started as a fresh Python, where no fork server can be had."""

    def __init__(self, job: Path, environment: dict[str, str]):
        with open(job / "launcher.out", "wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rooflab.autograder.ranks.launcher", str(job)],
                stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=environment,
                start_new_session=True)
        self.pid = self.process.pid

    def exited(self) -> bool:
        """Without reaping it: its pid, which names its process group, stays taken until
        ``_end`` has killed the group."""
        if not hasattr(os, "waitid"):  # macOS: reap it; the group is still killed after
            return self.process.poll() is not None
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) \
                is not None
        except ChildProcessError:  # already reaped
            return True

    def release(self) -> None:
        self.process.wait()


def _wait(launcher: _Fresh | forkserver.Forked, seconds: float | None) -> bool:
    """Wait for the launcher to exit. False at the time limit."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while deadline is None or time.monotonic() < deadline:
        if launcher.exited():
            return True
        time.sleep(POLL_S)
    return False


def _end(launcher: _Fresh | forkserver.Forked) -> None:
    """Stop the launcher if it still runs: SIGTERM first, on which it kills and reaps its
    ranks (orphans would stay zombies where init does not reap them). Then kill its whole
    process group (any rank still there, anything a rank started), and reap it."""
    try:
        if not launcher.exited():
            os.kill(launcher.pid, signal.SIGTERM)
            deadline = time.monotonic() + TERM_S
            while not launcher.exited() and time.monotonic() < deadline:
                time.sleep(POLL_S)
    finally:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        launcher.release()


def _read(job: Path, cases, limit: float, launcher_pid: int, late: bool) -> Launch:
    launch = Launch([], pids=[launcher_pid])
    state = _json(job / "launcher.json")
    if state is not None and "error" in state:
        launch.error = f"the rank processes could not load the function: {state['error']}"
        return launch
    for index, (world, _) in enumerate(cases):
        folder = job / f"case{index}"
        seen = _json(folder / "ranks.json")
        if seen is not None:
            launch.pids += seen["pids"]
            launch.cases.append(CaseRun(world, seen["ended"], limit, seen["seconds"],
                                        _ranks(folder, world, seen)))
        elif late and any(folder.glob("rank*.log")):  # running when the outer limit hit
            launch.cases.append(CaseRun(world, "time limit", limit,
                                        ranks=_ranks(folder, world, None)))
        else:
            launch.cases.append(CaseRun(world, "not run", limit))
    if state is None:  # the launcher did not finish: say why the cases left did not run
        tail = _tail(job / "launcher.out")
        launch.error = ("the rank processes were stopped: they took longer than all the "
                        "time limits together (does a module the function imports never "
                        "finish importing?)" if late else "the rank processes ended early") \
            + (f" ({tail})" if tail else "")
    return launch


def _ranks(folder: Path, world: int, seen: dict | None) -> list[RankRun]:
    runs = []
    for rank in range(world):
        status = seen["status"][rank] if seen else None
        killed = bool(seen and rank in seen["killed"])
        output = None
        if (folder / f"rank{rank}.pt").exists():
            try:
                output = torch.load(folder / f"rank{rank}.pt", weights_only=True)
            except Exception as error:  # noqa: BLE001 (whatever it wrote, say so)
                output = f"returned something the grader cannot read ({error})"
        exited = seen.get("exited", [None] * world)[rank] if seen else None
        runs.append(RankRun(rank, status, killed, record.read(folder / f"rank{rank}.log", rank),
                            output, _tail(folder / f"rank{rank}.out", lines=20),
                            _tail(folder / f"rank{rank}.err", lines=20), exited))
    return runs


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])
