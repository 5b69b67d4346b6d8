"""Lab 05 — top-K. The k largest entries of each row and their column indices, descending,
as ``torch.topk`` returns them. Memory-bound: the floor is the input read once and the k
results written once; graded against ``torch.topk`` on the same inputs.

The answer is compared exactly, not within a tolerance: selection computes nothing, it
copies. Values must equal ``torch.topk``'s (NaN-aware; for ±0 either zero may come back,
as from ``torch.topk`` itself), and each index must be a distinct, in-range position that
holds its value. Any order of equal values is accepted. ``torch.topk`` ranks every NaN
above +inf, whatever its sign bit: the cases hold NaNs made the way arithmetic makes them
(0 · inf, which sets the sign bit on a CPU) and with the sign bit set on purpose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..device import interpreter_enabled
from ..evidence import grader_calls, guard, poison
from ..evidence.live_memory import live
from ..evidence.recording import TRIVIAL_OPS, paused
from ..model.trace import tracing
from ..problem import (
    Case,
    Cost,
    Draw,
    Hidden,
    Levels,
    Problem,
    Span,
    dtype_name,
    random_tensor,
    register,
)
from . import traced

ROWS_SIGNATURE = ("(x: Tensor[m, n], k: int) -> (values: Tensor[m, k], indices: "
                  "Tensor[m, k] int64)  # as torch.topk(x, k)")
STREAM_SIGNATURE = ("StreamingTopK(k: int, offset: int = 0) with .update(chunk: Tensor[c]), "
                    ".merge(other), .result() -> (values: Tensor[k], indices: Tensor[k] "
                    "int64): the top k of the whole stream; an index is a position in the "
                    "stream plus offset")

# What the rows of a case hold (a case's note names it; plain random scores otherwise).
SPECIAL = "NaN (from 0 * inf, and with the sign bit set), +inf, -inf, +0 and -0"
EQUAL = "rows of equal values"
DUPLICATES = "heavy duplicates: four distinct values"
SORTED = "sorted rows, ascending and descending"
NARROW = "a narrow range: every value in [1, 1.001)"
NEGATIVE = "every value negative"
TRAFFIC = "many rows, traced for traffic"
FEW_ROWS = "few long rows"
SHARDS = "shards of the stream on several GPUs, merged"
SHORT_CHUNKS = "chunks shorter than k"
MEMORY = "the process's memory measured before the stream and after its updates"
PAST_32_BITS = "positions past 2**32: the stream starts at offset 2**32 + 7"

# Already library calls under the engine's rule (host code may only allocate, view, fill,
# copy and cast); named so that the problems say what they forbid.
TOPK_OPS = frozenset({"topk", "sort", "argsort", "kthvalue", "msort", "median", "mode"})


# --- inputs -----------------------------------------------------------------------------


def _nan_with_sign(device: torch.device) -> torch.Tensor:
    """A NaN with its sign bit set, made by the bits (0 * inf makes one on x86 CPUs; a
    GPU's arithmetic makes the positive NaN)."""
    return torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32).to(device)


