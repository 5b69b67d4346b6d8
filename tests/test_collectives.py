"""collectives/ring_allreduce on real gloo processes: the course's ring passes; the naive
all-reduce, a tree, a ring that drops the remainder, one that calls dist.all_reduce and
one with a step too many each fail with their cause named; a deadlock and an exception on
one rank are reported rank by rank, and leave no process behind."""

from __future__ import annotations

import _thread
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from mutants import mutant

from rooflab.autograder import check, get_problem
from rooflab.autograder.problems.collectives import EXACT_NOTE, ring_order
from rooflab.autograder.ranks import forkserver, launch
from rooflab.kernels import collectives
from rooflab.kernels.collectives import ring_allreduce

PROBLEM = "collectives/ring_allreduce"


def spec_with(*worlds: int, notes: tuple[str, ...] = ()):
    """The problem cut down to its cases of these world sizes (and notes, if given)."""
    spec = get_problem(PROBLEM)
    cases = [case for case in spec.cpu_cases if case.sizes["ranks"] in worlds
             and (not notes or case.note in notes)]
    assert cases
    return dataclasses.replace(spec, cpu_cases=cases, gpu_cases=cases)


def grade(spec, fn, **options):
    return check(spec, fn, show=False, raise_on_failure=False, **options)


class Watch:
    """Every process started with ``mark`` in its environment, seen while it ran (polled
    from a thread): to check afterwards that each is gone, reaped, not even a zombie."""

    def __init__(self, mark: str):
        self.mark, self.pids = mark, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            self.pids.update(alive_with(self.mark))

    def left_behind(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        self.pids.discard(forkserver.running())  # seen while it started, before it was known
        return [pid for pid in self.pids if not gone(pid)] + alive_with(self.mark)


@pytest.fixture
def watch(monkeypatch) -> Watch:
    """A mark in the environment of every process a check starts from here on, and a
    watch on them."""
    mark = f"rooflab-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("ROOFLAB_TEST_MARK", mark)
    return Watch(mark)


def alive_with(mark: str) -> list[int]:
    """Processes whose environment carries ``mark`` (this process's own, read from
    /proc, is the one it started with, so it is never among them), but for this process's
    fork server, which is there to outlive a launch (``test_forkserver.py`` tests it)."""
    found = []
    server = forkserver.running()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != server:
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                pass
    return found


def gone(pid: int) -> bool:
    """No such process, not even a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- learners' versions ----------------------------------------------------------------------

def tree_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Recursive doubling: log2 N exchanges of the whole tensor with rank ^ distance."""
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.contiguous().view(-1)
    incoming = torch.empty_like(flat)
    distance = 1
    while distance < world:
        for request in (dist.isend(flat, rank ^ distance), dist.irecv(incoming, rank ^ distance)):
            request.wait()
        flat += incoming
        distance *= 2
    return x


def library_all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def raises_on_rank_2(x: torch.Tensor) -> torch.Tensor:
    if dist.get_rank() == 2:
        raise RuntimeError("rank 2 lost its way")
    return ring_allreduce(x)


def stub(x: torch.Tensor) -> torch.Tensor:
    # YOUR CODE HERE
    raise NotImplementedError()


# --- the order of the sums, without processes ---------------------------------------------

def simulated_ring(xs: torch.Tensor, starts: list[int], direction: int) -> torch.Tensor:
    """What a ring computes in fp32: chunk c summed around the ring from rank starts[c]."""
    n, size = xs.shape
    out = torch.empty(size)
    for chunk, where in enumerate(torch.arange(size).tensor_split(n)):
        total = xs[starts[chunk], where].clone()
        for hop in range(1, n):
            total += xs[(starts[chunk] + direction * hop) % n, where]
        out[where] = total
    return out


@pytest.mark.parametrize("direction", [1, -1])
def test_any_ring_order_is_accepted_and_a_naive_or_tree_order_is_not(direction):
    torch.manual_seed(0)
    xs = torch.randn(4, 1001)
    for starts in ([0, 1, 2, 3], [1, 2, 3, 0], [3, 0, 2, 1]):  # any chunk may start anywhere
        assert ring_order(xs, simulated_ring(xs, starts, direction)) == ""
    naive = xs[0] + xs[1] + xs[2] + xs[3]
    assert "every element is summed in the same order, from rank 0 on" in ring_order(xs, naive)
    tree = (xs[0] + xs[1]) + (xs[2] + xs[3])
    assert "summed in no ring's order" in ring_order(xs, tree)
    in_float64 = xs.double().sum(0).float()
    assert "summed in no ring's order" in ring_order(xs, in_float64)
    two_chunks_one_start = simulated_ring(xs, [0, 0, 2, 3], direction)
    assert "stretches" in ring_order(xs, two_chunks_one_start)


# --- the problem and the course's ring ---------------------------------------------------

def test_the_cases_cover_every_world_size_and_sizes_that_do_not_divide():
    cases = get_problem(PROBLEM).cpu_cases
    assert {case.sizes["ranks"] for case in cases} == {2, 3, 4, 5, 8}

    def size(case):
        return torch.Size([v for k, v in case.sizes.items() if k != "ranks"]).numel()

    ragged = {case.sizes["ranks"] for case in cases if size(case) % case.sizes["ranks"]}
    assert {3, 4, 8} <= ragged  # where a dropped remainder shows
    assert any(size(case) < case.sizes["ranks"] for case in cases)  # empty chunks
    assert {torch.int64, torch.int32} <= {case.dtype for case in cases}  # exact answers


def test_the_course_ring_passes_on_every_case():
    result = grade(get_problem(PROBLEM), ring_allreduce)
    assert result.passed, result.message()
    assert len(result.cases) == len(get_problem(PROBLEM).cpu_cases)


def test_the_course_ring_runs_unchanged_under_torchrun():
    """Outside the grader, as on a multi-GPU machine (NCCL there, gloo here)."""
    environment = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"} if sys.platform == "linux" \
        else dict(os.environ)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=3", "-m", "rooflab.kernels.collectives",
                           "--size", "1001"], capture_output=True, text=True, timeout=300,
                          env=environment)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 ranks on " in done.stdout and "1,001 elements each" in done.stdout
    assert "float32: ring_allreduce matches dist.all_reduce" in done.stdout
    assert "int64: ring_allreduce matches dist.all_reduce" in done.stdout


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_torchrun_group_is_gone_after_destroy_even_when_dynamo_loads_late():
    """An optimizer's first step imports torch._dynamo, and with it default arguments that
    hold the default group. Unless ``join_torchrun_group`` forestalls that, gloo's threads
    outlive ``destroy_process_group`` and now and then abort the process at exit."""
    script = (
        "import os, socket, torch\n"
        "import torch.distributed as dist\n"
        "from rooflab.kernels.collectives import join_torchrun_group\n"
        "threads = lambda: len(os.listdir('/proc/self/task'))\n"
        "before = threads()\n"
        "join_torchrun_group()\n"
        "dist.all_reduce(torch.ones(3))\n"
        "import torch._dynamo\n"
        "dist.destroy_process_group()\n"
        "print(before, threads())\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                   "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=environment)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.split()
    assert after == before, f"{int(after) - int(before)} threads of the group left running"


