"""collectives/ring_allreduce judged by what each message carried, not only by its size.

A ring that sends zero-filled messages of the right sizes and gets the sum another way (a
process group of its own, a collective the recorder did not know, a file) fails, naming
how; rings written other ways (the remainder on the first or the last chunk, the other way
round, chunks starting elsewhere, a receive that names no source, batched messages) pass,
for 20 seeds. The recorder's list of collectives is torch.distributed's, and a rank that
leaves early is named.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rooflab.autograder import get_problem
from rooflab.autograder.checking import answers
from rooflab.autograder.checking.isolated import recheck
from rooflab.autograder.checking.rank_check import kept
from rooflab.autograder.problems.collectives import AVERAGE, REMAINDER, TINY
from rooflab.autograder.ranks import launch, record
from rooflab.autograder.ranks.problem import world_size
from rooflab.kernels.collectives import ring_allreduce

PROBLEM = "collectives/ring_allreduce"
SEEDS = 20


# --- rings written other ways, and rings whose messages carry nothing -----------------------

def chunked(flat: torch.Tensor, world: int, rule: str) -> list[torch.Tensor]:
    """N chunks covering ``flat``: as tensor_split does, or n // N each with the remainder
    on the first or the last chunk."""
    if rule == "split":
        return list(flat.tensor_split(world))
    size, extra = divmod(flat.numel(), world)
    sizes = [size] * world
    sizes[0 if rule == "first" else -1] += extra
    return list(flat.split(sizes))


def ring(x: torch.Tensor, average: bool = False, rule: str = "split", direction: int = 1,
         shift: int = 0, any_source: bool = False, batch: bool = False,
         zeros: bool = False) -> torch.Tensor:
    """A ring all-reduce: ``direction`` -1 sends to the left; ``shift`` moves the chunk each
    rank starts with; ``any_source``: each irecv names no source; ``batch``: each step is a
    batch_isend_irecv; ``zeros``: every message is zeros of the right size (and what
    arrives is dropped), the ring's shape and nothing else."""
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.contiguous().view(-1)
    chunks = chunked(flat, world, rule)
    right, left = (rank + direction) % world, (rank - direction) % world

    def exchange(outgoing: torch.Tensor, into: torch.Tensor) -> None:
        if zeros:
            outgoing, into = torch.zeros_like(outgoing), torch.empty_like(into)
        if batch:
            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, right),
                                               dist.P2POp(dist.irecv, into, left)])
        else:
            requests = [dist.isend(outgoing, right),
                        dist.irecv(into) if any_source else dist.irecv(into, left)]
        for request in requests:
            request.wait()

    def chunk(offset: int) -> torch.Tensor:
        return chunks[(rank + offset + shift) % world]

    for step in range(world - 1):
        theirs = chunk(-(step + 1) * direction)
        incoming = torch.empty_like(theirs)
        exchange(chunk(-step * direction), incoming)
        if not zeros:
            theirs += incoming
    if average:
        chunk(direction).div_(world)
    for step in range(world - 1):
        exchange(chunk(direction - step * direction), chunk(-step * direction))
    return flat.view_as(x)


def summed_as_a_ring_sums(xs: list[torch.Tensor]) -> torch.Tensor:
    """The course ring's answer, computed in one place: chunk k summed x_k + x_(k+1) + …"""
    world, flats = len(xs), [x.reshape(-1) for x in xs]
    out = torch.empty_like(flats[0])
    for k, where in enumerate(torch.arange(out.numel()).tensor_split(world)):
        total = flats[k][where].clone()
        for hop in range(1, world):
            total += flats[(k + hop) % world][where]
        out[where] = total
    return out.view_as(xs[0])


def own_group(x: torch.Tensor) -> torch.Tensor:
    """Zero-filled ring messages; the sum from a group it made with dist.new_group."""
    group = dist.new_group()
    ring(x, zeros=True)
    group.allreduce([x]).wait()
    return x


