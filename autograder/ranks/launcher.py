"""The process that starts the ranks: ``python -m rooflab.autograder.ranks.launcher JOB``,
or a child of the grader's fork server (``forkserver.py``) that runs ``main`` from here.

The grader (a notebook's kernel, a test, ``rooflab check``) has this one process started
in a process group of its own and never joins a process group itself. The launcher
imports torch and loads the learner's function once, then for each case forks one process
per rank: a fork starts in milliseconds, where N fresh Pythons importing torch take
seconds each (8 ranks on 2 cores: over 10 s). It forks before it has run any torch work,
so there are no thread pools to inherit.

It also keeps time, as the ranks' parent: each case may take ``limit`` seconds once every
rank has joined the process group. A rank that raises gives the others ``grace`` seconds
to finish (they may well be waiting for it; the one that raised waits too, its
connections open, so that theirs do not fail for want of it). Whatever is still running
then is killed, and every rank is reaped, so no process outlives its case. After a time
limit it stops: the next cases would most likely hang too; and after a case in which every
rank raised the stub's NotImplementedError, which the grader reports as not implemented
without looking further. It writes what it saw to
``JOB/case{k}/ranks.json`` and ``JOB/launcher.json``.

Should the grader itself die, the launcher and the ranks die with it (Linux's parent-death
signal); the grader also kills the launcher's whole process group when it is done.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

PR_SET_PDEATHSIG = 1
POLL_S = 0.005
_running: list[int] = []  # the ranks of the case under way


def _end_on_term(signum, frame) -> None:
    """The grader's SIGTERM (a KeyboardInterrupt in Jupyter, its outer limit): kill and
    reap this case's ranks, then go. Killed from outside instead, they would be orphans,
    and not every init reaps those (a container's often does not): zombies."""
    for pid in _running:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in _running:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    os._exit(1)


def stop_with_parent(parent: int | None = None) -> None:
    """Be killed when the parent dies (Linux; elsewhere the grader's group kill does it)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if parent is not None and os.getppid() != parent:  # it died before prctl
        os._exit(1)


def _write(path: Path, data: dict) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def main(job_folder: str, parent: int | None = None) -> int:
    """The launcher's whole run. ``parent``: the process it must not outlive, where that is
    not the grader (the fork server's child: the server)."""
    job_dir = Path(job_folder)
    job = json.loads((job_dir / "job.json").read_text())
    stop_with_parent(job["parent"] if parent is None else parent)
    # A forked launcher has the server's environment and folder: the job's are the
    # grader's of this moment (a fresh launcher has them already).
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["environment"])
    # The learner's modules, and the folder the grader runs in, for imports by name.
    sys.path[:0] = [entry for entry in job["sys_path"] if entry not in sys.path]
    if sys.platform.startswith("linux"):
        # Every rank is on this machine: gloo on the loopback device needs no hostname
        # that resolves (containers and CI machines often have none).
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

    from . import rank, record, transport

    signal.signal(signal.SIGTERM, _end_on_term)
    record.install()  # before the function is loaded: its globals must see the wrappers
    record.watch_files((job_dir / "job.json").stat().st_mtime_ns)
    for module in job.get("preload", ()):
        importlib.import_module(module)
    try:
        candidate = transport.unpack((job_dir / "function.pkl").read_bytes())
    except BaseException as error:  # noqa: BLE001 (the learner's module: anything goes)
        _write(job_dir / "launcher.json", {"error": f"{type(error).__name__}: {error}",
                                           "traceback": traceback.format_exc()})
        return 0
    for index, case in enumerate(job["cases"]):
        folder = job_dir / f"case{index}"
        outcome = _run_case(folder, case["world"], candidate, job, rank.run)
        _write(folder / "ranks.json", outcome)
        if outcome["ended"] == "time limit":
            break
        if _all_stubs(folder, case["world"]):
            # An unsolved exercise: the grader reports it as not implemented after this
            # case, and each case left would cost a fork of every rank and a group join.
            break
    _write(job_dir / "launcher.json", {"done": True})
    return 0


def _all_stubs(folder: Path, world: int) -> bool:
    """Every rank of the case raised the stub's NotImplementedError (``rank.py``)."""
    from .rank import STUB

    try:
        return all((folder / f"failed{r}").read_text() == STUB for r in range(world))
    except OSError:  # a rank that did not raise
        return False


def _run_case(folder: Path, world: int, candidate, job: dict, run_rank) -> dict:
    sys.stdout.flush()
    sys.stderr.flush()
    pids = _running
    pids.clear()
    me = os.getpid()
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher's handler, not its
            run_rank(folder, rank, world, candidate,
                     lambda: stop_with_parent(me))  # never returns
        pids.append(pid)
    started = time.monotonic()
    joined = failed_at = None
    ended = "returned"
    statuses: dict[int, int] = {}
    exited: dict[int, float] = {}  # when each rank was found gone: the clock the ranks use
    while len(statuses) < world:
        for rank, pid in enumerate(pids):
            if rank not in statuses:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    statuses[rank] = os.waitstatus_to_exitcode(status)
                    exited[rank] = time.monotonic()
                    # A rank gone without its answer (os._exit(0) is status 0) failed:
                    # the others may be waiting for it.
                    if failed_at is None and not _answered(folder, rank, statuses[rank]):
                        failed_at = exited[rank]
        if len(statuses) == world:
            break
        now = time.monotonic()
        if joined is None and all((folder / f"ready{r}").exists() for r in range(world)):
            joined = now
        if failed_at is None and any((folder / f"failed{r}").exists() for r in range(world)):
            failed_at = now
        if joined is None and now - started > job["join_limit"]:
            ended = "join limit"
        elif joined is not None and job["limit"] > 0 and now - joined > job["limit"]:
            ended = "time limit"
        elif failed_at is not None and now - failed_at > job["grace"]:
            ended = "a rank failed"
        else:
            time.sleep(POLL_S)
            continue
        break
    killed = [rank for rank in range(world) if rank not in statuses]
    for rank in killed:
        try:
            os.kill(pids[rank], signal.SIGKILL)
        except ProcessLookupError:
            pass
    for rank in killed:  # reap them: no zombie is left for anyone
        statuses[rank] = os.waitstatus_to_exitcode(os.waitpid(pids[rank], 0)[1])
    if ended == "returned" and not all(_answered(folder, rank, statuses[rank])
                                       for rank in range(world)):
        ended = "a rank failed"
    return {"ended": ended, "pids": list(pids), "killed": killed,
            "status": [statuses[rank] for rank in range(world)],
            "exited": [exited.get(rank) for rank in range(world)],
            "seconds": time.monotonic() - (joined or started)}


def _answered(folder: Path, rank: int, status: int) -> bool:
    """The rank ended as a rank does once its candidate returned: status 0, its answer
    saved (``rank.py`` saves it before it waits for the others)."""
    return status == 0 and (folder / f"rank{rank}.pt").exists()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
