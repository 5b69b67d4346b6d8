"""What each rank did: every torch.distributed call it made, and the one it is in now.

Inside a rank, ``install()`` replaces the point-to-point and collective functions of
``torch.distributed`` with wrappers that append one JSON line per event to the rank's
log: a call starting (which, to or from whom, how many bytes, from which line of the
learner's code), a blocking call or a wait ending, the candidate returning or raising.
That log is what the grader reads after the case: the calls, in order, to grade the
algorithm and not only the answer. It is also the rank's last word: a rank killed at the
time limit leaves as its last open event the call it was blocked in, which is how the
grader can say "rank 0 blocked in send to rank 1 at step 0".

Each line goes to the file in one ``write`` with no buffering in Python, so a kill loses
at most the line being written; ``read`` drops a torn last line.

Only the outermost call is recorded: ``send`` is built on ``isend`` and ``wait``, and a
learner's one send must count once.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

POINT_TO_POINT = ("send", "recv", "isend", "irecv")
BLOCKING = ("send", "recv")
SENDS = ("send", "isend")
# Everything else a learner might reach for instead of writing the algorithm.
COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "all_to_all",
    "all_to_all_single", "scatter", "gather", "barrier", "monitored_barrier",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "send_object_list", "recv_object_list",
)

# Frames in these folders are torch's or the grader's; the first other frame is the
# learner's line that made the call.
NOT_LEARNER = (str(Path(torch.__file__).parent), str(Path(__file__).parents[1]),
               functools.__file__)


@dataclass
class Call:
    """One torch.distributed call a rank made, as the grader reads it back."""

    seq: int  # its place among the rank's calls, from 0
    op: str  # "send", "isend", "all_reduce", ...
    peer: int | None  # the rank sent to or received from; None for a collective
    elements: int
    bytes: int
    dtype: str
    blocking: bool
    step: int = 0  # for a send, how many sends the rank made before it; likewise a receive
    at: tuple[str, int, str] | None = None  # (file, line, function) in the learner's code
    via: str = ""  # "batch_isend_irecv" when it was one of a batch
    started: float = 0.0  # time.monotonic() when it was called (one clock for all ranks)
    ended: float | None = None  # when it returned (blocking) or its wait did; None: never

    @property
    def is_send(self) -> bool:
        return self.op in SENDS

    @property
    def is_point_to_point(self) -> bool:
        return self.op in POINT_TO_POINT

    def describe(self) -> str:
        """"send to rank 1 at step 0 (4,096 B)", "all_reduce (4,096 B)"."""
        if not self.is_point_to_point:
            return f"{self.op} ({self.bytes:,} B)"
        peer = "any rank" if self.peer is None else f"rank {self.peer}"
        way = "to" if self.is_send else "from"
        return f"{self.op} {way} {peer} at step {self.step} ({self.bytes:,} B)"


@dataclass
class Mark:
    """A point in the rank's run that the grader's code noted (``mark``): "step 2",
    "forward 1", with what it saw there. ``calls``: how many calls the rank had made."""

    label: str
    calls: int
    data: dict = field(default_factory=dict)
    at: float = 0.0  # time.monotonic()


@dataclass
class RankLog:
    """A rank's log, read back: its calls, and where it stood when it stopped."""

    rank: int
    pid: int | None = None
    ready: bool = False  # it joined the process group
    calls: list[Call] = field(default_factory=list)
    returned: bool = False
    raised: dict | None = None  # {"type", "message", "frames": [[file, line, function]]}
    failed: str = ""  # the grader's own code failed in the rank (not the learner's)
    blocked_in: Call | None = None  # a blocking call it had not come back from
    waiting_for: list[Call] = field(default_factory=list)  # requests it was waiting on
    waiting_at: tuple[str, int, str] | None = None  # the learner's line that waits
    last: Call | None = None  # its last call, when it was in none
    marks: list[Mark] = field(default_factory=list)  # what the grader's own code noted
    # The log as the rank wrote it, one JSON event a line: what ``parse`` reads back, and
    # what a grader in another process is sent to judge the calls again.
    text: str = field(default="", repr=False, compare=False)

    def sends(self) -> list[Call]:
        return [call for call in self.calls if call.is_send]

    def receives(self) -> list[Call]:
        return [call for call in self.calls if call.op in ("recv", "irecv")]

    def collectives(self) -> list[Call]:
        return [call for call in self.calls if not call.is_point_to_point]


# --- inside a rank: writing ---------------------------------------------------------------

