"""What each rank did: every torch.distributed call it made, and the one it is in now.

Inside a rank, ``install()`` replaces the point-to-point and collective functions of
``torch.distributed`` with wrappers that append one JSON line per event to the rank's
log: a call starting (which, to or from whom, how many bytes, the shapes of what it was
handed, from which line of the learner's code, and in backward from which autograd node's
backward), a blocking call or a wait ending, the candidate returning or raising.
That log is what the grader reads after the case: the calls, in order, to grade the
algorithm and not only the answer. It is also the rank's last word: a rank killed at the
time limit leaves as its last open event the call it was blocked in, which is how the
grader can say "rank 0 blocked in send to rank 1 at step 0".

Each line goes to the file in one ``write`` with no buffering in Python, so a kill loses
at most the line being written; ``read`` drops a torn last line.

A handle of an asynchronous call (``async_op=True``, ``isend``) that is let go before
any wait, overwritten or never kept, is logged as ``dropped``: the call may still be
writing into its tensor, which is how a rank that crashes after it is explained.

Only the outermost call is recorded: ``send`` is built on ``isend`` and ``wait``, and a
learner's one send must count once.

What a send carried is recorded too, as a digest of its values (``digest``): the grader
checks each message against what the algorithm must deliver at that step, so messages of
the right sizes that carry nothing fail, however the answer got to the ranks. And while
the candidate runs (``watch``), so is every way around the functions above that Python
can see: a process group or a store it builds itself, and a group's own methods called
directly. Deny by default: every public function of torch.distributed is recorded but
those listed as ``SILENT``, every public class built but the ``SILENT_CLASSES``, every
method of a process group called but the ``SILENT_METHODS``; so what a newer torch adds
is recorded, and reported as a library call, until it is classified here. So are the
functional collectives that DTensor issues (``FUNCTIONAL``), and the operators under them
(``OPERATORS``, torch.ops._c10d_functional), under the name of the collective each one
is: a tensor-parallel plan of PyTorch's is graded on its calls as a learner's is. Last,
every c10d operator called from Python (``torch.ops.c10d.<name>``, with a boxed process
group) is recorded as the call it is (``C10D``).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import threading
import time
import warnings
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
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
    "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
    "all_to_all_single", "scatter", "gather", "barrier", "monitored_barrier",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "send_object_list", "recv_object_list",
)
# Those that make a process group, or a store to make one from: a channel of the
# candidate's own, which the functions above never see.
GROUPS = ("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group",
          "shrink_group", "init_process_group", "destroy_process_group", "init_device_mesh",
          "rendezvous")
# The public functions of torch.distributed that communicate nothing: they ask about the
# group, the backend or the build, or set up debugging. ``install`` records every other.
SILENT = frozenset({
    "GroupName", "breakpoint", "get_backend", "get_backend_config", "get_debug_level",
    "get_default_backend_for_device", "get_global_rank", "get_group_rank",
    "get_node_local_rank", "get_pg_count", "get_process_group_ranks", "get_rank",
    "get_world_size", "is_available", "is_backend_available", "is_gloo_available",
    "is_initialized", "is_mpi_available", "is_nccl_available", "is_torchelastic_launched",
    "is_ucc_available", "is_xccl_available", "record_comm", "register_rendezvous_handler",
    "set_debug_level", "set_debug_level_from_env", "supports_complex",
})
# Public classes of torch.distributed whose construction is a group, a store or DDP's
# all-reduce engine: recorded as a group the candidate built.
BUILDERS = ("ProcessGroup", "ProcessGroupGloo", "FileStore", "TCPStore", "HashStore",
            "PrefixStore", "Reducer", "DeviceMesh")
SILENT_CLASSES = frozenset({
    "AllToAllOptions", "AllreduceCoalescedOptions", "AllreduceOptions", "Backend",
    "BackendConfig", "BarrierOptions", "BroadcastOptions", "BuiltinCommHookType",
    "DebugLevel", "DistBackendError", "DistError", "DistNetworkError", "DistStoreError",
    "GatherOptions", "GradBucket", "GroupMember", "Logger", "P2POp", "QueueEmptyError",
    "ReduceOp", "ReduceOptions", "ReduceScatterOptions", "ScatterOptions", "Store", "Work",
    "group", "timedelta",
})
# Methods of a process group (and of its backend) that move data: called directly, on the
# default group or on one built from a store, they go around every function above.
GROUP_METHODS = (
    "_allgather_base", "_reduce_scatter_base", "all_gather_single",
    "all_gather_single_coalesced", "all_to_all_single", "allgather", "allgather_coalesced",
    "allgather_into_tensor_coalesced", "allreduce", "allreduce_coalesced", "alltoall",
    "alltoall_base", "barrier", "broadcast", "gather", "merge_remote_group",
    "monitored_barrier", "recv", "recv_anysource", "reduce", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "scatter", "send", "shrink", "split_group",
)
SILENT_METHODS = frozenset({
    "BackendType", "CUSTOM", "GLOO", "MPI", "NCCL", "Options", "UCC", "UNDEFINED", "XCCL",
    "_backend_id", "_device_types", "_enable_collectives_timing", "_end_coalescing",
    "_get_backend", "_get_backend_name", "_get_sequence_number_for_group", "_has_hooks",
    "_id", "_pybind11_conduit_v1_", "_register_backend", "_register_on_completion_hook",
    "_set_default_backend", "_set_group_desc", "_set_group_name",
    "_set_sequence_number_for_group", "_start_coalescing", "_wait_for_pending_works", "abort",
    "allocate_tensor", "bound_device_id", "boxed", "eager_connect_single_device",
    "get_group_store", "group_desc", "group_name", "mem_allocator", "memory_stats", "name",
    "rank", "resume", "setUsePgForSymmMemRendezvous", "set_timeout", "shutdown", "size",
    "supports_coalescing", "supports_shrinking", "supports_splitting",
    "supports_tensor_alloc", "supports_time_estimate", "suspend", "unbox",
    "use_pg_for_symm_mem_rendezvous",
})
# torch.distributed._functional_collectives ("funcol"), the collectives DTensor and
# torch.compile issue, by the name of the torch.distributed collective each one is: they
# reach the process group in C++, past every function above.
FUNCTIONAL = {
    "all_reduce": "all_reduce", "all_reduce_inplace": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_tensor": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "all_gather_tensor_autograd": "all_gather_into_tensor",
    "all_gather_inplace": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd": "reduce_scatter_tensor",
    "reduce_scatter_inplace": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single", "all_to_all_single_autograd": "all_to_all_single",
    "all_to_all_inplace": "all_to_all_single", "broadcast": "broadcast",
    "permute_tensor": "permute_tensor",
}
FUNCTIONAL_VIA = "functional"
# The operators underneath them, reachable as torch.ops._c10d_functional.<name> (and
# .default): called directly, they go past funcol too.
OPERATOR_SPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d_functional")
OPERATORS = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single", "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
OPERATOR_VIA = "torch.ops"
# torch.distributed.distributed_c10d's own ways to a new group, from its default store.
INTERNALS = ("_get_default_store", "_new_group_with_tag", "_new_process_group_helper")
# A store's methods that carry data between processes.
STORE_METHODS = ("add", "append", "compare_set", "get", "multi_get", "multi_set",
                 "queue_pop", "queue_push", "set")
# In the log, an op the candidate reached around the recorded functions: a group or
# store it built ("own"), or the harness's own group used through its methods.
OWN, HARNESS = "own", "harness"

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
    # For a send, what it carried (``digest``); None where the log holds none.
    digest: tuple[float, float, float] | None = None
    # For an op reached around the recorded functions: OWN, a group or store the
    # candidate built; HARNESS, the default group's methods called directly.
    group: str = ""
    # For an asynchronous call: its handle was let go (overwritten, or never kept) with
    # no wait() on it, nor any other way to learn that the call had ended.
    dropped: bool = False
    # The shape of what it was handed to send, and of the output it was handed, if any
    # (a list of shapes for a list of tensors): what a shape error in the library was
    # about.
    shape: list | None = None
    into: list | None = None
    # Made in backward: the autograd node whose backward was running, (name, sequence
    # number), e.g. ("CopyToParallelBackward", 12). None in forward.
    node: tuple[str, int] | None = None

    @property
    def is_send(self) -> bool:
        return self.op in SENDS

    @property
    def is_point_to_point(self) -> bool:
        return self.op in POINT_TO_POINT

    @property
    def builds(self) -> bool:
        """A group or store the candidate made (``dist.new_group``, ``ProcessGroupGloo``)."""
        return self.op in GROUPS or self.op in BUILDERS or self.op in INTERNALS

    def library(self) -> str:
        """How the learner's code reached it, for a message: "dist.all_reduce",
        "ProcessGroup.allreduce directly", "dist.ProcessGroupGloo(…)"."""
        if self.op in BUILDERS or inspect.isclass(getattr(dist, self.op, None)):
            return f"dist.{self.op}(…)"
        if self.op in INTERNALS:
            return f"dist.distributed_c10d.{self.op}()"
        if self.via == C10D_VIA:
            return f"{self.op} (torch.ops.c10d directly)"
        if "." in self.op:
            where = " on a group of its own" if self.group == OWN else " directly"
            return self.op + where
        return f"dist.{self.op}"

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
    # Files it read that were written during the check: (path, the learner's line).
    reread: list[tuple[str, tuple | None]] = field(default_factory=list)
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


def _shape(value: object) -> list | None:
    """A tensor's shape, a list of them for a list of tensors; None for anything else."""
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, (list, tuple)) and value and \
            all(isinstance(item, torch.Tensor) for item in value):
        return [list(item.shape) for item in value]
    return None