def group_from_the_store(x: torch.Tensor) -> torch.Tensor:
    """Zero-filled ring messages; the sum from a gloo group built on the default store."""
    store = dist.distributed_c10d._get_default_store()
    group = dist.ProcessGroupGloo(dist.PrefixStore("own", store), dist.get_rank(),
                                  dist.get_world_size())
    ring(x, zeros=True)
    group.allreduce([x]).wait()
    return x


def default_group_directly(x: torch.Tensor) -> torch.Tensor:
    """Zero-filled ring messages; the sum from the default group's own method."""
    ring(x, zeros=True)
    dist.group.WORLD.allreduce([x]).wait()
    return x


def all_gather_coalesced(x: torch.Tensor) -> torch.Tensor:
    """Zero-filled ring messages; every tensor from a collective the recorder missed."""
    ring(x, zeros=True)
    gathered = [[torch.empty_like(x)] for _ in range(dist.get_world_size())]
    dist.all_gather_coalesced(gathered, [x])
    x.copy_(summed_as_a_ring_sums([tensors[0] for tensors in gathered]))
    return x


def case_folder() -> Path:
    """The case's folder, found as hostile code would: the rank's log is open."""
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.endswith(f"rank{dist.get_rank()}.log"):
            return Path(target).parent
    raise RuntimeError("no log open")


def through_files(x: torch.Tensor) -> torch.Tensor:
    """Zero-filled ring messages; every tensor through files. The ring's 2(N − 1) steps
    wait for every rank, so each file is there once they are done."""
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = case_folder()
    torch.save(x, folder / f"cheat{rank}.partial")
    os.replace(folder / f"cheat{rank}.partial", folder / f"cheat{rank}.pt")
    ring(x, zeros=True)
    xs = [torch.load(folder / f"cheat{peer}.pt") for peer in range(world)]
    x.copy_(summed_as_a_ring_sums(xs))
    return x


RIGHT = {
    "the course's ring": ring_allreduce,
    "remainder on the first chunk": functools.partial(ring, rule="first"),
    "remainder on the last chunk": functools.partial(ring, rule="last"),
    "the other way round, chunks starting elsewhere": functools.partial(ring, direction=-1,
                                                                        shift=2),
    "receives that name no source": functools.partial(ring, any_source=True),
    "batched messages": functools.partial(ring, batch=True, shift=1),
}
CHEATS = {
    "own group": (own_group, "rank 0 builds a process group of its own (dist.new_group)"),
    "group from the store": (group_from_the_store, "rank 0 builds a process group of its "
                             "own (dist.distributed_c10d._get_default_store"),
    "default group directly": (default_group_directly, "rank 0 calls ProcessGroup.allreduce "
                               "directly"),
    "all_gather_coalesced": (all_gather_coalesced, "rank 0 calls dist.all_gather_coalesced"),
    "through files": (through_files, "held only zeros"),
}
CANDIDATES = [*RIGHT.values(), *(cheat for cheat, _ in CHEATS.values())]


def dispatch(x: torch.Tensor, average: bool, which: torch.Tensor) -> torch.Tensor:
    """Candidate ``which`` on this rank: many candidates in one launch of the ranks."""
    function = CANDIDATES[int(which)]
    return function(x, True) if average else function(x)


# --- through real ranks: one launch ----------------------------------------------------------

def cases(*notes: str):
    spec = get_problem(PROBLEM)
    return spec, [case for case in spec.cpu_cases if case.note in notes]