# --- each classic bug fails with its cause named ------------------------------------------

def test_the_naive_all_reduce_fails_on_its_messages_at_n2_and_its_order_at_n3():
    result = grade(spec_with(2, 3), collectives.naive_all_reduce)
    message = result.message()
    assert not result.passed
    # N = 2: the same bytes as a ring, but one message of the whole tensor
    assert "rank 0 made 1 send and 1 receive: a ring all-reduce takes 2(N − 1) = 2 steps" \
        in message
    assert "sends 4,096 elements in one message" in message
    # N = 3: every element summed from rank 0 on, and messages both ways round
    assert "every element is summed in the same order, from rank 0 on" in message
    assert "rank 0 sends to both its neighbours" in message


def test_a_tree_fails_on_its_order_and_its_partners():
    result = grade(spec_with(2, 4), tree_all_reduce)
    message = result.message()
    assert not result.passed
    assert "made 1 send and 1 receive" in message  # N = 2
    assert "summed in no ring's order" in message  # N = 4: (x0 + x1) + (x2 + x3)
    assert "rank 0 sends to rank 2" in message


def test_a_dropped_remainder_fails_only_where_n_does_not_divide_the_size(tmp_path):
    dropping = mutant(tmp_path, "collectives", (
        "chunks = flat.tensor_split(world)",
        "size = flat.numel() // world\n"
        "    chunks = [flat[i * size:(i + 1) * size] for i in range(world)]"),
        name="dropping_collectives").ring_allreduce
    result = grade(spec_with(2, 3), dropping)
    assert [case.ok for case in result.cases] == [True, False], result.message()
    assert "only the last element is wrong, n mod N = 3001 mod 3" in result.message()


