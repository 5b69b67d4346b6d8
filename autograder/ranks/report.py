"""What went wrong on which rank, in words: a hang, an exception, a rank that died.

A rank's log says where it stood when its case ended (``record.py``); this module turns
that into one line per rank, "rank 0 blocked in send to rank 1 at step 0 (at cell In[4],
line 9: `dist.send(chunk, right)`)", and into a diagnosis of the whole: every rank in a
blocking send is the classic deadlock. A rank whose process crashed in native code (gloo
ends one that receives a message larger than the tensor it posted) is explained by what
the ranks recorded: a message whose sender and receiver disagree on its size, or
asynchronous calls never waited for; its peers' lost connections are named as what
followed, never as a cause. File names and source lines are the grader's to
fill in: the ranks ran code that cloudpickle renamed, and the source of a notebook cell
is only in the Jupyter kernel's memory.
"""

from __future__ import annotations

import linecache
import signal
from collections import Counter
from pathlib import Path

from ..course.build import course_stub, is_stub_raise
from .launch import CaseRun, RankRun
from .record import NOT_LEARNER, Call, RankLog
from .transport import installed, real_file

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
        text = _ended(run)
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


def _ended(run: RankRun, cause: str = "") -> str:
    """"rank 0 ended (killed by SIGABRT) before returning, in recv from rank 1 at step 0
    (4,096 B): " and the cause, or a guess where the records show none."""
    if not cause:
        cause = "os._exit?" if run.status == 0 else "a crash in native code?" \
            if (run.status or 0) < 0 else "os._exit, or a crash in native code?"
    return f"rank {run.rank} ended ({_status(run.status)}) before returning{_inside(run.log)}: " \
        + cause


def _inside(log: RankLog) -> str:
    """", in all_gather_into_tensor (14,448 B)": the call a rank stood in, if any."""
    if log.blocked_in is not None:
        return f", in {log.blocked_in.describe()}"
    if log.waiting_for:
        return ", waiting for its " + " and ".join(call.describe() for call in log.waiting_for)
    return ""


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
    """The frames of the learner's code (torch's, the grader's and any installed
    package's left out)."""
    return [frame for frame in frames
            if not frame[0].startswith(NOT_LEARNER) and not installed(frame[0])]


# What gloo raises on a rank whose peer's process has gone (its connections closed with
# it): a consequence of that rank's end, never a cause of its own.
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def lost_peer(run: RankRun) -> str:
    """The words of gloo's error if the rank raised for want of a peer that had gone."""
    raised = run.log.raised
    message = raised.get("message", "") if raised is not None else ""
    return next((words for words in LOST_PEER if words in message), "")


def _consequence(run: RankRun, first: RankRun) -> str:
    return (f"rank {run.rank} then lost its connection{_inside(run.log)} "
            f"(\"{lost_peer(run)}\"): a consequence of rank {first.rank} ending first, not a "
            "cause")


# --- why a rank's process ended: what the records show ------------------------------------------

# Collectives to which every rank hands a tensor of the same size.
SAME_SIZE = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
             "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
             "reduce_scatter_single")


def size_mismatch(logs: list[RankLog], files: Files) -> str:
    """The first message whose sender and receiver disagree on its size, in words; or the
    first collective the ranks entered with different calls or sizes; "" if none."""
    return _point_to_point_mismatch(logs, files) or _collective_mismatch(logs)