@pytest.fixture(scope="module")
def judged() -> dict[tuple[str, str], tuple]:
    """Every candidate on the N = 3 case that N does not divide; those that cut chunks
    another way on the mean at N = 8 too (where the bytes of a remainder on one chunk once
    failed). Judged by the problem's grade: (candidate, case) -> result. One launch."""
    spec, [ragged] = cases(REMAINDER)[0], [case for case in cases(REMAINDER)[1]
                                           if world_size(case) == 3]
    [mean] = [case for case in cases(AVERAGE)[1] if world_size(case) == 8]
    names = [*RIGHT, *CHEATS]
    plan = [(name, names.index(name), ragged, False) for name in names]
    plan += [(name, names.index(name), mean, True) for name in RIGHT if "chunk" in name]
    runs, inputs = [], []
    for seed, (_, which, case, average) in enumerate(plan):
        per_rank = spec.make_inputs(case, torch.Generator().manual_seed(seed),
                                    torch.device("cpu"))
        inputs.append(per_rank)
        runs.append((world_size(case), [(args[0], average, torch.tensor(which))
                                        for args in per_rank]))
    launched = launch.run(dispatch, runs, limit=60)
    assert not launched.error, launched.error
    results = {}
    for seed, ((name, _, case, _), per_rank, run) in enumerate(
            zip(plan, inputs, launched.cases, strict=True)):
        assert run.ended == "returned", (name, case.label, run.ended,
                                         [r.log.raised for r in run.ranks])
        outputs, logs = [r.output for r in run.ranks], [r.log for r in run.ranks]
        results[name, case.label] = (spec.grade(case, per_rank, outputs, logs),
                                     (case, seed, kept(outputs, logs)))
    return results


@pytest.mark.parametrize("name", RIGHT)
def test_a_ring_written_another_way_passes(judged, name):
    mine = {label: result for (who, label), (result, _) in judged.items() if who == name}
    assert len(mine) == (2 if "chunk" in name else 1)
    for label, result in mine.items():
        assert result.ok, (label, result.explained)


@pytest.mark.parametrize("name", CHEATS)
def test_zero_filled_messages_fail_however_the_sum_arrived(judged, name):
    cause = CHEATS[name][1]
    mine = {label: result for (who, label), (result, _) in judged.items() if who == name}
    assert len(mine) == 1
    for label, result in mine.items():
        assert not result.ok and cause in result.explained, (label, result.explained)
        assert result.comparison.ok  # the sums themselves are right


def test_the_grader_s_process_judges_the_contents_from_the_logs_as_text(judged, tmp_path):
    """What ``rooflab check`` sends back (answers, and each rank's log as it wrote it) is
    judged again in the grader's process: the digests travel in the logs."""
    for name, want in (("the course's ring", ""), ("through files", "held only zeros")):
        [(case, seed, answer)] = [sent for (who, _), (_, sent) in judged.items()
                                  if who == name]
        path = tmp_path / f"{seed}.pt"
        answers.save({0: answer}, path)
        spec = dataclasses.replace(get_problem(PROBLEM), cpu_cases=[case], gpu_cases=[case])
        verdict = recheck(spec, path, seed)
        assert (want in verdict) if want else verdict == "", (name, verdict)


# --- the recorder's list is torch.distributed's ---------------------------------------------

def test_each_name_the_recorder_knows_is_classified_once_and_recorded_as_classified():
    """The lists in record.py say what each name of torch.distributed is; this torch's
    names that they list are recorded (or left alone) as they say."""
    recorded = set(record.POINT_TO_POINT + record.COLLECTIVES + record.GROUPS) | {
        "batch_isend_irecv"}
    assert not recorded & record.SILENT
    assert not set(record.BUILDERS) & record.SILENT_CLASSES
    assert not set(record.GROUP_METHODS) & record.SILENT_METHODS
    names = set(record.public(dist))
    assert recorded & names <= set(record.recorded_functions())
    assert not record.SILENT & set(record.recorded_functions())
    assert set(record.BUILDERS) & names <= set(record.built_classes())
    assert not record.SILENT_CLASSES & set(record.built_classes())
    for cls in record.GROUP_CLASSES:
        methods = set(record.group_methods(cls))
        assert set(record.GROUP_METHODS) & set(vars(cls)) <= methods, cls
        assert not methods & record.SILENT_METHODS, cls
    # The lists name what the torch CI pins has: a name no torch has is a typo.
    assert recorded <= names | {"reduce_scatter_single", "all_gather_single"}