def test_with_fewer_elements_than_ranks_the_remainder_is_named_only_for_empty_messages(
        tmp_path):
    # n = 6 on 8 ranks: n // N = 0. A ring cut by tensor_split that overwrites instead of
    # adding is wrong everywhere too, but its messages are not empty: no remainder advice.
    overwriting = mutant(tmp_path, "collectives", ("theirs += incoming",
                                                   "theirs.copy_(incoming)"),
                         name="overwriting_tiny_collectives").ring_allreduce
    message = grade(spec_with(8, notes=("fewer elements than ranks",)),
                    overwriting).message()
    assert "remainder" not in message and "n // N" not in message, message
    dropping = mutant(tmp_path, "collectives", (
        "chunks = flat.tensor_split(world)",
        "size = flat.numel() // world\n"
        "    chunks = [flat[i * size:(i + 1) * size] for i in range(world)]"),
        name="dropping_tiny_collectives").ring_allreduce
    message = grade(spec_with(8, notes=("fewer elements than ranks",)), dropping).message()
    assert "every message was empty: chunks of n // N = 6 // 8 = 0 elements" in message


@pytest.mark.parametrize("slip, lines, words", [
    ("overwrite", ("theirs += incoming", "theirs.copy_(incoming)"),
     "rank 0's send at step 1 (to rank 1) does not carry what a ring sends there, "
     "elements 2,001 to 3,000 summed over ranks 2, 0"),
    ("gather_off_by_one", (
        "done, arriving = chunks[(rank + 1 - step) % world], chunks[(rank - step) % world]",
        "done, arriving = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]"),
     "rank 0's send at step 2 carries 1,001 elements, where a ring sends the finished "
     "sum of elements 1,001 to 2,000 (1,000 elements)"),
])
def test_a_wrong_sum_names_the_first_message_that_parted_from_the_ring(tmp_path, slip,
                                                                      lines, words):
    wrong = mutant(tmp_path, "collectives", lines, name=f"{slip}_collectives").ring_allreduce
    result = grade(spec_with(3), wrong)
    assert not result.passed
    assert "relative error" in result.message() and words in result.message(), \
        result.message()


def misspelt_split(x: torch.Tensor, average: bool = False) -> torch.Tensor:
    x.view(-1).tensor_split("4")  # a TypeError on every rank, in every case
    return x


def test_one_error_on_every_rank_of_every_case_is_said_once():
    result = grade(get_problem(PROBLEM), misspelt_split)
    lines = result.message().splitlines()
    error = "every rank raised TypeError: tensor_split() received an invalid combination"
    assert sum(error in line for line in lines) == 2, lines  # the verdict line and its case
    assert sum("traceback" in line for line in lines) == 1
    first = result.cases[0].label
    assert [line.strip() for line in lines if line.startswith("  FAIL")][1:] == [
        f"FAIL {case.label}: the same as on {first}" for case in result.cases[1:]]
    assert len(lines) <= len(result.cases) + 8, lines


def test_a_ring_that_calls_dist_all_reduce_fails_though_its_sums_are_right():
    result = grade(spec_with(4, 5, notes=("", EXACT_NOTE)), library_all_reduce)
    assert not result.passed
    assert "rank 0 calls dist.all_reduce: the exercise is to build the all-reduce" \
        in result.message()
    # Its answers are right: the integer cases' exact sums are dist.all_reduce's.
    assert {case.case.dtype for case in result.cases} == {torch.float32, torch.int64,
                                                          torch.int32}
    assert all(case.comparison is not None and case.comparison.ok for case in result.cases)


def test_a_ring_with_a_step_too_many_fails_on_its_count(tmp_path):
    extra = mutant(tmp_path, "collectives", ("for step in range(world - 1):  # all-gather",
                                             "for step in range(world):  # all-gather"),
                   name="extra_step_collectives").ring_allreduce
    result = grade(spec_with(3), extra)
    assert not result.passed
    assert result.worst_case.comparison.ok  # the sum is right: the count fails it
    assert "rank 0 made 5 sends and 5 receives: a ring all-reduce takes 2(N − 1) = 4 " \
        "steps" in result.message()


def test_the_stub_is_not_implemented():
    result = grade(spec_with(2), stub)
    assert result.verdict == "NOT IMPLEMENTED", result.message()


def not_implemented_on_rank_0(x: torch.Tensor) -> torch.Tensor:
    if dist.get_rank() == 0:
        raise NotImplementedError()
    return ring_allreduce(x)


