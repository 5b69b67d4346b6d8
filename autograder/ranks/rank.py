"""One rank of one case: join the process group, call the candidate, hand back its answer.

Runs in a process forked by the launcher (``launcher.py``), and ends with ``os._exit``,
never returning into the launcher's loop. Everything the grader learns from it is in the
case's folder:

* ``rank{r}.log``: its calls and its end (``record.py``);
* ``rank{r}.pt``: its answer (a tensor, or the words ``returned <type>``);
* ``rank{r}.out`` and ``rank{r}.err``: what it printed;
* ``ready{r}``: it joined the process group; the case's time limit starts when all have;
* ``failed{r}``: the candidate raised (the rank then waits to be ended); it holds
  ``stub`` where that was a bare ``NotImplementedError``, the unsolved exercise.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from . import record

# Gloo's own time limit on a send, receive or collective: far beyond the grader's (the
# launcher ends a case first), so a deadlock shows as the grader's report, not as gloo's
# "Timed out waiting 30000ms" raised on some rank.
GLOO_TIMEOUT = datetime.timedelta(hours=1)
SUCCESS, CANDIDATE_RAISED, GRADER_FAILED = 0, 1, 2
STUB = "stub"


def run(folder: Path, rank: int, world: int, candidate: Callable, stop_with_parent) -> None:
    """The whole life of a rank process. Never returns."""
    code = GRADER_FAILED
    try:
        stop_with_parent()
        _capture_output(folder / f"rank{rank}.out", folder / f"rank{rank}.err")
        code = _run(folder, rank, world, candidate)
    except BaseException:  # noqa: BLE001 (the grader's failure, for the grader to show)
        record.grader_failed(traceback.format_exc())
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 (a closed stream: nothing to keep)
                pass
        os._exit(code)


def _capture_output(out: Path, err: Path) -> None:
    """A learner's print goes to a file the grader can show; torch's and gloo's warnings
    to another, kept for when the grader itself fails."""
    for target, path in ((1, out), (2, err)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    # Line by line: a rank killed at the time limit keeps what it printed until then.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


def _run(folder: Path, rank: int, world: int, candidate: Callable) -> int:
    torch.set_num_threads(1)  # N ranks share the machine's cores
    record.start(folder / f"rank{rank}.log", rank)
    inputs = torch.load(folder / "inputs.pt", weights_only=True)[rank]
    # A file store, not a TCP port: nothing to collide with another check or test.
    store = dist.FileStore(str(folder / "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=GLOO_TIMEOUT)
    record.emit({"e": "ready"})
    (folder / f"ready{rank}").touch()
    record.watch()  # groups and stores made from here on are the candidate's
    try:
        output = candidate(*inputs)
    except BaseException as error:  # noqa: BLE001 (SystemExit too: the learner's bug)
        record.watch(False)
        record.candidate_raised(error)
        # "stub" for the learner's `raise NotImplementedError()`: the launcher runs no
        # later case once every rank of one has said so (nothing is written yet).
        (folder / f"failed{rank}").write_text(STUB if is_stub(error) else "")
        # Stay, connections open, until the launcher ends the case: the other ranks then
        # show what they were waiting for from this one, instead of all failing with
        # "Connection closed by peer", which would hide the first error among theirs.
        while True:
            time.sleep(60)
    record.watch(False)
    _save(folder / f"rank{rank}.pt", output)
    record.candidate_returned()
    # Stay until every rank has returned: a rank that leaves closes its connections, and
    # a peer still receiving from it would fail for a reason that is not its own.
    store.set(f"returned/{rank}", "1")
    store.wait([f"returned/{peer}" for peer in range(world)], GLOO_TIMEOUT)
    return SUCCESS


def is_stub(error: BaseException) -> bool:
    """A bare NotImplementedError, as the exercise's stub raises: the grader's
    ``report.is_stub`` also checks the line, this is what a rank can tell alone."""
    return type(error) is NotImplementedError and not error.args


def _save(path: Path, output: object) -> None:
    """The answer, written whole or not at all."""
    if isinstance(output, torch.Tensor):
        answer: object = output.detach().clone().contiguous() if output.layout == torch.strided \
            else f"returned a {output.layout} tensor"
    else:
        answer = f"returned {type(output).__name__}"
    partial = path.with_suffix(".partial")
    torch.save(answer, partial)
    partial.replace(path)