_fd: int | None = None
_seq = 0
_local = threading.local()  # depth of wrapped calls on this thread: record the outermost


def start(path: Path, rank: int) -> None:
    """Log this rank's events to ``path`` from now on."""
    global _fd, _seq
    _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    _seq = 0
    emit({"e": "pid", "pid": os.getpid(), "rank": rank})


def emit(event: dict) -> None:
    if _fd is not None:
        os.write(_fd, (json.dumps(event) + "\n").encode())


def mark(label: str, **data: object) -> None:
    """Note a point in the rank's run, between its calls, with what the grader saw there
    (numbers and words): a check can then tell which calls a step's forward made."""
    emit({"e": "mark", "label": label, "calls": _seq, "data": data, "t": time.monotonic()})


def _learners_line() -> list | None:
    frame = sys._getframe(2)
    while frame is not None:
        if not frame.f_code.co_filename.startswith(NOT_LEARNER):
            return [frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name]
        frame = frame.f_back
    return None


def _size(value: object) -> tuple[int, int, str]:
    """(elements, bytes, dtype) of a tensor or a list of tensors; (0, 0, "") otherwise."""
    if isinstance(value, torch.Tensor):
        return value.numel(), value.numel() * value.element_size(), str(value.dtype)[6:]
    if isinstance(value, (list, tuple)):
        sizes = [_size(item) for item in value]
        dtype = next((d for _, _, d in sizes if d), "")
        return sum(s[0] for s in sizes), sum(s[1] for s in sizes), dtype
    return 0, 0, ""


def _begin(op: str, tensor: object, peer: int | None, blocking: bool, via: str = "") -> int:
    global _seq
    seq, _seq = _seq, _seq + 1
    elements, size, dtype = _size(tensor)
    emit({"e": "call", "seq": seq, "op": op, "peer": peer, "elements": elements,
          "bytes": size, "dtype": dtype, "blocking": blocking, "at": _learners_line(),
          "via": via, "t": time.monotonic()})
    return seq


class Request:
    """A Work handle from isend, irecv or an async collective, whose ``wait`` is logged:
    a rank stuck in ``req.wait()`` is waiting for that request, and the log says so."""

    def __init__(self, work: object, seqs: list[int]):
        self._work, self._seqs = work, seqs

    def wait(self, *args, **kwargs):
        emit({"e": "wait", "seqs": self._seqs, "at": _learners_line()})
        done = self._work.wait(*args, **kwargs)
        emit({"e": "waited", "seqs": self._seqs, "t": time.monotonic()})
        return done

    def __getattr__(self, name: str):
        return getattr(self._work, name)


def _depth() -> int:
    return getattr(_local, "depth", 0)


def _inner(original, *args, **kwargs):
    """Call a wrapped function with recording off for whatever it calls."""
    _local.depth = _depth() + 1
    try:
        return original(*args, **kwargs)
    finally:
        _local.depth -= 1


def _point_to_point(name: str, original):
    signature = inspect.signature(original)
    sends = name in SENDS

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _depth():
            return original(*args, **kwargs)
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError:  # torch's own error says it best
            return original(*args, **kwargs)
        peer = given.get("dst" if sends else "src")
        if peer is None:
            peer = given.get("group_dst" if sends else "group_src")
        seq = _begin(name, given.get("tensor"), peer, blocking=name in BLOCKING)
        result = _inner(original, *args, **kwargs)
        if name in BLOCKING:
            # recv from any rank returns the sender: record who it was
            emit({"e": "done", "seq": seq, "peer": result if name == "recv" else peer,
                  "t": time.monotonic()})
            return result
        return Request(result, [seq]) if result is not None else None

    return wrapper


def _collective(name: str, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _depth():
            return original(*args, **kwargs)
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)
        tensors = next((given[key] for key in ("tensor", "input", "input_tensor", "tensors",
                                               "input_list", "input_tensor_list", "obj",
                                               "object_list") if key in given), None)
        asynchronous = bool(given.get("async_op", False))
        seq = _begin(name, tensors, None, blocking=not asynchronous)
        result = _inner(original, *args, **kwargs)
        if asynchronous and result is not None:
            return Request(result, [seq])
        emit({"e": "done", "seq": seq, "t": time.monotonic()})
        return result

    return wrapper