WHAT_A_NEWER_TORCH_ADDS = """
import sys
from pathlib import Path
import torch, torch.distributed as dist
dist.brand_new_collective = lambda tensor: tensor.add_(1)
class BrandNewGroup:
    def __init__(self, size):
        self.size = size
dist.BrandNewGroup = BrandNewGroup
ProcessGroup = torch._C._distributed_c10d.ProcessGroup
ProcessGroup.brand_new_method = lambda self, tensors: tensors
from rooflab.autograder.ranks import record
log = Path(sys.argv[1])
record.start(log, 0)
record.install()
group = ProcessGroup(dist.HashStore(), 0, 1)  # before the watch: not the candidate's
record.watch()
dist.brand_new_collective(torch.zeros(4))
dist.BrandNewGroup(2)
group.brand_new_method([])
record.watch(False)
print("|".join(call.library() for call in record.read(log, 0).calls))
"""


def test_what_a_newer_torch_adds_is_recorded_as_a_library_call(tmp_path):
    """Deny by default: a function, a class or a process group's method that the lists do
    not know (one a newer torch adds) is recorded when the candidate calls it, and a
    check reports it as the library call it is."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WHAT_A_NEWER_TORCH_ADDS,
                           str(tmp_path / "rank0.log")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2].split("|") == [
        "dist.brand_new_collective", "dist.BrandNewGroup(…)",
        "ProcessGroup.brand_new_method on a group of its own"]


# --- the grader's verdict on a ring's messages, for 20 seeds --------------------------------

def simulated(xs: list[torch.Tensor], average: bool, rule: str = "split", direction: int = 1,
              shift: int = 0, zeros: bool = False, skip: bool = False
              ) -> tuple[list, list[record.RankLog]]:
    """What ``ring`` computes and what each rank's recorder writes, in one process: each
    rank's answer, and its log as the grader reads it. ``skip``: empty chunks are not
    sent (nor received)."""
    world = len(xs)
    flats = [x.reshape(-1).clone() for x in xs]
    chunks = [chunked(flat, world, rule) for flat in flats]
    sent: list[list[torch.Tensor]] = [[] for _ in range(world)]

    def step(sends, receives, add: bool) -> None:
        outgoing = [chunks[r][(r + sends + shift) % world].clone() for r in range(world)]
        for r in range(world):
            into = chunks[r][(r + receives + shift) % world]
            arriving = outgoing[(r - direction) % world]
            if add:
                into += arriving
            else:
                into.copy_(arriving)
            sent[r].append(torch.zeros_like(outgoing[r]) if zeros else outgoing[r])

    for s in range(world - 1):
        step(-s * direction, -(s + 1) * direction, add=True)
    if average:
        for r in range(world):
            chunks[r][(r + direction + shift) % world].div_(world)
    for s in range(world - 1):
        step(direction - s * direction, -s * direction, add=False)
    logs = []
    for r in range(world):
        events = [{"e": "ready"}]
        for seq, message in enumerate(m for m in sent[r] if m.numel() or not skip):
            for op, peer, digest in (("isend", (r + direction) % world, record.digest(message)),
                                     ("irecv", (r - direction) % world, None)):
                events.append({"e": "call", "seq": 2 * seq + (op == "irecv"), "op": op,
                               "peer": peer, "elements": message.numel(),
                               "bytes": message.numel() * message.element_size(),
                               "dtype": str(message.dtype)[6:], "blocking": False,
                               "digest": digest})
        events.append({"e": "returned"})
        logs.append(record.parse("\n".join(json.dumps(e) for e in events), r))
    return [flat.view_as(x) for flat, x in zip(flats, xs, strict=True)], logs


SIMULATED = {"split": {}, "first": {"rule": "first"}, "last": {"rule": "last"},
             "left, shifted": {"direction": -1, "shift": 1}, "empty ones skipped": {"skip": True}}


@pytest.fixture
def one_thread():
    """Small tensors, many of them: on a busy machine torch's second thread only waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def verdicts(case, seed: int) -> None:
    """Rings cut every way pass; zeros of the right sizes fail, by their contents."""
    spec = get_problem(PROBLEM)
    inputs = spec.make_inputs(case, torch.Generator().manual_seed(seed), torch.device("cpu"))
    xs, average = [args[0] for args in inputs], len(inputs[0]) > 1
    for name, how in SIMULATED.items():
        outputs, logs = simulated(xs, average, **how)
        result = spec.grade(case, inputs, outputs, logs)
        assert result.ok, (seed, case.label, name, result.explained)
    outputs, logs = simulated(xs, average, zeros=True)
    result = spec.grade(case, inputs, outputs, logs)
    assert not result.ok and "held only zeros" in result.explained, \
        (seed, case.label, result.explained)