def _node() -> list | None:
    """The autograd node whose backward is running on this thread, [name, sequence
    number]; None outside backward."""
    try:
        node = torch._C._current_autograd_node()
        return None if node is None else [node.name(), int(node._sequence_nr())]
    except (AttributeError, RuntimeError, TypeError):  # a torch without these
        return None


def digest(tensor: object) -> list[float] | None:
    """What a message carried, in three float64 numbers: the sum of its values, their sum
    weighted by place (1, 2, 3, …) and the sum of their magnitudes. The grader computes
    the same from the inputs for what the message should carry; the last is 0 only for
    zeros. None for what is not a tensor of numbers."""
    if not isinstance(tensor, torch.Tensor) or tensor.is_complex() or tensor.is_meta:
        return None
    try:
        values = tensor.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
    except (RuntimeError, TypeError):
        return None
    place = torch.arange(1, values.numel() + 1, dtype=torch.float64)
    return [float(values.sum()), float((values * place).sum()), float(values.abs().sum())]


def _begin(op: str, tensor: object, peer: int | None, blocking: bool, via: str = "",
           carried: bool = False, group: str = "", into: object = None) -> int:
    global _seq
    seq, _seq = _seq, _seq + 1
    elements, size, dtype = _size(tensor)
    event = {"e": "call", "seq": seq, "op": op, "peer": peer, "elements": elements,
             "bytes": size, "dtype": dtype, "blocking": blocking, "at": _learners_line(),
             "via": via, "t": time.monotonic(), "shape": _shape(tensor),
             "into": _shape(into), "node": _node()}
    if carried:
        event["digest"] = digest(tensor)
    if group:
        event["group"] = group
    emit(event)
    return seq


