"""What went wrong on which rank, in words: a hang, an exception, a rank that died.

A rank's log says where it stood when its case ended (``record.py``); this module turns
that into one line per rank, "rank 0 blocked in send to rank 1 at step 0 (at cell In[4],
line 9: `dist.send(chunk, right)`)", and into a diagnosis of the whole: every rank in a
blocking send is the classic deadlock. File names and source lines are the grader's to
fill in: the ranks ran code that cloudpickle renamed, and the source of a notebook cell
is only in the Jupyter kernel's memory.
"""

from __future__ import annotations

import linecache
import signal
from pathlib import Path

from ..course.build import is_stub_raise
from .launch import CaseRun, RankRun
from .record import NOT_LEARNER
from .transport import real_file

Files = dict[str, list[tuple[int, int, str]]]


def place(files: Files, frame: tuple | list | None) -> str:
    """"cell In[4], line 9: `dist.send(chunk, right)`" for a (file, line, function)."""
    if not frame:
        return ""
    filename = real_file(files, frame[0], frame[1], frame[2])
    text = linecache.getline(filename, frame[1]).strip()
    where = _cell(filename) or f"{Path(filename).name}:{frame[1]}"
    if _cell(filename):
        where += f", line {frame[1]}"
    return f"{where}: `{text}`" if text else where


def _cell(filename: str) -> str:
    """"cell In[4]" for a Jupyter cell's file name, as IPython names cells; else ""."""
    try:
        from IPython import get_ipython
    except ImportError:
        return ""
    shell = get_ipython()
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(filename)
    return f"cell In[{number}]" if number is not None else ""


def _at(files: Files, frame) -> str:
    where = place(files, frame)
    return f" (at {where})" if where else ""


def _status(status: int | None) -> str:
    if status is None:
        return "its end is unknown"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def state(run: RankRun, files: Files) -> tuple[str, str]:
    """(short, long): where a rank stood when its case ended; the long form adds the
    learner's line."""
    log, rank = run.log, f"rank {run.rank}"
    if log.raised is not None:
        text = f"{rank} raised {_exception(log.raised)}"
        frames = _learner_frames(log.raised["frames"])
        return text, text + (_at(files, frames[-1]) if frames else "")
    if log.failed:
        last = log.failed.strip().splitlines()[-1]
        return (f"{rank}: the grader failed in it ({last})",) * 2
    if _died(run):
        inside = f", in {log.blocked_in.describe()}" if log.blocked_in is not None else ""
        why = "os._exit?" if run.status == 0 else "os._exit, or a crash in native code?"
        text = f"{rank} ended ({_status(run.status)}) before returning{inside}: {why}"
        return text, text
    if log.blocked_in is not None:
        text = f"{rank} blocked in {log.blocked_in.describe()}"
        return text, text + _at(files, log.blocked_in.at)
    if log.waiting_for:
        calls = " and ".join(call.describe() for call in log.waiting_for)
        text = f"{rank} blocked waiting for its {calls}"
        return text, text + _at(files, log.waiting_at or log.waiting_for[0].at)
    if log.returned:
        text = f"{rank} returned, and waits for the others"
        return text, text
    if not log.ready:
        text = f"{rank} had not joined the process group"
        return text, text
    if log.last is not None:
        text = f"{rank} was running its own code, in no torch.distributed call (its last: " \
               f"{log.last.describe()})"
        return text, text + _at(files, log.last.at)
    text = f"{rank} was running its own code and had made no torch.distributed call"
    return text, text


def _died(run: RankRun) -> bool:
    """The rank's process ended on its own, without returning or raising: it left (exit
    status 0 included), or died after returning (a crash at exit)."""
    return run.left or (run.status not in (None, 0) and not run.killed
                        and run.log.raised is None and not run.log.failed)


# The launcher polls its ranks every few milliseconds, on a machine that may be busy: a
# rank found gone this long after another raised may still have left first.
FOUND_GONE_S = 0.25


def _left_first(died: RankRun, raised: RankRun) -> bool:
    """Did ``died`` leave before ``raised`` raised? A rank that leaves closes its
    connections, and its peers then raise ("Connection reset by peer"): the one that left
    is the cause. A rank that raises stays, connections open, so nothing of that kind
    follows from it."""
    if died.exited is None:
        return True
    return died.exited - FOUND_GONE_S <= raised.log.raised.get("t", 0.0)


def _exception(raised: dict) -> str:
    if raised["type"] == "SystemExit":
        return f"SystemExit: called sys.exit({raised.get('code')!r})"
    message = raised["message"].strip().splitlines()
    return f"{raised['type']}: {message[0]}" if message else raised["type"]


def _learner_frames(frames: list) -> list:
    """The frames of the learner's code (torch's and the grader's left out)."""
    return [frame for frame in frames if not frame[0].startswith(NOT_LEARNER)]


def traceback_lines(run: RankRun, files: Files) -> list[str]:
    """The rank's traceback, the learner's frames only, innermost last."""
    raised = run.log.raised
    if raised is None:
        return []
    lines = []
    for frame in _learner_frames(raised["frames"]):
        filename = real_file(files, *frame)
        where = _cell(filename) or f'File "{filename}"'
        text = linecache.getline(filename, frame[1]).strip()
        lines.append(f"  {where}, line {frame[1]}, in {frame[2]}" + (f": {text}" if text else ""))
    return lines + [f"  {_exception(raised)}"]