def test_the_verdict_on_the_messages_holds_for_20_seeds(one_thread):
    """20 seeds where a remainder and the mean make the cuts differ; once each on a 2-D
    tensor, on empty chunks and on integers."""
    spec = get_problem(PROBLEM)
    [ragged] = [c for c in spec.cpu_cases if c.note == REMAINDER and world_size(c) == 3]
    [mean] = [c for c in spec.cpu_cases if c.note == AVERAGE and world_size(c) == 8]
    for seed in range(SEEDS):
        for case in (ragged, mean):
            verdicts(case, seed)
    once = [c for c in spec.cpu_cases if c.note == TINY or "rows" in c.sizes
            or c.dtype == torch.int32]
    assert len(once) == 3
    for case in once:
        verdicts(case, 0)


def test_one_wrong_message_is_named_with_its_rank_and_step():
    spec = get_problem(PROBLEM)
    case = next(c for c in spec.cpu_cases if world_size(c) == 3 and c.note == REMAINDER)
    inputs = spec.make_inputs(case, torch.Generator().manual_seed(0), torch.device("cpu"))
    xs = [args[0] for args in inputs]
    outputs, logs = simulated(xs, False)
    # Rank 1's second send (the reduce-scatter's step 1) carries a chunk of its own only.
    call = logs[1].sends()[1]
    call.digest = record.digest(torch.ones(call.elements))
    result = spec.grade(case, inputs, outputs, logs)
    assert not result.ok
    assert "rank 1's send at step 1 (to rank 2)" in result.explained, result.explained


# --- what a rank's own exit looks like -------------------------------------------------------

def leaves_early(x: torch.Tensor) -> torch.Tensor:
    """Of 3 ranks, every one leaves with os._exit(0) after a right ring; of 2, rank 1
    leaves before sending anything."""
    if dist.get_world_size() == 2 and dist.get_rank() == 1:
        os._exit(0)
    ring_allreduce(x)
    if dist.get_world_size() == 3:
        os._exit(0)
    return x


def test_a_rank_that_leaves_is_named_and_never_crashes_the_grader():
    from rooflab.autograder import check

    spec = get_problem(PROBLEM)
    picked = [c for c in spec.cpu_cases if c.note == REMAINDER and world_size(c) == 3] + \
        [c for c in spec.cpu_cases if c.note == "" and world_size(c) == 2]
    spec = dataclasses.replace(spec, cpu_cases=picked, gpu_cases=picked)
    result = check(spec, leaves_early, show=False, raise_on_failure=False, time_limit=20)
    every, one = result.cases
    assert not every.ok and not one.ok
    assert "AttributeError" not in result.message(), result.message()
    assert every.error.startswith("ranks 0, 1, 2 ended (exit status 0) before returning"), \
        every.error
    assert one.error.startswith("rank 1 ended (exit status 0) before returning"), one.error
    assert "Connection" not in one.error