# A handle's methods, besides ``wait``, by which a rank can learn that its call ended: a
# handle used through them is never said to be dropped unwaited.
HANDLE_ENDS = ("get_future", "is_completed", "result", "synchronize", "exception",
               "is_success", "source_rank", "_source_rank")


class Request:
    """A Work handle from isend, irecv or an async collective, whose ``wait`` is logged:
    a rank stuck in ``req.wait()`` is waiting for that request, and the log says so. A
    handle let go before any wait (overwritten, or never kept) is logged too, as
    ``dropped``: its call may still be writing into its tensors."""

    def __init__(self, work: object, seqs: list[int], from_any: bool = False):
        self._work, self._seqs, self._from_any = work, seqs, from_any
        self._ended_known = False

    def __del__(self):
        if not self.__dict__.get("_ended_known", True):
            try:
                emit({"e": "dropped", "seqs": self._seqs})
            except BaseException:  # noqa: BLE001 (a finalizer must never raise)
                pass

    def wait(self, *args, **kwargs):
        self._ended_known = True
        emit({"e": "wait", "seqs": self._seqs, "at": _learners_line()})
        done = self._work.wait(*args, **kwargs)
        event = {"e": "waited", "seqs": self._seqs, "t": time.monotonic()}
        if self._from_any:  # an irecv that named no source: now it is known
            try:
                event["peer"] = int(self._work._source_rank())
            except (AttributeError, RuntimeError, TypeError, ValueError):
                pass
        emit(event)
        return done

    def __getattr__(self, name: str):
        if name in HANDLE_ENDS:
            self._ended_known = True
        return getattr(self._work, name)