def test_the_launcher_runs_no_case_after_one_where_every_rank_is_a_stub():
    # Each case left would fork and join its ranks only for the grader to ignore them.
    cases = [(world, [(torch.ones(7),)] * world) for world in (2, 3, 4)]
    launched = launch.run(stub, cases, limit=30)
    assert [case.ended for case in launched.cases] == ["a rank failed", "not run", "not run"]
    # A stub on one rank only is a failure like any other: every case still runs.
    launched = launch.run(not_implemented_on_rank_0, cases[:2], limit=30)
    assert [case.ended for case in launched.cases] == ["a rank failed", "a rank failed"]


def test_a_function_that_cannot_go_to_the_ranks_says_why():
    lock = threading.Lock()

    def holds_a_lock(x):
        with lock:
            return x

    result = grade(spec_with(2), holds_a_lock)
    assert not result.passed
    assert "cannot be sent to the rank processes: it uses `lock` (a _thread.lock), which " \
        "cannot be copied to another process" in result.causes[0], result.causes[0]


def c10d_ring(x: torch.Tensor, average: bool = False) -> torch.Tensor:
    """The ring written on c10d's own operators, with the boxed process group."""
    group = dist.distributed_c10d._get_default_group().boxed()
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.reshape(-1).clone()
    chunks = flat.tensor_split(world)
    right, left = (rank + 1) % world, (rank - 1) % world
    for gathering in (False, True):
        for step in range(world - 1):
            mine, theirs = (rank - step + gathering) % world, (rank - step - 1 + gathering) % world
            arrived = torch.empty_like(chunks[theirs])
            sent = torch.ops.c10d.send([chunks[mine].clone()], group, right, 0)
            torch.ops.c10d.recv_([arrived], group, left, 0).wait()
            sent.wait()
            chunks[theirs].copy_(arrived) if gathering else chunks[theirs].add_(arrived)
    out = flat.view_as(x)
    return out / world if average else out