def _point_to_point_mismatch(logs: list[RankLog], files: Files) -> str:
    """Between two ranks, messages are matched in order: the k-th send from a to b is
    the k-th receive on b from a. The first pair that disagrees on bytes, in words."""
    found: list[tuple[float, Call, Call, int]] = []
    for receiver in logs:
        receives = receiver.receives()
        if any(call.peer is None for call in receives):  # from any rank: no pairs known
            continue
        for sender in (log for log in logs if log is not receiver):
            sends = [call for call in sender.sends() if call.peer == receiver.rank]
            mine = [call for call in receives if call.peer == sender.rank]
            # One rank may have got further than the other: the pairs both made.
            pair = next(((send, receive) for send, receive in zip(sends, mine, strict=False)
                         if send.bytes != receive.bytes), None)
            if pair is not None:
                found.append((max(pair[0].started, pair[1].started), *pair, sender.rank))
    if not found:
        return ""
    _, send, receive, sender = min(found, key=lambda item: item[0])
    receiver = send.peer
    sent, posted = place(files, send.at), place(files, receive.at)
    where = f" (both at {sent})" if sent and sent == posted else \
        "".join(f" ({way} at {text})" for way, text in (("sent", sent), ("received", posted))
                if text)
    aborts = (": gloo ends a process that receives a message larger than the tensor it "
              "posted for it" if send.bytes > receive.bytes else "")
    return (f"rank {sender} sent {send.elements:,} elements ({send.bytes:,} B) to rank "
            f"{receiver} in its {send.op} at step {send.step}, and rank {receiver}'s matching "
            f"{receive.op} (its receive at step {receive.step}) has room for "
            f"{receive.elements:,} elements ({receive.bytes:,} B){where}. The sender and the "
            "receiver of a message must agree on its size, so cut the tensor the same way on "
            f"both sides{aborts}")


def _collective_mismatch(logs: list[RankLog]) -> str:
    """The first collective, in each rank's order, that the ranks called differently."""
    calls = [[call for call in log.collectives() if not call.builds and not call.group]
             for log in logs]
    for index in range(min(len(made) for made in calls)):
        these = [made[index] for made in calls]
        ops = {call.op for call in these}
        ordinal = _ordinal(index + 1)
        if len(ops) > 1:
            each = ", ".join(f"rank {log.rank}: {call.op}"
                             for log, call in zip(logs, these, strict=True))
            return (f"the ranks' {ordinal} collective calls differ ({each}): every rank "
                    "must make the same collective calls, in the same order")
        if these[0].op in SAME_SIZE and len({call.bytes for call in these}) > 1:
            each = ", ".join(f"rank {log.rank}: {call.bytes:,} B"
                             for log, call in zip(logs, these, strict=True))
            return (f"the ranks handed their {ordinal} collective call, {these[0].op}, "
                    f"tensors of different sizes ({each}): every rank must hand it the "
                    "same size")
    return ""


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(
        number % 10, "th")
    return f"{number}{suffix}"


def never_waited(log: RankLog) -> list[Call]:
    """The rank's asynchronous calls whose handles it let go without a wait()."""
    return [call for call in log.calls if call.dropped and call.ended is None]


def not_waited(log: RankLog) -> list[Call]:
    """The rank's asynchronous collectives not waited for by the time it ended, though it
    had gone on to later calls (not the ones it was waiting for then). Messages are left
    out: posting several isend and irecv before waiting for any is the usual way."""
    waiting = {call.seq for call in log.waiting_for}
    last = log.calls[-1].seq if log.calls else -1
    return [call for call in log.calls if not call.blocking and call.ended is None
            and not call.is_point_to_point and call.seq < last and call.seq not in waiting]


def unwaited(run: CaseRun, files: Files) -> str:
    """For a case whose ranks returned a wrong answer: what the first rank that let an
    asynchronous call go unwaited had not waited for, in words; "" if none did. Such a
    call may still be filling its tensor when the rank reads it: garbage, not a crash."""
    for rank in run.ranks:
        words = _unwaited_words(f"rank {rank.rank}", rank.log, files)
        if words:
            return words
    return ""


def _unwaited_words(who: str, log: RankLog, files: Files) -> str:
    """What a rank had not waited for, in words; "" if nothing."""
    dropped, pending = never_waited(log), not_waited(log)
    calls = dropped or pending
    if not calls:
        return ""
    first = calls[0]
    many = f"{len(calls)} of its asynchronous calls" if len(calls) > 1 else \
        "one of its asynchronous calls"
    if dropped:
        what = (f"{who} never waited for {many} (async_op=True): the handles were overwritten "
                "or thrown away before wait()")
    else:
        later = log.calls[-1].seq - first.seq
        what = (f"{who} had not waited for {many} (async_op=True), though it had gone on to "
                f"{later} later call{'s' if later > 1 else ''}")
    where = place(files, first.at)
    return (f"{what} (the first: its {first.describe()}{', at ' + where if where else ''}). Until "
            "wait() returns, such a call may still be writing into its tensor, and freeing "
            "or refilling that tensor meanwhile can crash the process: keep each handle, and "
            "wait() on it before the tensor is used, freed or written again")