def _sealed(original):
    """``functools.wraps`` without ``__wrapped__``: that attribute hands anyone the
    unrecorded original in one step. The signature stays, for whatever inspects it. (The
    wrapper's closure still holds the original: a record kept in the process the learner's
    code runs in can be read around, and the README says so; this closes the open door.)"""
    def seal(wrapper):
        functools.update_wrapper(wrapper, original)
        del wrapper.__wrapped__
        try:
            wrapper.__signature__ = inspect.signature(original)
        except (TypeError, ValueError):  # a builtin without one
            pass
        return wrapper

    return seal


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

    @_sealed(original)
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
        seq = _begin(name, given.get("tensor"), peer, blocking=name in BLOCKING,
                     carried=sends)
        result = _inner(original, *args, **kwargs)
        if name in BLOCKING:
            # recv from any rank returns the sender: record who it was
            emit({"e": "done", "seq": seq, "peer": result if name == "recv" else peer,
                  "t": time.monotonic()})
            return result
        return Request(result, [seq], from_any=peer is None) if result is not None else None

    return wrapper


# The argument that holds what a collective sends, by the names torch.distributed's
# functions give it, and the functional collectives'.
SENT = ("tensor", "input", "input_tensor", "tensors", "input_list", "input_tensor_list", "obj",
        "object_list")
SENT_FUNCTIONAL = ("self", "inputs", "input", "tensor")
# The argument a collective writes its result into, where it has one.
INTO = ("output_tensor", "output", "tensor_list", "output_tensor_list", "output_tensor_lists")


def _collective(name: str, original, op: str = "", sent: tuple[str, ...] = SENT,
                via: str = ""):
    """A wrapper that records a collective as ``op`` (default ``name``). A functional
    collective returns at once with a tensor that waits for its data when first used:
    recorded as a call that ended there."""
    signature = inspect.signature(original)

    @_sealed(original)
    def wrapper(*args, **kwargs):
        if _depth():
            return original(*args, **kwargs)
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)
        tensors = next((given[key] for key in sent if key in given), None)
        into = next((given[key] for key in INTO if key in given), None)
        asynchronous = bool(given.get("async_op", False))
        # What it was handed is digested too: an all-reduce's partial sums, say, which
        # the grader can hold to what the algorithm must contribute.
        seq = _begin(op or name, tensors, None, blocking=not asynchronous, via=via, into=into,
                     carried=True)
        result = _inner(original, *args, **kwargs)
        if asynchronous and result is not None:
            return Request(result, [seq])
        emit({"e": "done", "seq": seq, "t": time.monotonic()})
        return result

    return wrapper


