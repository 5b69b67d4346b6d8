"""Collectives: an all-reduce written from point-to-point messages, on N ranks.

``collectives/ring_allreduce`` calls the learner's ``(x) -> sum over ranks`` on every rank
of a gloo process group (``ranks/``) and grades three things:

* the answer: the sum, on every rank, bit for bit the same on all of them; integers
  exactly as ``dist.all_reduce`` gives them (an integer sum is exact in any order);
* the order of the sums: in a ring each element is added up rank after rank around the
  ring, starting from the rank where its chunk starts, and each chunk starts at a
  different rank. A naive all-reduce sums every element in one order, a tree in pairs:
  in fp32 the last bits tell them apart (at N >= 3; at N = 2, a + b = b + a);
* the messages each rank sent, from the record of its torch.distributed calls: only to
  its ring neighbour, 2(N − 1) steps, one chunk each, 2(N − 1)/N·S bytes in all. At N = 2
  a ring, a naive exchange and a tree send the same bytes, and only the number and size
  of the messages differ;
* what each message carried (a digest of its values, recorded as it was sent): the
  chunks the ranks' first messages cut, then at reduce-scatter step s the chunk summed
  over s + 1 ranks, at each all-gather step a finished chunk. Messages of the right sizes
  that carry something else (zeros, while the sum came through a group of the candidate's
  own, a file, a socket) fail, whatever the answer. Chunks may be cut any way the size
  rule allows: what a message should carry follows from the cuts the ranks made.

A dropped remainder shows only where N does not divide the size: most cases' sizes are
such. A tree shows in its order at N = 4, a naive all-reduce at N = 3. Two cases pass
``average=True`` and want the mean: the sum and a double division are named.

``collectives/add_into`` is the same ring step's addition on one GPU, chunk + incoming as
a Triton kernel, graded by the ordinary engine against the copy roof.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..evidence.compare import CaseResult, Comparison, bits, compare
from ..problem import (
    DEFAULT_TOLERANCES,
    EXACT,
    Case,
    Cost,
    Levels,
    Problem,
    Structure,
    register,
)
from ..ranks import RanksProblem
from ..ranks.problem import world_size
from ..ranks.record import OWN, Call, RankLog
from .coalescing import vector_cost, vector_inputs

F32, I64, I32 = torch.float32, torch.int64, torch.int32
REMAINDER = "N does not divide the size"
TINY = "fewer elements than ranks"
EXACT_NOTE = "exact: as dist.all_reduce"
AVERAGE = "average=True: the mean over ranks"
# Below this many elements per chunk, two ring orders can give the same bits over a whole
# chunk by chance; the order is graded only above it.
ORDER_MIN_CHUNK = 64


def _case(ranks: int, dtype: torch.dtype = F32, note: str = "", **shape: int) -> Case:
    return Case({"ranks": ranks, **shape}, dtype, note=note)


CASES = [
    _case(2, n=4096),  # N = 2: only the messages' number and size tell a ring apart
    _case(3, n=3001, note=REMAINDER),
    _case(4, n=4096),
    _case(4, rows=37, cols=29, note=REMAINDER),  # a 2-D tensor, 1073 elements
    _case(5, I64, n=5003, note=EXACT_NOTE),
    _case(5, I32, n=1000, note=EXACT_NOTE),
    _case(8, n=65539, note=REMAINDER),
    _case(8, n=6, note=TINY),
    # N a power of two: the mean times N is the ring's sum exactly, so its order is graded.
    _case(4, n=4099, average=1, note=AVERAGE),
    _case(8, n=1029, average=1, note=AVERAGE),
]


def _shape(case: Case) -> tuple[int, ...]:
    return tuple(size for name, size in case.sizes.items() if name not in ("ranks", "average"))


def _average(case: Case) -> bool:
    return bool(case.sizes.get("average"))


def _elements(case: Case) -> int:
    return math.prod(_shape(case))


def make_inputs(case: Case, generator: torch.Generator, device: torch.device) -> list[tuple]:
    """One tensor per rank: normal values, or integers in ±1000 (no sum can overflow);
    then ``average=True`` where the case asks for the mean."""
    shape = _shape(case)
    if case.dtype.is_floating_point:
        xs = [torch.randn(shape, generator=generator, device=device).to(case.dtype)
              for _ in range(world_size(case))]
    else:
        xs = [torch.randint(-1000, 1001, shape, generator=generator, device=device,
                            dtype=case.dtype) for _ in range(world_size(case))]
    return [(x, True) if _average(case) else (x,) for x in xs]


def reference(*xs: torch.Tensor) -> torch.Tensor:
    """The sum over ranks: in float64 for floats, exact for integers."""
    if xs[0].is_floating_point():
        return torch.stack([x.double() for x in xs]).sum(0)
    return torch.stack(xs).sum(0, dtype=xs[0].dtype)


def cost(case: Case) -> Cost:
    """Per rank: the bytes a ring sends, and the additions of its reduce-scatter."""
    n, size = world_size(case), _elements(case)
    return Cost((n - 1) / n * size, 2 * (n - 1) / n * size * case.dtype.itemsize,
                "fp32" if case.dtype.is_floating_point else "int")


# --- the order of the sums ---------------------------------------------------------------

def ring_sums(xs: torch.Tensor, direction: int) -> torch.Tensor:
    """For each start rank a, every element summed as a ring sums it, in the inputs'
    dtype: ((x_a + x_{a+d}) + x_{a+2d}) + ...  ``xs``: (N, S) -> (N, S)."""
    n = xs.shape[0]
    sums = xs.clone()
    for start in range(n):
        for hop in range(1, n):
            sums[start] += xs[(start + direction * hop) % n]
    return sums


def _stretches(masks: list[int]) -> list[int]:
    """The fewest stretches of consecutive elements that each share a start rank: for
    each, the start ranks (bit a = rank a) that explain all of it."""
    runs, current = [], 0
    for mask in masks:
        if current & mask:
            current &= mask
        else:
            if current:
                runs.append(current)
            current = mask
    return runs + [current]


def _distinct_starts(runs: list[int], n: int) -> bool:
    """Can each stretch have a start rank of its own? (A matching, tried path by path.)"""
    owner: dict[int, int] = {}

    def place(run: int, seen: set[int]) -> bool:
        for start in range(n):
            if runs[run] >> start & 1 and start not in seen:
                seen.add(start)
                if start not in owner or place(owner[start], seen):
                    owner[start] = run
                    return True
        return False

    return all(place(run, set()) for run in range(len(runs)))


def ring_order(xs: torch.Tensor, out: torch.Tensor) -> str:
    """"" if ``out`` (S,) is summed as some ring sums (either way round, any assignment
    of chunks to start ranks); else what order it was summed in, in words."""
    n, size = xs.shape
    findings = []
    for direction in (1, -1):
        match = bits(ring_sums(xs, direction)) == bits(out)[None, :]
        unexplained = ~match.any(0)
        if bool(unexplained.any()):
            findings.append((2, int(unexplained.sum()), int(unexplained.nonzero()[0])))
            continue
        weights = torch.tensor([1 << a for a in range(n)], dtype=torch.int64)[:, None]
        runs = _stretches((match.to(torch.int64) * weights).sum(0).tolist())
        if len(runs) == n and _distinct_starts(runs, n):
            return ""
        findings.append((1, len(runs), runs[0]))
    kind, count, detail = min(findings)
    if kind == 2:
        i = detail
        return (f"{count} of {size} elements are summed in no ring's order (element {i} is "
                f"{float(out[i]):.9g}): a ring adds each element up rank after rank, "
                "x_a + x_(a+1) + … in the tensor's own dtype, from the rank a where its chunk "
                "starts. A tree (pairs, then pairs of pairs), a sum in float64, or another "
                "library call sums in another order")
    if count == 1:
        start = (detail & -detail).bit_length() - 1
        return (f"every element is summed in the same order, from rank {start} on "
                f"(x_{start} + x_{(start + 1) % n} + …): each rank, or one rank, added up "
                "the whole tensors, as a naive all-reduce does. In a ring each of the N "
                "chunks is summed starting from a different rank")
    return (f"the elements fall into {count} stretches summed in different orders, where a "
            f"ring has N = {n} chunks, each summed around the ring from a different rank")


# --- the messages --------------------------------------------------------------------------

def _largest(size: int, n: int) -> int:
    """The most elements one message may carry: one chunk, with a remainder's worth of
    slack (n // N each with the remainder on one chunk, tensor_split's, and any between)."""
    return math.ceil(size / n) + n - 1


def _sent_bounds(size: int, n: int) -> tuple[int, int]:
    """The fewest and most elements a rank of a ring sends, over every way of cutting the
    tensor into N chunks of at most ``_largest`` elements: all of it twice, less the two
    chunks it never sends (one a phase). The size rule and this one then agree."""
    largest = min(_largest(size, n), size)
    smallest = max(0, size - (n - 1) * largest)
    return 2 * size - 2 * largest, 2 * size - 2 * smallest


def _library_causes(r: int, log: RankLog, found: dict[str, str]) -> None:
    """A group the candidate built, a collective, a group's method called directly."""
    calls = log.collectives()
    built = list(dict.fromkeys(call.library() for call in calls if call.builds))
    used = list(dict.fromkeys(call.op for call in calls if call.group == OWN
                              and not call.builds))
    if built or used:
        on_it = f" and calls {', '.join(used)} on it" if used else ""
        what = f"builds a process group of its own ({', '.join(built)}){on_it}" if built \
            else f"calls {', '.join(used)} on a group or store the harness did not give it"
        found.setdefault("group", (
            f"rank {r} {what}: a library call. The exercise is to build the all-reduce "
            "from point-to-point messages (dist.isend and dist.irecv) on the group the "
            "harness gives each rank"))
    others = list(dict.fromkeys(call.library() for call in calls
                                if not call.builds and call.group != OWN))
    if others:
        found.setdefault("collective", (
            f"rank {r} calls {', '.join(others)}: the exercise is to build the all-reduce "
            "from point-to-point messages (dist.isend and dist.irecv)"))


def message_causes(case: Case, logs: list[RankLog]) -> list[str]:
    """The rules of a ring the ranks' messages break, each named once, at its first rank."""
    n, size = world_size(case), _elements(case)
    item = case.dtype.itemsize
    steps = 2 * (n - 1)
    ideal = 2 * (n - 1) / n * size  # elements each rank sends
    largest = _largest(size, n)
    fewest, most = _sent_bounds(size, n)
    found: dict[str, str] = {}
    for log in logs:
        r, right, left = log.rank, (log.rank + 1) % n, (log.rank - 1) % n
        sends, receives = log.sends(), log.receives()
        _library_causes(r, log, found)
        if log.collectives() and not sends and not receives:
            continue  # the counts below would only say the same again
        if not sends and not receives and not log.collectives():
            found.setdefault("silent", f"rank {r} sent and received nothing through "
                                       "torch.distributed")
        # A receive that named no source and was never waited on has no peer on record:
        # its sender is checked, as a send.
        strangers = [call for call in sends + receives if call.peer not in (right, left)
                     and (call.is_send or call.peer is not None)]
        if strangers:
            call = strangers[0]
            way = "sends to" if call.is_send else "receives from"
            found.setdefault("neighbours", (
                f"rank {r} {way} rank {call.peer} ({call.op} at step {call.step}), which is "
                f"not its neighbour in the ring (ranks {left} and {right}): a ring passes "
                "every message to the next rank"))
        elif n > 2 and len({call.peer for call in sends}) > 1:
            found.setdefault("neighbours", f"rank {r} sends to both its neighbours: a ring "
                                           "sends one way round, receiving from the other")
        counted = [len(sends), len(receives)]
        if size < n:  # some chunks are empty: a ring may skip those messages
            ok = max(counted) <= steps
        else:
            ok = counted == [steps, steps]
        if not ok:
            found.setdefault("steps", (
                f"rank {r} made {_count(len(sends), 'send')} and "
                f"{_count(len(receives), 'receive')}: a ring "
                f"all-reduce takes 2(N − 1) = {steps} steps, N − 1 of reduce-scatter and "
                "N − 1 of all-gather, one send and one receive each"))
        big = [call for call in sends if call.elements > largest]
        if big:
            rows = " (cut the flattened tensor: chunks of whole rows differ by a row)" \
                if len(_shape(case)) > 1 else ""
            found.setdefault("size", (
                f"rank {r} sends {big[0].elements:,} elements in one message, where a ring "
                f"sends one chunk per step, n/N ≈ {size / n:,.0f}{rows}"))
        sent = sum(call.bytes for call in sends)
        if not fewest * item <= sent <= most * item:
            found.setdefault("bytes", (
                f"rank {r} sent {sent:,} B; a ring sends 2(N − 1)/N·S = "
                f"{ideal * item:,.0f} B (S = {size * item:,} B)"))
    return list(found.values())


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


# --- what the messages carried -------------------------------------------------------------

@dataclass
class _Message:
    """What one send of a ring must carry: elements [lo, hi) of the flattened tensor,
    summed over ``ranks`` (the reduce-scatter's partial sum, or every rank's)."""

    lo: int
    hi: int
    ranks: list[int]
    finished: bool  # an all-gather step's: the whole sum (or mean)

    def words(self) -> str:
        span = f"elements {self.lo:,} to {self.hi - 1:,}" if self.hi > self.lo + 1 else \
            f"element {self.lo:,}"
        if self.finished:
            return f"the finished sum of {span}"
        if len(self.ranks) == 1:
            return f"{span} of its own tensor"
        return f"{span} summed over ranks {', '.join(map(str, self.ranks))}"


class _Judge:
    """Checks a message's digest (``record.digest``) against what the inputs say it must
    carry: exactly for integers; for floats within what rounding each partial sum in the
    tensor's dtype can move it, element by element."""

    def __init__(self, xs: list[torch.Tensor], average: bool):
        self.values = torch.stack([x.reshape(-1) for x in xs]).to(torch.float64)
        self.sizes = abs(self.values)
        dtype = xs[0].dtype
        self.eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
        n = len(xs)
        self.scales = (1.0, 1.0 / n) if average else (1.0,)  # the mean: divided before or after
        self._known: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def digests(self, message: _Message) -> tuple[torch.Tensor, torch.Tensor]:
        """The three numbers the message should have, and how far each may be off (both
        in proportion to a scale the message may carry)."""
        key = (message.lo, message.hi, tuple(message.ranks))
        if key not in self._known:
            rows = self.values[message.ranks, message.lo:message.hi]
            want = rows.sum(0)
            # Each of the k − 1 additions (and a division) rounds once in the tensor's dtype.
            bound = (len(message.ranks) + 1) * self.eps * \
                self.sizes[message.ranks, message.lo:message.hi].sum(0)
            place = torch.arange(1, want.numel() + 1, dtype=torch.float64)
            expected = torch.stack([want.sum(), (want * place).sum(), want.abs().sum()])
            # float64's own rounding of the three sums, either side
            most = want.abs() + bound
            slack = torch.stack([bound.sum(), (bound * place).sum(), bound.sum()]) + \
                1e-12 * torch.stack([most.sum(), (most * place).sum(), most.sum()]) + 1e-300
            self._known[key] = expected, slack
        return self._known[key]

    def carries(self, call: Call, message: _Message) -> bool:
        if call.digest is None or call.elements != message.hi - message.lo:
            return False
        got = torch.tensor(call.digest, dtype=torch.float64)
        expected, slack = self.digests(message)
        return any(bool(((got - expected * scale).abs() <= slack * scale).all())
                   for scale in self.scales)


def _direction(logs: list[RankLog], n: int) -> int:
    """+1 when the ranks send to rank + 1, −1 when to rank − 1 (either, at N = 2)."""
    first = next((call for call in logs[0].sends()), None)
    return -1 if n > 2 and first is not None and first.peer == (0 - 1) % n else 1


def _cuts(judge: _Judge, logs: list[RankLog]) -> dict[int, tuple[int, int]] | None:
    """The chunk each rank starts the reduce-scatter with, from its first message: pieces
    of its own tensor that together cover the whole, each rank's where its first message
    matches it. A rank whose chunk is empty may have skipped its message: it gets an empty
    chunk. None if no such cut explains the first messages."""
    n, size = len(logs), judge.values.shape[1]
    firsts = [next(iter(log.sends()), None) for log in logs]
    owned: dict[int, tuple[int, int]] = {}

    def place(start: int) -> bool:
        if start == size:
            return True
        for r, call in enumerate(firsts):
            if r in owned or call is None or not 0 < call.elements <= size - start:
                continue
            if judge.carries(call, _Message(start, start + call.elements, [r], False)):
                owned[r] = (start, start + call.elements)
                if place(start + call.elements):
                    return True
                del owned[r]
        return False

    if not place(0):
        return None
    return {r: owned.get(r, (size, size)) for r in range(n)}


def _schedule(r: int, n: int, direction: int, cuts: dict[int, tuple[int, int]]
              ) -> list[_Message]:
    """What rank r sends at each of its 2(N − 1) steps, in a ring where rank q starts with
    chunk ``cuts[q]``: at reduce-scatter step s the chunk rank r − s·d started with,
    summed over ranks r − s·d … r; at all-gather step s, the finished chunk that rank
    r + d − s·d started with."""
    messages = []
    for s in range(n - 1):
        owner = (r - s * direction) % n
        ranks = [(owner + j * direction) % n for j in range(s + 1)]
        messages.append(_Message(*cuts[owner], ranks, False))
    for s in range(n - 1):
        messages.append(_Message(*cuts[(r + direction - s * direction) % n], list(range(n)),
                                 True))
    return messages


def _wrong_message(r: int, call: Call, message: _Message) -> str:
    where = f"rank {r}'s send at step {call.step} (to rank {call.peer})"
    if call.digest is not None and call.digest[2] == 0 and message.hi > message.lo:
        return (f"{where} held only zeros, where a ring sends {message.words()}: what the "
                "ranks returned did not come through these messages")
    return f"{where} does not carry what a ring sends there, {message.words()}"


def content_causes(case: Case, xs: list[torch.Tensor], logs: list[RankLog],
                   average: bool) -> list[str]:
    """Whether each message carried what a ring delivers at its step (the first that did
    not, in words). Judged only where the messages have a ring's shape (one way round, no
    more than 2(N − 1) sends a rank); ``message_causes`` names any other shape."""
    n = world_size(case)
    if any(log.collectives() for log in logs) or any(
            len(log.sends()) > 2 * (n - 1) for log in logs) or not any(
            log.sends() for log in logs):
        return []
    direction = _direction(logs, n)
    if any(call.peer != (log.rank + direction) % n for log in logs for call in log.sends()):
        return []
    unrecorded = next((log for log in logs if any(c.digest is None for c in log.sends())),
                      None)
    if unrecorded is not None:
        return [f"rank {unrecorded.rank}'s record holds no digest of what its messages "
                "carried: the grader cannot tell a ring's messages from empty ones"]
    judge = _Judge(xs, average)
    cuts = _cuts(judge, logs)
    if cuts is None:
        return [_first_messages_cause(judge, logs, direction)]
    # Each rank's first message that parts from the ring's; the earliest step is named,
    # since what a rank sends later follows from what it received wrong.
    parted = [found for log in logs
              if (found := _first_parting(judge, log, n, direction, cuts)) is not None]
    return [min(parted)[2]] if parted else []


def _first_parting(judge: _Judge, log: RankLog, n: int, direction: int,
                   cuts: dict[int, tuple[int, int]]) -> tuple[int, int, str] | None:
    """(step, rank, words) of the first of a rank's sends that does not carry what the
    ring sends there; None if all of them do."""
    calls = log.sends()
    for step, message in enumerate(_schedule(log.rank, n, direction, cuts)):
        if calls and calls[0].elements == message.hi - message.lo:
            call = calls.pop(0)
            if not judge.carries(call, message):
                return call.step, log.rank, _wrong_message(log.rank, call, message)
        elif message.hi > message.lo or not calls:  # only an empty one may be skipped
            if calls:
                return calls[0].step, log.rank, (
                    f"rank {log.rank}'s send at step {calls[0].step} carries "
                    f"{calls[0].elements:,} elements, where a ring sends "
                    f"{message.words()} ({message.hi - message.lo:,} elements)")
            if message.hi > message.lo:
                return step, log.rank, f"rank {log.rank} never sent {message.words()}"
    return None


def _first_messages_cause(judge: _Judge, logs: list[RankLog], direction: int) -> str:
    """Why no cut of the tensor explains the ranks' first messages."""
    n = len(logs)
    for log in logs:
        first = next(iter(log.sends()), None)
        if first is None or first.elements == 0:
            continue
        own = _Message(0, first.elements, [log.rank], False)
        if first.digest is not None and first.digest[2] == 0 and \
                bool(judge.sizes[log.rank].any()):
            return _wrong_message(log.rank, first, own).replace(own.words(), (
                "a chunk of its own tensor at the reduce-scatter's first step"))
        if not any(judge.carries(first, _Message(lo, lo + first.elements, [log.rank], False))
                   for lo in range(judge.values.shape[1] - first.elements + 1)):
            return (f"rank {log.rank}'s first send (to rank {(log.rank + direction) % n}) "
                    f"is no stretch of its own tensor: a ring's reduce-scatter starts with "
                    "each rank sending one chunk of its own")
    return ("the ranks' first messages are not N chunks that cut the tensor: a ring's "
            "reduce-scatter starts with each rank sending a different chunk, and together "
            "they cover the tensor once")


# --- the answers ---------------------------------------------------------------------------

def _remainder_advice(out: torch.Tensor, want: torch.Tensor, n: int,
                      logs: list[RankLog]) -> str:
    """The dropped remainder, where the evidence shows it: every element right but the
    last n mod N; or, with fewer elements than ranks (n // N = 0), nothing but empty
    messages sent."""
    size = want.numel()
    tail = size % n
    if not tail or not isinstance(out, torch.Tensor) or out.shape != want.shape:
        return ""
    fix = ("Cut the tensor into N chunks that cover it all, their sizes differing by one "
           "at most (torch.tensor_split)")
    if size < n:
        sends = [call for log in logs for call in log.sends()]
        if sends and all(call.elements == 0 for call in sends):
            return (f"every message was empty: chunks of n // N = {size} // {n} = 0 "
                    f"elements leave the whole tensor out. {fix}")
        return ""
    wrong = ~torch.isclose(out.reshape(-1).double(), want.reshape(-1).double(),
                           rtol=1e-4, atol=1e-4)
    if bool(wrong[-tail:].any()) and not bool(wrong[:-tail].any()):
        which = "the last element is" if tail == 1 else f"the last {tail} elements are"
        return (f"only {which} wrong, n mod N = {size} mod {n}: chunks of n // N = "
                f"{size // n} elements leave the remainder out. {fix}")
    return ""


def _average_advice(out: torch.Tensor, want: torch.Tensor, n: int) -> str:
    """The classic slips of a mean: the sum itself, or divided by N more than once."""
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        return ""
    for factor, words in ((n, "the sum, not the mean: divide each summed chunk by N once"),
                          (1 / n, "divided by N twice: divide once, on the rank that "
                                  "finished the chunk (or once on every rank at the end)")):
        if torch.allclose(out.double(), want.double() * factor, rtol=1e-4, atol=1e-6):
            return words
    return ""


def grade(case: Case, inputs: list[tuple], outputs: list[object],
          logs: list[RankLog]) -> CaseResult:
    n = world_size(case)
    xs = [args[0] for args in inputs]
    average = _average(case)
    want = reference(*xs) / n if average else reference(*xs)
    floating = case.dtype.is_floating_point
    tolerance = DEFAULT_TOLERANCES["fp32"] if floating else EXACT
    first: Comparison | None = None
    for rank, out in enumerate(outputs):
        name = f"rank {rank}'s answer"
        if not isinstance(out, torch.Tensor):
            said = out if isinstance(out, str) else "no answer reached the grader"
            return CaseResult(case, Comparison(False, cause=(
                f"{name}: {said}, expected a torch.Tensor (did you forget to return it? "
                "Working in place, return x)")))
        seen = compare(out, want, dtype=case.dtype, device=torch.device("cpu"),
                       tolerance=tolerance, name=name)
        if not seen.ok:
            advice = _average_advice(out, want, n) if average else \
                _remainder_advice(out, want, n, logs)
            # Where the answer went wrong: the first message that parted from the ring's.
            return CaseResult(case, seen, advice=advice or "; ".join(
                content_causes(case, xs, logs, average)))
        first = first or seen
    assert first is not None
    for rank, out in enumerate(outputs[1:], start=1):
        differ = bits(out) != bits(outputs[0])
        if bool(differ.any()):
            return CaseResult(case, Comparison(False, cause=(
                f"rank {rank}'s answer differs from rank 0's in {int(differ.sum())} elements "
                "(in the last bits): the ranks summed in different orders. In a ring each "
                "chunk is summed once, on one rank, and every rank receives that sum")))
    causes = message_causes(case, logs) + content_causes(case, xs, logs, average)
    if floating and n >= 3 and _elements(case) >= ORDER_MIN_CHUNK * n:
        # The mean of a power-of-two N, times N, is the sum bit for bit.
        summed = outputs[0] * n if average else outputs[0]
        order = ring_order(torch.stack([x.reshape(-1) for x in xs]), summed.reshape(-1))
        causes = [order, *causes] if order else causes
    # The sum is right (``first`` says how close): what is left is how it was computed.
    return CaseResult(case, first, error="; ".join(causes))


register(RanksProblem(
    id="collectives/ring_allreduce",
    title="Ring all-reduce",
    signature="ring_allreduce(x: Tensor, average: bool = False) -> Tensor, on every rank: "
              "the sum of x over all ranks, or their mean with average=True (in place "
              "allowed)",
    make_inputs=make_inputs,
    reference=reference,
    cost=cost,
    cpu_cases=CASES,
    gpu_cases=CASES,  # gloo processes in both worlds: one GPU cannot host N NCCL ranks
    grade=grade,
    solution="rooflab.kernels.collectives:ring_allreduce",
    hints=("Flatten x and cut it into N chunks whose sizes differ by at most one "
           "(torch.tensor_split takes any size). N − 1 steps send a chunk to the right "
           "neighbour and add the chunk arriving from the left into your own copy of it; N − "
           "1 more steps pass the finished chunks around the same way.",
           "Reduce-scatter step s: send chunk (r − s) mod N to rank r + 1, receive chunk "
           "(r − s − 1) mod N from rank r − 1 into a buffer and add it in. After N − 1 steps "
           "chunk r + 1 is complete on rank r. All-gather step s: send chunk (r + 1 − s), "
           "receive chunk (r − s) straight into place. Post each step's isend and irecv "
           "together, then wait for both: two blocking sends deadlock. For the mean, "
           "divide chunk r + 1 by N between the two phases."),
    answer_in=("ring_allreduce",),
))


# --- the local reduction of a ring step, on one GPU --------------------------------------

register(Problem(
    id="collectives/add_into",
    title="A ring step's reduction, chunk + incoming, at the bandwidth roof",
    signature="add_into(chunk: Tensor[n], incoming: Tensor[n], out: Tensor[n]) -> Tensor[n]  "
              "# out = chunk + incoming; the ring passes out=chunk",
    # Lab 01's vector add, as a ring step uses it: two chunks read, one written.
    make_inputs=vector_inputs,
    reference=lambda chunk, incoming: chunk + incoming,
    cost=vector_cost,
    # The grader passes ``out`` apart from ``chunk``, so that a kernel storing into the
    # wrong tensor shows (chunk or incoming changed, out unwritten).
    output_arg=True,
    out_shape=lambda case: (case.sizes["n"],),
    cpu_cases=[
        Case({"n": 1}, torch.float32, note="one element"),
        Case({"n": 3001}, torch.float32, note="ragged tail"),
        Case({"n": 4097}, torch.float16, note="ragged tail"),
        Case({"n": 3000}, torch.float16, scale=1e4, note="large values"),
        Case({"n": 2049}, torch.bfloat16),
        Case({"n": 8 * 4096 + 3}, torch.float32, note="a chunk of 8: traced for traffic"),
    ],
    # A 2 GiB bf16 gradient on 8 GPUs leaves chunks of 128 Mi elements; 2^26 fp32 (768 MB
    # moved) is as far beyond any L2, and checks on a 16 GB card.
    gpu_cases=[
        Case({"n": 1_000_003}, torch.float32, note="ragged tail"),
        Case({"n": (1 << 25) + 7}, torch.float16, scale=1e4, note="large values"),
        Case({"n": (1 << 25) + 5}, torch.bfloat16),
        Case({"n": 1 << 26}, torch.float32, note="fills the chip"),
    ],
    # Read two, write one, nothing else: as close to the copy roof as a copy.
    levels=Levels(passing=0.85, good=0.9, excellent=0.95),
    structure=Structure(sector_efficiency=0.9, dram_over_compulsory=1.5),
    # copy_ too: out = chunk, then out += incoming reads and writes out once more.
    library_ops=frozenset({"add", "add_", "sum", "stack", "cat", "copy_"}),
    baseline=torch.add,
    baseline_name="torch.add",
    solution="rooflab.kernels.collectives:add_into",
    hints=("One program a block of BLOCK elements: offsets = pid * BLOCK + "
           "tl.arange(0, BLOCK). Load a block of chunk and of incoming, store their sum into "
           "out.",
           "The last block runs past n: mask = offsets < n on both loads and the store. Add "
           "in fp32 (.to(tl.float32)) and cast to out's dtype when storing."),
    answer_in=("add_into_kernel",),
))