def _other(run: RankRun, died: list[RankRun], lost: list[RankRun], files: Files) -> str:
    """The line of a rank other than the one the error names."""
    if run in lost:
        return _consequence(run, died[0])
    dropped, pending = never_waited(run.log), not_waited(run.log)
    if run in died and run.status and (dropped or pending):
        return _ended(run, f"it too {'never' if dropped else 'had not'} waited for "
                           f"{len(dropped or pending)} of its asynchronous calls")
    return state(run, files)[1]


def cause_of_end(runs: list[RankRun], died: list[RankRun], files: Files) -> str:
    """Why ``died[0]`` crashed, from the records of every rank: messages whose sender and
    receiver disagree on their size, or asynchronous calls never waited for; "" if the
    records show neither."""
    mismatch = size_mismatch([run.log for run in runs], files)
    if mismatch:
        return mismatch
    for run in died:
        words = _unwaited_words("it" if run is died[0] else f"rank {run.rank}", run.log, files)
        if words and run.status:
            return words
    return ""


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


def course_stub_reached(run: RankRun, files: Files) -> str:
    """The name of the course's stub this rank's code called and that raised
    (``course.build.course_stub``); "" otherwise."""
    raised = run.log.raised
    if raised is None or raised["type"] != "NotImplementedError" or raised["message"] or \
            not raised["frames"]:
        return ""
    filename, number, function = raised["frames"][-1][:3]
    path = real_file(files, filename, number, function)
    return course_stub(path, function, linecache.getline(path, number))


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
    # Ranks that raised because a rank that ended had closed its connections.
    lost = [run for run in raised if died and lost_peer(run)]
    raised = [run for run in raised if run not in lost]
    if died and raised and _left_first(died[0], raised[0]):
        raised = []  # they raised for want of the rank that left: it is the cause
    details = []
    if raised:
        first = raised[0]
        same = sorted(run.rank for run in raised if _exception(run.log.raised)
                      == _exception(first.log.raised))
        who = f"rank {first.rank}" if len(same) == 1 else "every rank" if \
            len(same) == len(case.ranks) else "ranks " + ", ".join(map(str, same))
        frames = _learner_frames(first.log.raised["frames"])
        error = f"{who} raised {_exception(first.log.raised)}" + \
            (_at(files, frames[-1]) if frames else "")
        details += [f"rank {first.rank}'s traceback:"] + traceback_lines(first, files)
    elif died:
        # A rank's own os._exit(0) is its cause; a crash, what the records show.
        cause = cause_of_end(case.ranks, died, files) if died[0].status else ""
        error = _ended(died[0], cause)
        alike = sorted(run.rank for run in died if run.status == died[0].status
                       and not _inside(run.log))
        if len(alike) > 1 and not _inside(died[0].log) and not cause:  # "ranks 0, 1 ended"
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
    said = set(same) if raised else set()  # ranks the error names: said once
    others = [run for run in case.ranks if run is not shown and run.rank not in said]
    details += [_other(run, died, lost, files) for run in others]
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


def forged_marks(log: RankLog, labels: tuple[str, ...]) -> str:
    """"" when each of the harness's marks appears at most once in the rank's log, as the
    harness writes them; else what the learner's code wrote besides."""
    counts = Counter(m.label for m in log.marks if m.label in labels)
    twice = [label for label, count in counts.items() if count > 1]
    if twice:
        return (f"rank {log.rank}'s log holds the grader's mark \"{twice[0]}\" "
                f"{counts[twice[0]]} times: the grader writes it once, and marks written by "
                "other code are refused")
    return ""