class _RecordedOperator:
    """A c10d operator, functional or not (the overload packet, or one overload of it),
    whose calls are recorded as the collective it is; everything else about it is the
    operator's."""

    def __init__(self, operator: object, op: str, via: str = OPERATOR_VIA):
        self._operator, self._op, self._via = operator, op, via

    def __call__(self, *args, **kwargs):
        if _depth():
            return self._operator(*args, **kwargs)
        tensor = args[0] if args else None
        if isinstance(tensor, (list, tuple)) and len(tensor) == 1:
            tensor = tensor[0]  # c10d's operators take a list of tensors
        peer = args[2] if self._op in POINT_TO_POINT and len(args) > 2 else None
        seq = _begin(self._op, tensor, peer if isinstance(peer, int) else None,
                     blocking=True, via=self._via, carried=self._op in SENDS)
        result = _inner(self._operator, *args, **kwargs)
        emit({"e": "done", "seq": seq, "t": time.monotonic()})
        return result

    def __getattr__(self, name: str):
        value = getattr(self._operator, name)
        return _RecordedOperator(value, self._op, self._via) if isinstance(
            value, torch._ops.OpOverload) else value


def _install_operators() -> None:
    for space in OPERATOR_SPACES:
        try:
            namespace = getattr(torch.ops, space)
        except (AttributeError, RuntimeError):
            continue
        for name, op in OPERATORS.items():
            try:
                operator = getattr(namespace, name)
            except (AttributeError, RuntimeError):  # not in this torch
                continue
            setattr(namespace, name, _RecordedOperator(operator, op))
    for name in c10d_operators():
        if name not in C10D_SILENT:
            setattr(torch.ops.c10d, name, _RecordedOperator(
                getattr(torch.ops.c10d, name), C10D.get(name, f"c10d.{name}"), C10D_VIA))


# Every collective and message of a process group is a c10d operator at the dispatcher,
# which the functions above call from C++. Called from Python, as torch.ops.c10d.<name>
# with a boxed group, they go past those functions: each is recorded as the function of
# torch.distributed it is, and one not listed (a newer torch's) under its own name, as
# c10d.<name> (deny by default). (c10d::check_for_nan moves nothing.)
C10D = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced",
    "allgather_": "all_gather", "_allgather_base_": "all_gather_into_tensor",
    "allgather_coalesced_": "all_gather_coalesced",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor", "broadcast_": "broadcast",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all_single", "barrier": "barrier",
    "monitored_barrier_": "monitored_barrier", "send": "send", "recv_": "recv",
    "recv_any_source_": "recv",
}
C10D_SILENT = frozenset({"check_for_nan"})
C10D_VIA = "torch.ops.c10d"


def c10d_operators() -> list[str]:
    """The names of the c10d operators registered in this torch."""
    return sorted(name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("c10d::"))


def _install_functional() -> None:
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:  # a torch without them: nothing to go around
        return
    for name in FUNCTIONAL:
        original = getattr(funcol, name, None)
        if callable(original):
            setattr(funcol, name, _collective(name, original, op=FUNCTIONAL[name],
                                              sent=SENT_FUNCTIONAL, via=FUNCTIONAL_VIA))


def _batch(original):
    @_sealed(original)
    def wrapper(p2p_op_list):
        if _depth():
            return original(p2p_op_list)
        seqs = []
        for op in p2p_op_list:
            name = getattr(op.op, "__name__", "isend")
            name = name if name in ("isend", "irecv") else "isend"
            seqs.append(_begin(name, op.tensor, op.peer, blocking=False,
                               via="batch_isend_irecv", carried=name == "isend"))
        works = _inner(original, p2p_op_list)
        if len(works) == len(seqs):
            return [Request(work, [seq]) for work, seq in zip(works, seqs, strict=True)]
        return [Request(work, seqs) for work in works]  # coalesced: one handle for all

    return wrapper


_watching = False


# Files: a rank that writes what it should keep in memory (activations, whole weights) or
# send (partial sums) to a file and reads it back hides it from the memory count and from
# its messages. So from the start of the check (``watch_files``) every file the candidate
# opens to read is looked at: one written since then is logged (``reread``), for the
# grader to fail. Python's own and the libraries' files are not the candidate's keeping.
_files_since: int | None = None  # st_mtime_ns from which a file counts as the check's
_reread: set[str] = set()
SYSTEM_FILES = (sys.prefix, sys.base_prefix, "/proc", "/sys", "/dev", "/usr", "/etc")