def is_stub(run: RankRun, files: Files) -> bool:
    """The learner's stub, ``raise NotImplementedError()``, and nothing else."""
    raised = run.log.raised
    if raised is None or raised["type"] != "NotImplementedError" or raised["message"]:
        return False
    frames = _learner_frames(raised["frames"])
    if not frames:
        return False
    line = linecache.getline(real_file(files, *frames[-1]), frames[-1][1]).strip()
    return is_stub_raise(line)


def hang(case: CaseRun, files: Files) -> tuple[str, str, list[str]]:
    """(error, advice, one line per rank) for a case stopped at its time limit."""
    states = [state(run, files) for run in case.ranks]
    logs = [run.log for run in case.ranks]
    in_send = [log.blocked_in is not None and log.blocked_in.is_send for log in logs]
    in_recv = [log.blocked_in is not None and not log.blocked_in.is_send for log in logs]
    waiting = [log.blocked_in is not None or bool(log.waiting_for) for log in logs]
    advice = ""
    if all(in_send):
        what = "every rank is blocked in a send, and none receives: a deadlock"
        advice = ("gloo completes a send only once the peer posts the matching receive (it "
                  "keeps no buffer), and NCCL does the same for large messages: when every "
                  "rank sends first, all of them wait forever. Post the send and the receive "
                  "together, dist.isend and dist.irecv, then wait for both (or let every "
                  "other rank receive first)")
    elif all(in_recv):
        what = "every rank is blocked in a receive, and none sends: a deadlock"
    elif all(waiting):
        what = "every rank waits for another: a deadlock"
    elif any(log.returned for log in logs) and any(waiting):
        blocked = ", ".join(str(run.rank) for run, log in zip(case.ranks, logs, strict=True)
                            if log.blocked_in is not None or log.waiting_for)
        what = (f"rank(s) {blocked} wait for messages that the ranks that returned never "
                "sent (or never received)")
    elif any(log.ready and not log.returned and not w for log, w in zip(logs, waiting,
                                                                         strict=True)):
        what = "a rank never came back from its own code: an endless loop?"
    else:
        what = "the ranks did not finish"
    short = "; ".join(text for text, _ in states)
    error = (f"ran past the time limit of {case.limit:g} s (set it with "
             f"check(..., time_limit=seconds)): {what} ({short})")
    return error, advice, [text for _, text in states]


def failure(case: CaseRun, files: Files) -> tuple[str, list[str]]:
    """(error, details) for a case in which a rank raised, died, or could not start."""
    raised = sorted((run for run in case.ranks if run.log.raised is not None),
                    key=lambda run: run.log.raised.get("t", 0.0))  # the first is the cause
    failed = [run for run in case.ranks if run.log.failed]
    died = sorted((run for run in case.ranks if _died(run)),
                  key=lambda run: (run.exited is None, run.exited or 0.0))
    if died and raised and _left_first(died[0], raised[0]):
        raised = []  # they raised for want of the rank that left: it is the cause
    details = []
    if raised:
        first = raised[0]
        same = [run.rank for run in raised if _exception(run.log.raised)
                == _exception(first.log.raised)]
        who = f"rank {first.rank}" if len(same) == 1 else \
            "ranks " + ", ".join(str(rank) for rank in same)
        frames = _learner_frames(first.log.raised["frames"])
        error = f"{who} raised {_exception(first.log.raised)}" + \
            (_at(files, frames[-1]) if frames else "")
        details += [f"rank {first.rank}'s traceback:"] + traceback_lines(first, files)
    elif died:
        error = state(died[0], files)[0]
        alike = sorted(run.rank for run in died if run.status == died[0].status
                       and run.log.blocked_in is None)
        if len(alike) > 1 and died[0].log.blocked_in is None:  # "ranks 0, 1 ended (...)"
            error = error.replace(f"rank {died[0].rank} ",
                                  f"ranks {', '.join(map(str, alike))} ", 1)
    elif failed:
        error = f"the grader failed in rank {failed[0].rank}: " + \
            failed[0].log.failed.strip().splitlines()[-1]
    elif case.ended == "join limit":
        error = "the ranks could not form a process group in time"
    else:
        error = "a rank failed"
    shown = raised[0] if raised else died[0] if died else None
    others = [run for run in case.ranks if run is not shown]
    details += [state(run, files)[1] for run in others]
    if failed or case.ended == "join limit":  # the grader's trouble: what torch said
        details += [f"rank {run.rank}'s stderr: {line}" for run in case.ranks
                    for line in run.errors.splitlines()[-3:]]
    return error, details


def printed(case: CaseRun) -> list[str]:
    """What each rank printed, a few lines each, for a learner debugging with print."""
    lines = []
    for run in case.ranks:
        text = [line for line in run.printed.splitlines() if line.strip()][-3:]
        lines += [f"rank {run.rank} printed: {line}" for line in text]
    return lines