def _batch(original):
    @functools.wraps(original)
    def wrapper(p2p_op_list):
        if _depth():
            return original(p2p_op_list)
        seqs = []
        for op in p2p_op_list:
            name = getattr(op.op, "__name__", "isend")
            name = name if name in ("isend", "irecv") else "isend"
            seqs.append(_begin(name, op.tensor, op.peer, blocking=False,
                               via="batch_isend_irecv"))
        works = _inner(original, p2p_op_list)
        if len(works) == len(seqs):
            return [Request(work, [seq]) for work, seq in zip(works, seqs, strict=True)]
        return [Request(work, seqs) for work in works]  # coalesced: one handle for all

    return wrapper


_installed = False


def install() -> None:
    """Wrap torch.distributed's functions in this process (idempotent). Both names of each
    are replaced, ``torch.distributed.send`` and ``torch.distributed.distributed_c10d.send``:
    torch's own helpers (``P2POp``, ``send``) look them up in the latter."""
    global _installed
    if _installed:
        return
    c10d = dist.distributed_c10d
    for name in POINT_TO_POINT + COLLECTIVES + ("batch_isend_irecv",):
        original = getattr(c10d, name, None)
        if original is None:  # an older torch without it
            continue
        if name == "batch_isend_irecv":
            wrapped = _batch(original)
        elif name in POINT_TO_POINT:
            wrapped = _point_to_point(name, original)
        else:
            wrapped = _collective(name, original)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)
    _installed = True


def candidate_returned() -> None:
    emit({"e": "returned"})


def candidate_raised(error: BaseException) -> None:
    import traceback

    frames = [[f.filename, f.lineno, f.name] for f in traceback.extract_tb(error.__traceback__)]
    try:
        message = str(error)
    except BaseException:  # noqa: BLE001 (a hostile __str__ must not hide the error)
        message = "<its message cannot be shown>"
    # The clock every process shares: which rank raised first is the likely cause.
    emit({"e": "raised", "t": time.monotonic(), "type": type(error).__name__,
          "message": message[:2000],
          "frames": frames, "code": getattr(error, "code", None)
          if isinstance(error, SystemExit) else None})


def grader_failed(text: str) -> None:
    emit({"e": "failed", "text": text[-4000:]})


# --- in the grader: reading ---------------------------------------------------------------

def read(path: Path, rank: int) -> RankLog:
    """A rank's log as the grader sees it (an empty RankLog if it wrote nothing)."""
    try:
        text = path.read_bytes().decode(errors="replace")
    except OSError:
        return RankLog(rank)
    return parse(text, rank)


def parse(text: str, rank: int) -> RankLog:
    """A rank's log from the lines it wrote (``RankLog.text``)."""
    log = RankLog(rank, text=text)
    by_seq: dict[int, Call] = {}
    steps = {True: 0, False: 0}  # sends, receives made so far
    open_seq: int | None = None  # a blocking call not come back from
    waiting: list[int] = []
    for line in text.split("\n"):
        try:
            event = json.loads(line)
        except ValueError:  # a torn last line, or the empty string after the last newline
            continue
        kind = event.get("e")
        if kind == "pid":
            log.pid = event["pid"]
        elif kind == "ready":
            log.ready = True
        elif kind == "call":
            call = Call(event["seq"], event["op"], event["peer"], event["elements"],
                        event["bytes"], event["dtype"], event["blocking"],
                        at=tuple(event["at"]) if event.get("at") else None,
                        via=event.get("via", ""), started=event.get("t", 0.0))
            if call.is_point_to_point:
                call.step = steps[call.is_send]
                steps[call.is_send] += 1
            by_seq[call.seq] = call
            log.calls.append(call)
            open_seq = call.seq if call.blocking else None
        elif kind == "done":
            call = by_seq.get(event["seq"])
            if call is not None and call.peer is None and event.get("peer") is not None:
                call.peer = event["peer"]
            if call is not None:
                call.ended = event.get("t")
            open_seq = None
        elif kind == "wait":
            waiting = list(event["seqs"])
            log.waiting_at = tuple(event["at"]) if event.get("at") else None
        elif kind == "waited":
            waiting = []
            for seq in event["seqs"]:
                if seq in by_seq:
                    by_seq[seq].ended = event.get("t")
        elif kind == "returned":
            log.returned = True
        elif kind == "raised":
            log.raised = event
        elif kind == "failed":
            log.failed = event["text"]
        elif kind == "mark":
            log.marks.append(Mark(event["label"], event["calls"], event.get("data", {}),
                                  event.get("t", 0.0)))
    log.blocked_in = by_seq.get(open_seq) if open_seq is not None else None
    log.waiting_for = [by_seq[seq] for seq in waiting if seq in by_seq]
    log.last = log.calls[-1] if log.calls else None
    return log