def watch_files(since_ns: int) -> None:
    """Log, while the candidate runs, each file it reads that was written after
    ``since_ns`` (an st_mtime_ns): once per file. Installed once a process: an audit hook
    cannot be removed."""
    global _files_since
    if _files_since is None:
        sys.addaudithook(_audit)
    _files_since = since_ns


def _audit(event: str, args: tuple) -> None:
    if event != "open" or not _watching or _depth() or _files_since is None:
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # a file descriptor: opened before, by a path seen then
    if isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR) and not (
            flags & os.O_RDWR):
        return  # written, not read
    if isinstance(mode, str) and not any(c in mode for c in "r+"):
        return
    name = os.fsdecode(path)
    try:
        written = os.stat(name).st_mtime_ns
    except OSError:
        return
    full = os.path.abspath(name)
    if written < _files_since or full in _reread or full.startswith(
            tuple(str(Path(p)) for p in (*SYSTEM_FILES, *NOT_LEARNER))):
        return
    _reread.add(full)
    emit({"e": "reread", "path": full, "at": _learners_line(), "t": time.monotonic()})


def watch(on: bool = True) -> None:
    """Record groups and stores built, and groups' methods called directly, from now on
    (``on``) or no longer: while the candidate runs, not while the harness joins the
    group or waits for the other ranks."""
    global _watching
    _watching = on


def _default_group() -> tuple[object, ...]:
    """The harness's process group, and its backend: called directly, still the library."""
    try:
        group = dist.distributed_c10d._world.default_pg
    except AttributeError:  # another torch keeps it elsewhere: every group is "own"
        return ()
    try:
        return group, group._get_backend(torch.device("cpu"))
    except (AttributeError, RuntimeError):
        return (group,)


def _around(op: str, original, tensors=lambda args, kwargs: None, whose=None):
    """A wrapper that records ``op`` when the candidate calls it, not from inside a
    recorded call (torch's own use) nor outside the candidate's run."""
    @_sealed(original)
    def wrapper(*args, **kwargs):
        if _depth() or not _watching:
            return original(*args, **kwargs)
        group = whose(args[0]) if whose is not None and args else OWN
        _begin(op, tensors(args, kwargs), None, blocking=False, group=group)
        return _inner(original, *args, **kwargs)

    return wrapper


def _method_tensors(args, kwargs):
    """The tensors handed to a group's method: its first argument after the group."""
    return args[1] if len(args) > 1 else None


def _whose(group: object) -> str:
    return HARNESS if any(group is mine for mine in _default_group()) else OWN


GROUP_CLASSES = (torch._C._distributed_c10d.ProcessGroup, torch._C._distributed_c10d.Backend)


def group_methods(cls: type) -> list[str]:
    """The methods of a process group class (or its backend's) that ``install`` records:
    every one it defines but the ``SILENT_METHODS``, the dunders and its nested types."""
    return [name for name, value in vars(cls).items() if not name.startswith("__")
            and name not in SILENT_METHODS and callable(value) and not inspect.isclass(value)]


def built_classes() -> list[str]:
    """The public classes of torch.distributed whose construction ``install`` records:
    every one but the ``SILENT_CLASSES`` (the ``BUILDERS``, and any a newer torch adds)."""
    return [name for name in public(dist) if inspect.isclass(getattr(dist, name))
            and name not in SILENT_CLASSES]


def _install_methods() -> None:
    """Wrap the methods of a process group and its backend (all but the silent ones), the
    constructors of groups, stores and any class not known to be silent, and a store's
    methods: ways around the module's functions that Python can still see."""
    c10d = dist.distributed_c10d
    for cls in GROUP_CLASSES:
        for name in group_methods(cls):
            setattr(cls, name, _around(f"{cls.__name__}.{name}", getattr(cls, name),
                                       _method_tensors, _whose))
    store = torch._C._distributed_c10d.Store
    for name in STORE_METHODS:
        if name in vars(store):
            setattr(store, name, _around(f"Store.{name}", getattr(store, name)))
    for name in built_classes():
        cls = getattr(dist, name)
        if "__init__" in vars(cls):
            cls.__init__ = _around(name, vars(cls)["__init__"])
    for name in INTERNALS:
        original = getattr(c10d, name, None)
        if original is not None:
            setattr(c10d, name, _around(name, original))