def _scores(case: Case, shape: tuple[int, ...], gen: torch.Generator,
            device: torch.device) -> torch.Tensor:
    """Scores of the case's kind, in fp32 (cast to the case's dtype by the caller)."""
    n = shape[-1]
    rand = lambda: torch.rand(shape, generator=gen, device=device)  # noqa: E731
    if case.note == EQUAL:
        return torch.full(shape, 0.75, device=device)
    if case.note == DUPLICATES:
        return torch.randint(-1, 3, shape, generator=gen, device=device).float() * 0.5
    if case.note == NARROW:
        return 1 + rand() * 1e-3
    if case.note == NEGATIVE:
        return -rand() * 10 - 1e-3
    x = random_tensor(shape, torch.float32, gen, device, case.scale)
    if case.note == SORTED:
        x = x.sort(dim=-1).values
        if x.dim() == 2:
            x[1::2] = x[1::2].flip(-1)  # odd rows descending
    elif case.note == SPECIAL:
        picks = torch.rand(shape, generator=gen, device=device)
        zero = torch.zeros((), device=device)
        x = torch.where(picks < 0.04, zero, x)
        x = torch.where((picks >= 0.04) & (picks < 0.08), -zero, x)
        x = torch.where((picks >= 0.08) & (picks < 0.10), float("-inf"), x)
        x = torch.where((picks >= 0.10) & (picks < 0.102), float("inf"), x)
        arithmetic = zero * float("inf")  # NaN as 0 * inf makes it
        x = torch.where((picks >= 0.102) & (picks < 0.104), arithmetic, x)
        x = torch.where((picks >= 0.104) & (picks < 0.106), _nan_with_sign(device), x)
        flat = x.view(-1, n)  # and a few NaNs in every row, whatever the draw
        flat[:, n // 3] = arithmetic
        flat[:, n // 2] = _nan_with_sign(device)
        flat[:, -1] = float("nan")
    return x


def _rows_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    m, n, k = case.sizes["m"], case.sizes["n"], case.sizes["k"]
    if "x" in case.transposed:  # a strided view: rows 1 apart in memory, columns m apart
        return _scores(case, (n, m), gen, device).to(case.dtype).T, k
    return _scores(case, (m, n), gen, device).to(case.dtype), k


def _stream_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    """The stream, k, the chunk length, the number of shards, where the stream starts
    (its first position), whether to measure the memory the objects hold, and whether
    this is the timed case (where the grader does nothing but feed the chunks: no
    measurement, which takes a second of host work, no check of the chunks after)."""
    n = case.sizes["n"]
    x = _scores(case, (n,), gen, device).to(case.dtype)
    return (x, case.sizes["k"], case.sizes["chunk"], case.sizes.get("devices", 1),
            case.sizes.get("offset", 0), case.note == MEMORY and not case.timed, case.timed)


def _rows_cost(case: Case) -> Cost:
    m, n, k = case.sizes["m"], case.sizes["n"], case.sizes["k"]
    s = case.dtype.itemsize
    return Cost(flops=0, bytes=m * n * s + m * k * (s + 8))  # x once; values and indices


def _stream_cost(case: Case) -> Cost:
    n, k = case.sizes["n"], case.sizes["k"]
    s = case.dtype.itemsize
    return Cost(flops=0, bytes=n * s + k * (s + 8))  # every chunk once; the top k once


# --- the right answer -------------------------------------------------------------------


@dataclass
class Reference:
    x: torch.Tensor  # float64, [m, n] (a stream: one row)
    k: int
    values: torch.Tensor  # float64, [m, k]: torch.topk's values, NaN first
    chunk: int = 0  # a stream's chunk length, and its shard length on each device
    shard: int = 0
    offset: int = 0  # a stream's first position


def expected_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """The top k values of each row of ``x`` in descending order, every NaN first (as
    torch.topk ranks them, whatever their sign bit): made without relying on it."""
    nan = x.isnan()
    top = torch.where(nan, float("inf"), x).topk(k, dim=-1).values
    first = torch.arange(k, device=x.device) < nan.sum(dim=-1, keepdim=True)
    return torch.where(first, float("nan"), top)


def _rows_reference(x: torch.Tensor, k: int) -> Reference:
    return Reference(x, k, expected_values(x, k))


def _stream_reference(x: torch.Tensor, k: int, chunk: int, devices: int, offset: int,
                      *flags: bool) -> Reference:
    shard = -(-x.numel() // devices)
    return Reference(x[None], k, expected_values(x[None], k), chunk, shard, offset)


class _LibraryCalls(TorchDispatchMode):
    """The library ops the candidate called while this mode was on: every aten op that
    is not host work (``TRIVIAL_OPS``), as the engine counts them. ``set_`` is left out:
    Triton's interpreter calls it to move a launch's arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        # This mode's frame sits between an op and a launch: the recorder must know it
        # for the grader's (else it takes Triton's own ops in a launch for the learner's).
        grader_calls.refresh()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = func.overloadpacket.__name__
        if name not in TRIVIAL_OPS and name != "set_":
            self.names.add(name)
        return func(*args, **(kwargs or {}))


def _call(candidate: Callable, inputs: tuple) -> tuple:
    """The candidate's answer, with the dtype of the input it answered (the answer is
    compared in float64 against float64 inputs: the dtype is checked on its name), and
    notes on the run: the library ops it called, so that the trace check does not blame
    its kernels for an answer the library made."""
    x, k = inputs
    calls = _LibraryCalls()
    with calls:
        answer = candidate(x, k)
    return answer, dtype_name(x.dtype), {"library": sorted(calls.names)}


# --- feeding a stream, and the memory it holds ------------------------------------------

# What the objects may hold between updates: 64 bytes per kept result (values, indices and
# room for scratch), and 4 KiB, each.
def memory_bound(k: int) -> int:
    return 64 * max(2, 1 << (k - 1).bit_length()) + 4096


def _shards(n: int, chunk: int, devices: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """Each shard's first position and its chunks, (start, end) in the stream."""
    shard = -(-n // devices)
    return [(start, [(first, min(first + chunk, start + shard, n))
                     for first in range(start, min(n, start + shard), chunk)])
            for start in range(0, n, shard)]


def _fresh(scores: torch.Tensor, recorded: bool) -> guard.Guarded:
    """A chunk as a producer hands it over: in memory of its own (not a view of the
    stream, whose storage would show what is still to come), between poisoned margins.
    In the graded run the copy is recorded with the candidate's steps (a host copy, which
    the rule allows), so that a replay on new inputs (``evidence/replay.py``) copies the
    new scores into the chunks again."""
    with paused():
        piece = guard.empty(tuple(scores.shape), scores.dtype, scores.device, name="a chunk")
    with contextlib.nullcontext() if recorded else paused():
        piece.view.copy_(scores)
    return piece


def _intact(x: torch.Tensor, pieces: list[tuple[int, int, guard.Guarded]]) -> str:
    """"" if the candidate left every chunk (first, end, its memory) as it was given."""
    as_bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    with paused():
        for first, end, piece in pieces:
            if piece.margins_hit() or not torch.equal(piece.view.view(as_bits),
                                                      x[first:end].view(as_bits)):
                return (f"wrote into the chunk of positions {first} to {end - 1}, or past "
                        "its end: a chunk is read-only, and may be reused by the producer "
                        "as soon as update returns")
    return ""


@contextlib.contextmanager
def _watched(calls: _LibraryCalls | None) -> Iterator[None]:
    if calls is None:
        yield
        return
    with calls:
        yield


def _updated(candidate: Callable, inputs: tuple, calls: _LibraryCalls | None,
             kept: list[tuple[int, int, guard.Guarded]] | None) -> list:
    """The stream objects after every chunk of their shard, each chunk a fresh tensor,
    kept in ``kept`` with its place in the stream if given (so that no two chunks share
    an address), else dropped once its update returns. With ``calls`` this is the graded
    run (recorded, its library calls watched); without, the measuring run."""
    x, k, chunk, devices, offset = inputs[:5]
    streams = []
    for start, pieces in _shards(x.numel(), chunk, devices):
        with _watched(calls):
            stream = candidate(k) if devices == 1 and not offset else \
                candidate(k, offset + start)
        for first, end in pieces:
            piece = _fresh(x[first:end], recorded=calls is not None)
            with _watched(calls):
                stream.update(piece.view)
            if kept is not None:
                kept.append((first, end, piece))
        streams.append(stream)
    return streams


def _merged(streams: list, calls: _LibraryCalls | None) -> object:
    """The top k of every shard: the first stream, each other merged into it."""
    with _watched(calls):
        for other in streams[1:]:
            streams[0].merge(other)
    return streams[0]


@contextlib.contextmanager
def _traced_apart() -> Iterator[None]:
    """Launches that are not the case's own (the measuring run): traced, so that the
    interpreter still refuses an access outside every argument, but apart, so that the
    case's trace and its traffic are the graded run's alone."""
    if not interpreter_enabled():
        yield
        return
    with tracing():
        yield


def _live_bytes(device: torch.device) -> tuple[int, int]:
    """Bytes of every tensor and buffer alive in the process, on the host and on
    ``device`` (a stream on a GPU can keep its chunks on the host: numpy, bytes), and the
    count of objects frozen out of sight."""
    host = live("cpu")
    held = host.bytes + (live(device).bytes if device.type != "cpu" else 0)
    return held, host.frozen


def held_bytes(candidate: Callable, inputs: tuple) -> tuple[int, str]:
    """Run the stream again, apart (not recorded, not part of the case's trace), on fresh
    chunks that nothing of the grader's keeps once their update returns, and count the
    process's live memory before the first object exists and after the last update:
    whatever grew is what the objects keep, wherever they keep it (an attribute, a
    deque, a module-level dict, pickled bytes, numpy). Returns those bytes, and "" or
    what is wrong with the answer of this run (a stream that keeps less only when it is
    measured must still be right)."""
    x, k, chunk, devices, offset = inputs[:5]
    with paused():
        before, frozen_before = _live_bytes(x.device)
        with _traced_apart():
            streams = _updated(candidate, inputs, None, None)
        after, frozen = _live_bytes(x.device)
        if frozen > frozen_before:  # gc.freeze(): what it keeps there cannot be counted
            return after - before, (f"it froze {frozen - frozen_before:,} objects out of the "
                                    "garbage collector's sight (gc.freeze), where no one can "
                                    "count what they hold")
        with _traced_apart():
            answer = _merged(streams, None).result()
        reference = _stream_reference(x.double(), k, chunk, devices, offset)
        return after - before, _check_answer(answer, dtype_name(x.dtype), reference, False,
                                             True)


def _run_stream(candidate: Callable, inputs: tuple) -> tuple:
    """Feed the stream to the candidate's class in chunks, on ``devices`` shards, merge
    the shards, and return its result with notes on the run: the library ops it called,
    whether it wrote into its chunks (not on the timed case), where each chunk was (the
    trace says whether kernels read it), and on a measured case the memory the objects
    held after their updates, and what was wrong, if anything, with the answer of that
    second run."""
    x, k, chunk, devices, offset, measured, timed = inputs
    calls, kept = _LibraryCalls(), []
    streams = _updated(candidate, inputs, calls, kept)
    first = _merged(streams, calls)
    with _watched(calls):
        answer = first.result()
    notes: dict = {"library": sorted(calls.names), "error": "" if timed else _intact(x, kept),
                   "chunks": [(p.view.data_ptr(), p.view.nbytes) for _, _, p in kept]}
    del streams, first, kept
    if measured:
        held, again = held_bytes(candidate, inputs)
        notes.update({"held": held, "allowed": devices * memory_bound(k), "objects": devices,
                      "chunk_bytes": chunk * x.element_size(), "again": again})
    return answer, dtype_name(x.dtype), notes


# --- comparing answers, and naming the classic bugs -------------------------------------


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Equal values, NaN equal to NaN (and, as floats, -0 equal to +0)."""
    return (a == b) | (a.isnan() & b.isnan())


def _fmt(t: torch.Tensor, count: int = 6) -> str:
    items = [f"{v:.6g}" for v in t.flatten()[:count].tolist()]
    return "[" + ", ".join(items) + (", …]" if t.numel() > count else "]")


def compare_for(radix: bool = False, stream: bool = False) -> Callable[[object, object], str]:
    """The comparison of a top-k answer with the reference: "" if right, else what is
    wrong, and the likely cause where the evidence shows one. The output is (answer,
    dtype name, notes on the run): see ``_call`` and ``_run_stream``."""

    def compare(output: object, reference: Reference) -> str:
        if not (isinstance(output, (tuple, list)) and len(output) == 3):
            return f"returned {type(output).__name__}: expected the answer, its dtype, notes"
        answer, dtype, notes = output
        notes = notes if isinstance(notes, dict) else {}
        if notes.get("error"):
            return str(notes["error"])
        wrong = _check_answer(answer, dtype, reference, radix, stream)
        if wrong or not stream:
            return wrong
        again = notes.get("again")
        return _memory_cause(notes, reference.k) or (
            f"run again on the same chunks (to measure its memory): {again}" if again else "")

    return compare


def _check_answer(answer: object, dtype: str, reference: Reference, radix: bool,
                  stream: bool) -> str:
    """Is ``answer`` (values, indices) the top k, as torch.topk gives it?"""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2
            and all(isinstance(t, torch.Tensor) for t in answer)):
        what = type(answer).__name__
        return (f"returned {what}, expected a pair of tensors (values, indices), as "
                "torch.topk returns them")
    values, indices = answer
    x, k = reference.x, reference.k
    m, n = x.shape
    shape = (k,) if stream else (m, k)
    for name, t, want in (("values", values, dtype), ("indices", indices, "int64")):
        if tuple(t.shape) != shape:
            return f"{name}: shape {tuple(t.shape)}, expected {shape}"
        if dtype_name(t.dtype) != want:
            return f"{name}: dtype {dtype_name(t.dtype)}, expected {want}"
        if t.device.type != x.device.type:
            return f"{name}: on device {t.device}, expected {x.device}"
        unwritten = poison.unwritten_mask(t)
        if bool(unwritten.any()):
            return (f"{name}: {int(unwritten.sum())} of {t.numel()} elements were never "
                    "written (they hold the poison that fills fresh memory during a "
                    "check): a missing row, or slots past the first k?")
    values, indices = values.reshape(m, k), indices.reshape(m, k).to(x.device)
    wrapped = _wrapped_positions(values, indices, reference)
    if wrapped:
        return wrapped
    return _check_rows(values, indices - reference.offset, reference, radix, stream)


def _memory_cause(notes: dict, k: int) -> str:
    """What a measured stream held after its updates, if more than its bound."""
    held, allowed = notes.get("held"), notes.get("allowed")
    if not isinstance(held, int) or not isinstance(allowed, int) or held <= allowed:
        return ""
    objects, chunk_bytes = notes.get("objects", 1), notes.get("chunk_bytes", 0)
    each = f"{objects} objects, each with " if objects != 1 else ""
    chunks = f", as much as {held / chunk_bytes:.1f} chunks" if chunk_bytes else ""
    return (f"the stream objects keep {held:,} bytes alive after their updates{chunks}, "
            f"more than the {allowed:,} allowed ({each}64 bytes per kept result and 4 KiB): "
            "counted over the whole process, so chunks kept anywhere count (an attribute, a "
            "deque, a module-level dict, pickled bytes, a numpy copy, a view, which keeps the "
            "whole storage it looks into). Keep the top k so far and nothing else")


def _wrapped_positions(values: torch.Tensor, indices: torch.Tensor, ref: Reference) -> str:
    """Where the stream starts past 2**32: indices that are not positions in the stream
    but, modulo 2**32, are the positions of their values (positions cut to 32 bits).
    (The cases' streams do not cross a multiple of 2**32.)"""
    n = ref.x.shape[1]
    if ref.offset + n <= 1 << 32:
        return ""
    local = indices - ref.offset
    outside = (local < 0) | (local >= n)
    if not bool(outside.any()):
        return ""
    restored = indices % (1 << 32) + (ref.offset >> 32 << 32) - ref.offset
    fits = (restored >= 0) & (restored < n)
    if not bool(fits[outside].all()):
        return ""
    there = ref.x.gather(1, restored.clamp(0, n - 1))
    if not bool(_same(there, values.double())[outside].all()):
        return ""
    r, j = (int(i) for i in outside.nonzero()[0])
    return (f"index {int(indices[r, j]):,} at position {j} is the position of a top score "
            f"modulo 2**32 ({int(restored[r, j]) + ref.offset:,} is): the stream starts at "
            f"{ref.offset:,}, and its positions lost their bits above 32 (packed into 32 "
            "bits beside a key, or held in an int32). Sort words that carry a slot, and "
            "fetch each winner's int64 position by its slot")


def _check_rows(values: torch.Tensor, indices: torch.Tensor, ref: Reference, radix: bool,
                stream: bool) -> str:
    x, k, want = ref.x, ref.k, ref.values
    m, n = x.shape
    got = values.double()
    where = (lambda r, j: f"at position {j}") if stream else \
        (lambda r, j: f"row {r}, position {j}")  # noqa: E731
    unfilled = lambda holes: (  # noqa: E731
        f": a slot no element filled. Fewer than k elements came through, {k - holes} of "
        f"the k = {k}" + (f". {THRESHOLD_MISSING}" if radix else ""))
    outside = (indices < 0) | (indices >= n)
    if bool(outside.any()):
        r, j = (int(i) for i in outside.nonzero()[0])
        index = int(indices[r, j])
        if stream:
            start = f"offset {ref.offset:,}" if ref.offset else "0"
            return (f"index {index + ref.offset:,} {where(r, j)} is outside the stream of "
                    f"{n:,} scores: an index is a position in the stream, from {start}")
        if n <= index < n + (1 << 17):  # within a block or so of the end
            return (f"index {index} {where(r, j)} is past the end of the row (n = {n}): "
                    "lanes beyond the last element took part. Mask the last block, and give "
                    "its idle lanes a word below every element")
        return (f"index {index} {where(r, j)} is far outside the row (n = {n})"
                f"{unfilled(int(outside[r].sum()))}")
    empty = got.isnan() & ~x.isnan().any(dim=-1, keepdim=True)
    if bool(empty.any()):
        r, j = (int(i) for i in empty.nonzero()[0])
        return (f"NaN {where(r, j)}, where the scores hold no NaN"
                f"{unfilled(int(empty[r].sum()))}")
    picked = x.gather(1, indices)
    mismatch = ~_same(picked, got)
    if stream and bool(mismatch.any()):
        # Positions counted from a chunk or a shard also collide with each other: name
        # that cause before the repeated index it produces.
        r, j = (int(i) for i in mismatch.nonzero()[0])
        if _looks_local(x[r], got[r, j], int(indices[r, j]), ref):
            return LOCAL_POSITIONS
    ordered = indices.sort(dim=-1).values
    twice = ordered[:, 1:] == ordered[:, :-1]
    if bool(twice.any()):
        r, j = (int(i) for i in twice.nonzero()[0])
        return _repeated_index(got[r], indices[r], x[r], want[r], int(ordered[r, j]),
                               "" if stream else f" in row {r}", radix)
    if bool(mismatch.any()):
        r, j = (int(i) for i in mismatch.nonzero()[0])
        if bool((picked[mismatch] < 0).all()):
            return (f"values[{where(r, j)}] = {got[r, j].item():.6g}, but the index beside it "
                    f"holds {picked[r, j].item():.6g}: only negative scores come back wrong, so "
                    f"their keys are. {NEGATIVE_KEY}")
        return (f"values[{where(r, j)}] = {got[r, j].item():.6g}, but the index beside it, "
                f"{int(indices[r, j])}, holds {picked[r, j].item():.6g}: the values and the "
                "indices were sorted or stored apart")
    as_sorted = expected_values(got, k)  # the answer's own values, in torch.topk's order
    right_set = _same(as_sorted, want).all(dim=-1)
    if bool(right_set.all()):
        if bool(_same(got, want).all()):
            return ""
        r = int((~_same(got, want).all(dim=-1)).nonzero()[0])
        return (f"the right elements{'' if stream else f' in row {r}'}, but not in descending "
                f"order: {_fmt(got[r])}")
    r = int((~right_set).nonzero()[0])
    return _wrong_set(x[r], got[r], want[r], r, stream)


def _repeated_index(got: torch.Tensor, indices: torch.Tensor, x: torch.Tensor,
                    want: torch.Tensor, index: int, row: str, radix: bool) -> str:
    """An index that comes back more than once in a row (``got`` and ``indices`` the
    answer's, ``x`` the scores, ``want`` the right values): one element in two places
    (its position lost), or places that no element filled."""
    holes = _unfilled(got, indices, x, want, index)
    if not bool(holes.any()):
        return (f"index {index} comes back twice{row}: one element took two of the k places. "
                "Equal values are distinct elements: carry each element's own position with "
                "its key (one packed word), rather than finding a value's position again")
    return _unfilled_places(got, holes, x[index], want, index, row, radix)


def _unfilled(got: torch.Tensor, indices: torch.Tensor, x: torch.Tensor, want: torch.Tensor,
              index: int) -> torch.Tensor:
    """The places of a row that no element filled, if the evidence shows them: places
    that all read ``index`` and one same value, which is not the score there, and either
    not one of the right values, or what an empty slot reads as (the packed word 0: key 0,
    a NaN with its sign bit set, at index 0). Right values with a repeated index and no
    such mark are elements whose positions were lost: no places are returned then."""
    holes = (indices == index) & ~_same(got, x[index].expand_as(got))
    none = torch.zeros_like(holes)
    if not bool(holes.any()):
        return none
    value = got[holes][0]
    if not bool(_same(got[holes], value.expand(int(holes.sum()))).all()):
        return none  # different values: elements, not empty places
    right_values = bool(_same(expected_values(got[None], got.numel())[0], want).all())
    return holes if _empty_word(value, index) or not right_values else none


def _empty_word(value: torch.Tensor, index: int) -> bool:
    """Is (value, index) what the packed word 0, an empty slot, reads as: key 0 is a NaN
    with its sign bit set (every NaN of the scores reads back with it clear), at 0?"""
    return index == 0 and bool(value.isnan()) and bool(value.signbit())


def _unfilled_places(got: torch.Tensor, holes: torch.Tensor, score: torch.Tensor,
                     want: torch.Tensor, index: int, row: str, radix: bool) -> str:
    """Places of the answer that no element filled (``holes``, all alike): how many of
    the k were filled, and which elements are missing where the rest are right."""
    k, empty = got.numel(), int(holes.sum())
    filled = k - empty
    value = got[holes][0]
    head = (f"only {filled} of the k = {k} places{row} hold an element: " if filled else
            f"none of the k = {k} places{row} holds an element: ")
    head += (f"{'the other ' if filled else 'all '}{empty} read index {index} with value "
             f"{value.item():.6g}, but the score at index {index} is {score.item():.6g}. "
             "They are places no element filled" + (
                 " (an empty slot, the packed word 0, reads this way)"
                 if _empty_word(value, index) else "") + ": fewer than k elements were selected")
    kept = expected_values(got[~holes][None], filled)[0]
    if filled and not bool(_same(kept, want[:filled]).all()):
        return head
    if filled:
        head += (f". The {filled} that came are the {filled} largest, so the missing ones are "
                 "the lowest of the top k: the elements at the threshold")
    return f"{head}. {THRESHOLD_MISSING}" if radix else head


THRESHOLD_MISSING = ("Elements of the threshold bucket are missing: either the bucket "
                     "chosen is one above the right one (it is the bucket where the count "
                     "from the top first reaches k) or its own elements were not kept (keep "
                     "every element at or above it, >=, the bucket's own elements included)")
LOCAL_POSITIONS = ("values and indices disagree: the indices look like positions in a "
                   "chunk or a shard. An index is a position in the whole stream: add where "
                   "the chunk starts (and the shard's offset)")
NEGATIVE_KEY = ("The bits of a negative float grow as its value falls (-2.0 is 0xC0000000, "
                "-1.0 is 0xBF800000): flip all the bits of a negative float, and only the "
                "sign bit of a positive one")


def _looks_local(row: torch.Tensor, value: torch.Tensor, index: int, ref: Reference) -> bool:
    """Is ``value`` in the stream at ``index`` plus the start of some chunk within a shard
    plus the start of some shard: a position counted from a chunk or a shard?"""
    for position in torch.nonzero(_same(row, value)).flatten().tolist():
        gap = position - index
        if gap > 0 and ref.chunk and gap % ref.shard % ref.chunk == 0:
            return True
    return False


def _wrong_set(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor, r: int,
               stream: bool) -> str:
    """The values are not the top k of the row: say which are missing, and why if the
    evidence shows it."""
    row = "" if stream else f" of row {r}"
    head = f"not the top k{row}: got {_fmt(got)}, expected {_fmt(want)}"
    nan_want, nan_got = int(want.isnan().sum()), int(got.isnan().sum())
    if nan_got < nan_want:
        return (f"{head}. NaN ranks above every number in torch.topk, whatever its sign bit, "
                f"and {nan_want} of the top k are NaN here ({nan_got} came back). A NaN "
                "with its sign bit set (0 * inf makes one) looks like the most negative "
                "number to the bit trick: give every NaN the largest key")
    kth = want[~want.isnan()].min() if bool((~want.isnan()).any()) else None
    extra = got[~torch.isin(got, want) & ~got.isnan()]
    if kth is not None and extra.numel() and bool((extra < 0).all()) and \
            bool((extra < kth).all()):
        return (f"{head}. The extra values are negative and below the k-th largest: negative "
                f"floats are ranked upside down. {NEGATIVE_KEY}")
    return head


# --- what the trace shows ---------------------------------------------------------------


def _answer_tensors(output: object) -> list[torch.Tensor]:
    answer = output[0] if isinstance(output, (tuple, list)) and output else ()
    return [t for t in answer if isinstance(t, torch.Tensor)] \
        if isinstance(answer, (tuple, list)) else []


def _notes(output: object) -> dict:
    notes = output[2] if isinstance(output, (tuple, list)) and len(output) == 3 else {}
    return notes if isinstance(notes, dict) else {}


def _loads_within(launches: list, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Bytes the launches loaded from each (address, bytes) range (ranges that do not
    overlap), active lanes only."""
    order = np.argsort([start for start, _ in ranges])
    starts = np.array([ranges[i][0] for i in order], dtype=np.uint64)
    ends = starts + np.array([ranges[i][1] for i in order], dtype=np.uint64)
    loaded = np.zeros(len(ranges), dtype=np.int64)
    for launch in launches:
        for access in launch.accesses:
            if access.kind != "load":
                continue
            addresses = access.addresses[access.active]
            slot = np.searchsorted(starts, addresses, side="right") - 1
            inside = slot >= 0
            inside[inside] &= addresses[inside] < ends[slot[inside]]
            np.add.at(loaded, slot[inside], access.element_size)
    return loaded[np.argsort(order)]


def _kernels_did_the_work(launches: list, output: object, unread: bool) -> str:
    """The kernels read every score (``unread``: they did not) and wrote every result
    (not the host, not a copy). Where the candidate called the library, that is the
    cause, not its kernels."""
    unstored = [name for name, t in zip(("values", "indices"), _answer_tensors(output),
                                        strict=False)
                if traced.bytes_moved(launches, t, "store") < t.numel() * t.element_size()]
    if not unread and not unstored:
        return ""
    library = [str(op) for op in _notes(output).get("library", ())]
    if library:
        ops = ", ".join(f"aten.{op}" for op in library)
        what = "the scores" if unread else f"the {unstored[0]} returned"
        return (f"calls the library ({ops}) for work its kernels should do: no kernel "
                f"{'read' if unread else 'stored'} {what}")
    if unread:
        return ("the kernels did not read every score: each element of x must be read by a "
                "kernel (host code may only allocate, view, fill and copy)")
    return (f"{unstored[0]} were not written by a kernel: the answer must come out of the "
            "kernels' own stores, not a copy made on the host")


def _rows_read(x: torch.Tensor, launches: list) -> bool:
    return traced.bytes_moved(launches, x, "load") >= x.numel() * x.element_size()


def rows_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    return _kernels_did_the_work(launches, output, not _rows_read(inputs[0], launches))


def radix_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """topk/radix, from the trace, on long rows of random scores: no scratch as large as
    the input (a sort moves the whole row, several times) and a buffer of O(k) words a row;
    x read twice when rows are many (a histogram, then a filter); few rows split over
    several programs. (On narrow ranges and duplicates radix filtering degrades by nature:
    there only the answer is graded.)"""
    x, k = inputs
    done = _kernels_did_the_work(launches, output, not _rows_read(x, launches))
    if done or case.note not in (TRAFFIC, FEW_ROWS):
        return done
    m, n = x.shape
    k_pad = max(2, 1 << (k - 1).bit_length())
    x_bytes = m * n * x.element_size()
    results = [t for t in _answer_tensors(output)]
    stored = sum(int(access.active.sum()) * access.element_size for launch in launches
                 for access in launch.accesses if access.kind == "store") - sum(
        traced.bytes_moved(launches, t, "store") for t in results)
    allowed = x_bytes // 2 + 16 * k_pad * m
    if stored > allowed:
        return (f"writes {stored:,} bytes of scratch, {stored / x_bytes:.1f}× the size of x: "
                "a sort, or a copy of the row. Radix select keeps only candidates: the few "
                "elements at or above the threshold bucket")
    scratch = _scratch_bytes(launches, [x, *results])
    if scratch > x_bytes // 8 + m * (128 * k_pad + 8192):
        return (f"allocates {scratch:,} bytes of scratch, {scratch / x_bytes:.2f}× the size "
                "of x: a histogram and a buffer of candidates per row are all it needs, a "
                "buffer of a few k words (or a few % of a row) at most")
    loaded = traced.bytes_moved(launches, x, "load")
    if case.note == TRAFFIC and loaded > 2 * x_bytes:
        return (f"reads x {loaded / x_bytes:.1f} times on random scores: one histogram of the "
                "top byte should leave few enough candidates for one more read to collect "
                "them (a pass per byte of the key reads it four times or more)")
    if case.note == FEW_ROWS:
        readers = _programs_reading_row(launches, x)
        if readers < 4:
            return (f"each row of x is read by {readers} program: with {m} rows, only {m} "
                    "of a GPU's 132 multiprocessors would work. Split each row over several "
                    "programs (a chunk each), and add their histograms")
    return ""


def _scratch_bytes(launches: list, known: list[torch.Tensor]) -> int:
    """Bytes of the tensor arguments of the launches that are not ``known`` (x and the
    answer): the kernels' scratch, each counted once."""
    bases = {t.data_ptr() for t in known}
    seen: dict[int, int] = {}
    for launch in launches:
        for arg in launch.tensors:
            if arg.base not in bases:
                seen[arg.base] = max(seen.get(arg.base, 0), arg.extent)
    return sum(seen.values())


def _programs_reading_row(launches: list, x: torch.Tensor) -> int:
    """How many programs of the first launch that reads x read from its row 0."""
    start = x.data_ptr()
    end = start + (x.shape[1] - 1) * x.stride(1) * x.element_size() + x.element_size()
    row_0 = (start, end) if x.stride(1) == 1 else (start, start)  # contiguous rows only
    for launch in launches:
        readers = set()
        for access in launch.accesses:
            if access.kind != "load":
                continue
            inside = (access.addresses >= row_0[0]) & (access.addresses < row_0[1]) \
                & access.active
            if inside.any():
                readers.add(access.program)
        if readers:
            return len(readers)
    return 0


def stream_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """Every chunk read by a kernel while it was alive (each chunk is fresh memory, kept
    until the stream ends, so the trace tells the chunks apart), every result stored by
    one."""
    chunks = [(int(a), int(b)) for a, b in _notes(output).get("chunks", ())]
    unread = not chunks or bool((_loads_within(launches, chunks) <
                                 np.array([b for _, b in chunks])).any())
    return _kernels_did_the_work(launches, output, unread)


# --- the problems -----------------------------------------------------------------------

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _rows_case(m: int, n: int, k: int, dtype: torch.dtype = F32, **fields) -> Case:
    return Case({"m": m, "n": n, "k": k}, dtype, **fields)


def _torch_topk(x: torch.Tensor, k: int) -> tuple:
    return torch.topk(x, k)


register(Problem(
    id="topk/rows", title="Top-k, one program per row: a running top k in registers",
    signature=ROWS_SIGNATURE, make_inputs=_rows_inputs, reference=_rows_reference,
    cost=_rows_cost, invoke=_call, compare=compare_for(), trace_check=rows_structure,
    library_ops=TOPK_OPS, solution="rooflab.kernels.topk:topk_rows",
    cpu_cases=[
        _rows_case(5, 1000, 10, note="ragged rows"),
        _rows_case(3, 5000, 37, F16, note="k not a power of two"),
        _rows_case(4, 3000, 1, note="k = 1"),
        _rows_case(3, 300, 300, note="k = n"),
        _rows_case(6, 7, 3, note="rows shorter than a block"),
        _rows_case(4, 2000, 16, transposed=("x",), note="strided rows"),
        _rows_case(4, 2000, 20, note=SPECIAL),
        _rows_case(3, 1500, 40, note=EQUAL),
        _rows_case(3, 3000, 100, note=DUPLICATES),
        _rows_case(4, 2500, 64, note=SORTED),
        _rows_case(3, 2000, 17, note=NEGATIVE),
        _rows_case(3, 3000, 50, F16, note=NARROW),
        _rows_case(8, 4096, 64, note="traced for traffic"),
        _rows_case(4, 1000, 10, BF16),
    ],
    gpu_cases=[
        _rows_case(1823, 3001, 10, note="ragged rows"),
        _rows_case(1823, 5000, 37, F16, note="k not a power of two"),
        _rows_case(4096, 1000, 1, note="k = 1"),
        _rows_case(1000, 300, 300, note="k = n"),
        _rows_case(2048, 7, 3, note="rows shorter than a block"),
        _rows_case(512, 3000, 16, transposed=("x",), note="strided rows"),
        _rows_case(512, 4096, 20, note=SPECIAL),
        _rows_case(256, 4000, 100, note=EQUAL),
        _rows_case(512, 8000, 1000, note=DUPLICATES),
        _rows_case(512, 8000, 64, note=SORTED),
        _rows_case(512, 8000, 17, note=NEGATIVE),
        _rows_case(512, 8000, 50, note=NARROW),
        _rows_case(1024, 2048, 32, BF16),
        _rows_case(4096, 32768, 64, note="timed", timed=True),
    ],
    # Odd row lengths past a block, and any k (mostly not a power of two).
    hidden=Hidden(cpu=Draw({"m": Span(2, 3), "n": Span(257, 1499, odd=True),
                            "k": Span(2, 31)}),
                  gpu=Draw({"m": Span(256, 2048), "n": Span(1001, 8191, odd=True),
                            "k": Span(2, 100)})),
    # Measured on an H100 (2026-11-27, `rooflab bench topk`): the course's kernel 4162 µs,
    # 4.3% of the roofline, 0.41× torch.topk (1715 µs, 10%). Bars at half of it; excellent
    # at torch.topk's own fraction.
    levels=Levels(passing=0.02, good=0.04, excellent=0.1),
    baseline=_torch_topk, baseline_name="torch.topk", at_least_vs_baseline=0.2,
    hints=("Keep the K_PAD best (key, position) words seen so far in a vector, sorted "
           "descending. Each block: make its words, take its own top K_PAD, and keep the top "
           "K_PAD of those and the running ones. Lanes past the row's end get the word 0.",
           "float_key: a positive float's bits already grow with its value, so set the sign "
           "bit to lift it above the negatives; a negative float's bits grow as it falls, so "
           "flip all of them. Then give NaN (x != x) the largest key, 0xFFFFFFFF. "
           "pack(key, cols) makes the word; top_k and merge_top do the rest."),
    answer_in=("float_key", "topk_rows_kernel"),
))

register(Problem(
    id="topk/radix", title="Top-k by radix select: a histogram, a filter, a small sort",
    signature=ROWS_SIGNATURE, make_inputs=_rows_inputs, reference=_rows_reference,
    cost=_rows_cost, invoke=_call, compare=compare_for(radix=True),
    trace_check=radix_structure, library_ops=TOPK_OPS,
    solution="rooflab.kernels.topk:topk_radix",
    cpu_cases=[
        _rows_case(8, 8192, 64, note=TRAFFIC),
        _rows_case(2, 65536, 100, note=FEW_ROWS),
        _rows_case(3, 20000, 1, note="k = 1"),
        _rows_case(2, 600, 600, note="k = n"),
        _rows_case(5, 7, 3, note="rows shorter than a block"),
        _rows_case(4, 10000, 37, F16, note="k not a power of two"),
        _rows_case(3, 8000, 16, transposed=("x",), note="strided rows"),
        _rows_case(4, 6000, 20, note=SPECIAL),
        _rows_case(2, 6000, 50, note=EQUAL),
        _rows_case(3, 8000, 100, note=DUPLICATES),
        _rows_case(4, 6000, 64, note=SORTED),
        _rows_case(3, 20000, 50, note=NARROW),
        _rows_case(3, 8000, 17, note=NEGATIVE),
        _rows_case(4, 10000, 100, BF16),
    ],
    gpu_cases=[
        _rows_case(256, 262144, 256, note="k = 256"),
        _rows_case(8, 131072, 50, note=FEW_ROWS),
        _rows_case(4096, 32768, 64, note="many shorter rows"),
        _rows_case(256, 65001, 1, note="k = 1"),
        _rows_case(256, 2000, 2000, note="k = n"),
        _rows_case(1000, 7, 3, note="rows shorter than a block"),
        _rows_case(256, 65001, 100, F16, note="k not a power of two"),
        _rows_case(256, 30000, 16, transposed=("x",), note="strided rows"),
        _rows_case(64, 65000, 20, note=SPECIAL),
        _rows_case(16, 65000, 500, note=EQUAL),
        _rows_case(64, 65000, 1000, note=DUPLICATES),
        _rows_case(64, 65000, 64, note=SORTED),
        _rows_case(64, 65000, 100, note=NARROW),
        _rows_case(64, 65000, 17, note=NEGATIVE),
        _rows_case(256, 65001, 1000, BF16),
        _rows_case(256, 262144, 1024, note="timed", timed=True),
    ],
    # Measured on an H100 (2026-11-27, `rooflab bench topk`): the course's kernel 1260 µs,
    # 7.1% of the roofline, 0.73× torch.topk (921 µs, 9.8%). Bars at half of it; excellent
    # at 2× torch.topk, which a two-read radix select (as FlashInfer's) can reach.
    levels=Levels(passing=0.035, good=0.07, excellent=0.2),
    baseline=_torch_topk, baseline_name="torch.topk", at_least_vs_baseline=0.35,
    hints=("Four levels, one byte of the key each. A level counts, for every element still "
           "in play, its byte with tl.histogram; counting down from bucket 255, the bucket "
           "where the count reaches k holds the k-th largest. Elements above it are in; the "
           "ones in it are the candidates, and the next level looks only at them.",
           "threshold_bucket: tl.cumsum(hist, 0, reverse=True) counts the elements in each "
           "bucket or above; the buckets where that is still >= k are 0..bucket. The "
           "histogram: digit = (key >> shift) & 255, masked to the elements whose higher "
           "bytes equal the prefix. The filter: reserve slots with tl.atomic_add on the row's "
           "counter, then each lane's slot is first + tl.cumsum(keep) - 1."),
    answer_in=("threshold_bucket", "radix_histogram_kernel", "radix_filter_kernel"),
))


def _stream_case(n: int, k: int, chunk: int, devices: int = 1, dtype: torch.dtype = F32,
                 offset: int = 0, **fields) -> Case:
    sizes = {"n": n, "k": k, "chunk": chunk, "devices": devices}
    return Case(sizes | ({"offset": offset} if offset else {}), dtype, **fields)


def _stream_baseline(x: torch.Tensor, k: int, chunk: int, devices: int, offset: int,
                     *flags: bool) -> tuple:
    return torch.topk(x, k)  # the whole stream at once, in memory: the library's way


register(Problem(
    id="topk/stream", title="Streaming top-k: chunks over time, O(k) memory, merged on GPU",
    signature=STREAM_SIGNATURE, make_inputs=_stream_inputs, reference=_stream_reference,
    cost=_stream_cost, invoke=_run_stream, compare=compare_for(stream=True),
    trace_check=stream_structure, library_ops=TOPK_OPS | {"cat", "stack"},
    solution="rooflab.kernels.topk:StreamingTopK",
    # The measured cases' streams are thousands of times k, each chunk more than an
    # object's bound.
    cpu_cases=[
        _stream_case(40000, 64, 10000),
        _stream_case(30000, 100, 5000, 3, note=SHARDS),
        _stream_case(2400, 300, 256, note=SHORT_CHUNKS),
        _stream_case(8000, 20, 2000, note=SPECIAL),
        _stream_case(12000, 37, 3000, 2, F16, note=SHARDS),
        _stream_case(10000, 1, 2500, 2, note=MEMORY),  # and k = 1
        _stream_case(500, 500, 100, 2, note="k = n"),
        _stream_case(9000, 50, 3000, note=NARROW),
        _stream_case(1200, 5, 300, 2, offset=(1 << 32) + 7, note=PAST_32_BITS),
        _stream_case(12000, 64, 3000, 2, BF16),
    ],
    gpu_cases=[
        _stream_case(1 << 24, 100, 1 << 20, 4, note=SHARDS),
        _stream_case(1 << 22, 64, 1 << 18, 2, note=MEMORY),
        _stream_case(1 << 20, 50, 1 << 16, 2, offset=(1 << 32) + 7, note=PAST_32_BITS),
        _stream_case(1 << 16, 2048, 1000, note=SHORT_CHUNKS),
        _stream_case(1 << 20, 20, 1 << 16, note=SPECIAL),
        _stream_case(1 << 22, 37, 1 << 18, 2, F16, note=SHARDS),
        _stream_case(1 << 22, 1, 1 << 20, note="k = 1"),
        _stream_case(4096, 4096, 1000, 2, note="k = n"),
        _stream_case(1 << 22, 50, 1 << 19, note=NARROW),
        _stream_case(1 << 22, 1000, 1 << 20, 2, BF16),
        _stream_case(1 << 26, 1024, 1 << 22, note="timed", timed=True),
    ],
    # Measured on an H100 (2026-11-27, `rooflab bench topk`): the course's class 4077 µs,
    # 2.2% of the roofline, 0.34× torch.topk of the whole stream (1371 µs, 6.5%). Bars at
    # half of it; excellent near torch.topk's fraction, with the stream never all in memory.
    levels=Levels(passing=0.01, good=0.02, excellent=0.06),
    baseline=_stream_baseline, baseline_name="torch.topk of the whole stream",
    at_least_vs_baseline=0.15,
    hints=("update: take the chunk's own top k with one of your kernels (one program for a "
           "short chunk, radix select for a long one; a chunk shorter than k: all of it), "
           "then merge it into the top k so far, with positions counted from where the chunk "
           "starts in the stream. Keep nothing else: not the chunk, not a view of it.",
           "merge_topk_kernel: sort words that carry a slot, not the position (a position "
           "may need more than 32 bits): pack(float_key(a), slots) for a, pack(float_key(b), "
           "slots + K_PAD) for b, 0 for empty slots; merge_top gives the best K_PAD; fetch "
           "each winner's position by its slot, adding B_BASE for b's."),
    answer_in=("merge_topk_kernel", "StreamingTopK"),
))