def gathers_through_c10d(x: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Every rank's tensor by c10d's all-gather operator, summed at home."""
    world = dist.get_world_size()
    gathered = torch.empty(world * x.numel(), dtype=x.dtype)
    _, work = torch.ops.c10d._allgather_base_(
        gathered, x.reshape(-1), dist.distributed_c10d._get_default_group().boxed(), False, -1)
    work.wait()
    total = gathered.view(world, -1).sum(0).view_as(x)
    return total / world if average else total


def test_c10d_s_operators_called_directly_are_recorded_as_the_calls_they_are():
    """torch.ops.c10d with a boxed group goes past torch.distributed's functions: its
    operators are recorded at the dispatcher. A ring on them passes on its messages, and
    an all-gather through them is the library call it is (it was recorded as nothing)."""
    spec = get_problem("collectives/ring_allreduce")
    result = grade(spec, c10d_ring)
    assert result.passed, result.message()
    result = grade(spec, gathers_through_c10d)
    assert not result.passed
    assert "calls all_gather_into_tensor (torch.ops.c10d directly)" in result.causes[0], \
        result.causes[0]


def test_a_function_that_names_torch_s_operators_travels_to_the_ranks():
    """torch.ops' namespaces and operators hold C++ handles no pickle copies: they travel
    by name. Before, naming one failed as "cannot pickle '_Ops' object"."""
    from rooflab.autograder.ranks import transport

    ops, c10d, add = torch.ops, torch.ops.c10d, torch.ops.aten.add

    def names_operators(x):
        assert ops.aten is torch.ops.aten and c10d.allreduce_ is torch.ops.c10d.allreduce_
        return ring_allreduce(add.Tensor(x, torch.zeros_like(x)))

    for op in (ops, c10d, c10d.allreduce_, c10d.allreduce_.default, add.Tensor):
        assert transport.unpack(transport.pack(op)) is op
    result = grade(spec_with(2), names_operators)
    assert result.passed, result.message()


# --- hangs and crashes -------------------------------------------------------------------

def test_a_deadlock_is_stopped_at_the_time_limit_and_reported_rank_by_rank(watch):
    started = time.monotonic()
    result = grade(spec_with(4, notes=("",)), collectives.ring_allreduce_deadlock,
                   time_limit=2)
    took = time.monotonic() - started
    message = result.message()
    assert not result.passed and took < 30, (took, message)
    assert "ran past the time limit of 2 s" in message
    assert "every rank is blocked in a send, and none receives: a deadlock" in message
    for rank in range(4):
        assert f"rank {rank} blocked in send to rank {(rank + 1) % 4} at step 0" in message
    assert "dist.send(chunks[(rank - step) % world], right)" in message  # the line
    assert "Post the send and the receive together" in message
    left = watch.left_behind()
    assert len(watch.pids) >= 5 and not left  # the launcher and 4 ranks


def test_an_exception_on_rank_2_is_reported_with_its_traceback(watch):
    result = grade(spec_with(4, notes=("",)), raises_on_rank_2)
    message = result.message()
    assert not result.passed
    assert result.causes[0].startswith("wrong on ranks=4 n=4096 fp32: rank 2 raised "
                                       "RuntimeError: rank 2 lost its way (at "
                                       "test_collectives.py:"), message
    assert 'raise RuntimeError("rank 2 lost its way")' in message  # its line
    assert "rank 2's traceback:" in message
    # The others are shown waiting for rank 2, not failing for want of it.
    assert "rank 1 blocked waiting for its isend to rank 2 at step 0" in message
    assert "Connection closed" not in message
    assert watch.pids and not watch.left_behind()


def test_an_interrupted_check_leaves_no_process(watch):
    """Jupyter's stop button: a KeyboardInterrupt while the ranks hang with no limit."""

    def interrupt_once_the_ranks_run():
        deadline = time.monotonic() + 60
        while len(alive_with(watch.mark)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the launcher and its 2 ranks
        time.sleep(0.5)
        _thread.interrupt_main()

    # As in a Jupyter kernel, Python handles SIGINT here, even where this test was started
    # in the background of a shell, which starts it ignored (interrupt_main then does
    # nothing, and the ranks, with no limit, would wait forever).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_the_ranks_run, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            grade(spec_with(2), collectives.ring_allreduce_deadlock, time_limit=0)
    finally:
        signal.signal(signal.SIGINT, previous)
    left = watch.left_behind()
    assert len(watch.pids) == 3 and not left


def test_every_process_of_a_launch_is_reaped_after_a_crash_and_a_hang():
    def crash_then_hang(x):
        if dist.get_world_size() == 3:
            if dist.get_rank() == 1:
                os._exit(3)
            dist.recv(x, 1)  # waits for the rank that is gone
            return x
        return collectives.ring_allreduce_deadlock(x)

    cases = [(3, [(torch.ones(8),)] * 3), (4, [(torch.ones(8),)] * 4), (2, [(torch.ones(8),)] * 2)]
    run = launch.run(crash_then_hang, cases, limit=1.5)
    crashed, hung, skipped = run.cases
    assert crashed.ended == "a rank failed"
    assert crashed.ranks[1].status == 3 and not crashed.ranks[1].killed
    # The others never return: ended by the launcher, or (one still joining the group when
    # its peer vanished) by gloo's own error.
    assert all(rank.killed or rank.status not in (0, None)
               for rank in (crashed.ranks[0], crashed.ranks[2]))
    assert hung.ended == "time limit" and all(rank.killed for rank in hung.ranks)
    assert skipped.ended == "not run"  # after a hang the launcher stops
    assert len(run.pids) == 1 + 3 + 4
    assert all(gone(pid) for pid in run.pids), [pid for pid in run.pids if not gone(pid)]


def test_a_launcher_that_never_gets_going_is_stopped_and_fails_the_check(
        tmp_path, monkeypatch, watch):
    (tmp_path / "slow_to_import.py").write_text(
        "import os, time\nif os.environ.get('SLOW_TO_IMPORT'):\n    time.sleep(600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_to_import  # here, quickly; in the launcher, forever

    def uses_it(x):
        return slow_to_import, x

    monkeypatch.setenv("SLOW_TO_IMPORT", "1")
    monkeypatch.setattr(launch, "START_S", 1.0)
    monkeypatch.setattr(launch, "SLACK_S", 0.0)
    monkeypatch.setattr(launch, "JOIN_S", 1.0)
    result = grade(spec_with(2), uses_it, time_limit=1)
    assert not result.passed
    assert "not run: the rank processes were stopped" in result.message()
    assert watch.pids and not watch.left_behind()


def test_every_call_is_recorded_once_with_its_peer_bytes_and_order():
    def talk(x):
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        incoming = torch.empty_like(x)
        for request in (dist.isend(x, right), dist.irecv(incoming, left)):
            request.wait()
        ops = [dist.P2POp(dist.isend, x[:3].clone(), right),
               dist.P2POp(dist.irecv, incoming[:3], left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        if rank == 0:  # blocking, in an order that cannot deadlock
            dist.send(x, right)
            dist.recv(incoming, left)
        else:
            dist.recv(incoming, left)
            dist.send(x, right)
        dist.all_reduce(x)
        return x

    run = launch.run(talk, [(3, [(torch.ones(5, dtype=torch.float64),)] * 3)], limit=30)
    (case,) = run.cases
    assert case.ended == "returned", case
    calls = [(c.op, c.peer, c.bytes, c.step, c.via) for c in case.ranks[0].log.calls]
    assert calls == [("isend", 1, 40, 0, ""), ("irecv", 2, 40, 0, ""),
                     ("isend", 1, 24, 1, "batch_isend_irecv"),
                     ("irecv", 2, 24, 1, "batch_isend_irecv"),
                     ("send", 1, 40, 2, ""), ("recv", 2, 40, 2, ""),
                     ("all_reduce", None, 40, 0, "")]
    assert case.ranks[0].log.calls[0].at[2] == "talk"  # the learner's frame
    assert torch.equal(case.ranks[2].output, torch.full((5,), 3.0, dtype=torch.float64))


# --- average=True: the mean over ranks ------------------------------------------------------

def sum_for_the_mean(x: torch.Tensor, average: bool = False) -> torch.Tensor:
    return ring_allreduce(x)


def mean_divided_twice(x: torch.Tensor, average: bool = False) -> torch.Tensor:
    ring_allreduce(x, average)
    if average:
        x /= dist.get_world_size()
    return x


def mean_divided_at_the_end(x: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Every rank divides the whole sum: more divisions than needed, the same bits."""
    ring_allreduce(x)
    if average:
        x /= dist.get_world_size()
    return x


MEANS = (mean_divided_at_the_end, sum_for_the_mean, mean_divided_twice)


def one_of_the_means(x: torch.Tensor, average: bool, which: torch.Tensor) -> torch.Tensor:
    return MEANS[int(which)](x, average)


def test_the_mean_is_graded_and_its_slips_are_named():
    """The three on both cases of the mean, in one launch of the ranks, each case judged
    by the problem's grade as a check judges it."""
    from rooflab.autograder.problems.collectives import AVERAGE

    spec = spec_with(4, 8, notes=(AVERAGE,))
    assert len(spec.cpu_cases) == 2
    plan = [(which, case) for which in range(len(MEANS)) for case in spec.cpu_cases]
    inputs = [spec.make_inputs(case, torch.Generator().manual_seed(index), torch.device("cpu"))
              for index, (_, case) in enumerate(plan)]
    launched = launch.run(one_of_the_means, [
        (case.sizes["ranks"], [(*args, torch.tensor(which)) for args in per_rank])
        for (which, case), per_rank in zip(plan, inputs, strict=True)], limit=60)
    said = {function: [] for function in MEANS}
    for (which, case), per_rank, run in zip(plan, inputs, launched.cases, strict=True):
        assert run.ended == "returned", run.ended
        said[MEANS[which]].append(spec.grade(case, per_rank, [r.output for r in run.ranks],
                                             [r.log for r in run.ranks]))
    assert all(result.ok for result in said[mean_divided_at_the_end]), \
        [result.explained for result in said[mean_divided_at_the_end]]
    for function, words in ((sum_for_the_mean, "the sum, not the mean: divide each summed "
                                               "chunk by N once"),
                            (mean_divided_twice, "divided by N twice")):
        assert all(not result.ok and words in result.explained for result in said[function]), \
            [result.explained for result in said[function]]


def originals_in_reach(x: torch.Tensor) -> torch.Tensor:
    """On a rank: which recorded functions still hand out the unrecorded original as
    ``__wrapped__``, and whether all_reduce still shows its own signature."""
    import inspect

    import torch.distributed as dist

    recorded = [dist.all_reduce, dist.send, dist.batch_isend_irecv,
                dist.all_gather_into_tensor, type(dist.group.WORLD).allreduce]
    signature = list(inspect.signature(dist.all_reduce).parameters)[:2]
    return torch.tensor([hasattr(f, "__wrapped__") for f in recorded]
                        + [signature == ["tensor", "op"]])


def test_no_recorded_function_hands_out_its_original():
    from rooflab.autograder.ranks import on_ranks

    (run,) = on_ranks(originals_in_reach, 1, torch.ones(1))
    assert run.output.tolist() == [False] * 5 + [True], run.output