def public(module: object) -> list[str]:
    """The public callables of a module (torch.distributed's deprecated ``reduce_op``
    warns when looked at: it is no callable, and not looked at twice)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return [name for name in dir(module) if not name.startswith("_")
                and callable(getattr(module, name))]


def _wrap(name: str, original):
    if name == "batch_isend_irecv":
        return _batch(original)
    if name in POINT_TO_POINT:
        return _point_to_point(name, original)
    if name in GROUPS:
        return _around(name, original)
    return _collective(name, original)  # the collectives, and any function not classified


_installed = False


def recorded_functions() -> list[str]:
    """The public functions of torch.distributed that ``install`` records: every one but
    the ``SILENT`` (the classified ones, and any a newer torch adds)."""
    return [name for name in public(dist) if name not in SILENT
            and not inspect.isclass(getattr(dist, name))]


def install() -> None:
    """Wrap torch.distributed's functions in this process (idempotent): every public one
    but the ``SILENT``, under both names where it has two, ``torch.distributed.send`` and
    ``torch.distributed.distributed_c10d.send`` (torch's own helpers, ``P2POp`` and
    ``send``, look them up in the latter), or its own module's; and the ways around them
    (``_install_methods``), and the functional collectives DTensor uses
    (``_install_functional``)."""
    global _installed
    if _installed:
        return
    for name in dict.fromkeys([*POINT_TO_POINT, *COLLECTIVES, *GROUPS, "batch_isend_irecv",
                               *recorded_functions()]):
        original = getattr(dist, name, None) or getattr(dist.distributed_c10d, name, None)
        if original is None:  # an older torch without it
            continue
        wrapped = _wrap(name, original)
        home = sys.modules.get(getattr(original, "__module__", "") or "")
        for module in {dist, dist.distributed_c10d, home} - {None}:
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)
    _install_methods()
    _install_functional()
    _install_operators()
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
                        via=event.get("via", ""), started=event.get("t", 0.0),
                        digest=_digest(event.get("digest")), group=event.get("group", ""),
                        shape=_shapes(event.get("shape")), into=_shapes(event.get("into")),
                        node=_node_read(event.get("node")))
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
                    if by_seq[seq].peer is None and isinstance(event.get("peer"), int):
                        by_seq[seq].peer = event["peer"]
        elif kind == "dropped":
            for seq in event.get("seqs", ()):
                if seq in by_seq:
                    by_seq[seq].dropped = True
        elif kind == "returned":
            log.returned = True
        elif kind == "raised":
            log.raised = event
        elif kind == "failed":
            log.failed = event["text"]
        elif kind == "reread" and isinstance(event.get("path"), str):
            log.reread.append((event["path"], tuple(event["at"]) if event.get("at") else None))
        elif kind == "mark":
            log.marks.append(Mark(event["label"], event["calls"], event.get("data", {}),
                                  event.get("t", 0.0)))
    log.blocked_in = by_seq.get(open_seq) if open_seq is not None else None
    log.waiting_for = [by_seq[seq] for seq in waiting if seq in by_seq]
    log.last = log.calls[-1] if log.calls else None
    return log


def _shapes(value: object) -> list | None:
    """A shape, or a list of shapes, as the log holds it: lists of ints."""
    def one(shape: object) -> bool:
        return isinstance(shape, list) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in shape)
    if one(value) or (isinstance(value, list) and value and all(one(v) for v in value)):
        return value
    return None


def _node_read(value: object) -> tuple[str, int] | None:
    """An autograd node as the log holds it: [name, sequence number]."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and \
            isinstance(value[1], int) and not isinstance(value[1], bool):
        return (value[0], value[1])
    return None


def _digest(value: object) -> tuple[float, float, float] | None:
    """A digest as the log holds it, if it is three numbers."""
    if isinstance(value, list) and len(value) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return (float(value[0]), float(value[1]), float(value[2]))
    return None
