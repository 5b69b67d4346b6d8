"""The fork server: one warm process per grader forks every launcher, each in a process
group of its own, holding none of the server's pipe; a server that dies is replaced, and
one whose grader dies ends with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rooflab.autograder.ranks import forkserver, launch

pytestmark = pytest.mark.skipif(not forkserver.AVAILABLE, reason="Linux's pidfds")


def _parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


def lineage(x: torch.Tensor) -> torch.Tensor:
    """On a rank: its launcher, the launcher's parent, and the launcher's process group."""
    launcher = os.getppid()
    return torch.tensor([launcher, _parent_of(launcher), os.getpgid(launcher)])


def pipes_held(x: torch.Tensor) -> torch.Tensor:
    """On a rank: the inode of every pipe among its open files."""
    inodes = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("pipe:["):
            inodes.append(int(target[6:-1]))
    return torch.tensor(inodes + [-1])


def sees_variable(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor([os.environ.get("ROOFLAB_FORKSERVER_TEST") == "set"])


def kills_the_server(x: torch.Tensor) -> torch.Tensor:
    os.kill(_parent_of(os.getppid()), 9)
    time.sleep(5)
    return x


def once(function, world: int = 2):
    launched = launch.run(function, [(world, [(torch.ones(1),)] * world)], limit=30)
    assert not launched.error and launched.cases[0].ended == "returned", launched
    return launched


def test_every_launcher_is_forked_by_one_server_in_a_group_of_its_own():
    first, second = once(lineage), once(lineage)
    server = forkserver.running()
    for launched in (first, second):
        launcher, parent, group = launched.cases[0].ranks[0].output.tolist()
        assert launcher == launched.pids[0] and parent == server and group == launcher
    assert first.pids[0] != second.pids[0]


def test_no_rank_holds_the_server_s_pipe():
    once(lineage)
    server = forkserver._server.process
    pipe = {os.fstat(server.stdin.fileno()).st_ino, os.fstat(server.stdout.fileno()).st_ino}
    held = set(once(pipes_held).cases[0].ranks[0].output.tolist())
    assert not held & pipe, (held, pipe)


def test_the_grader_s_environment_reaches_the_ranks_through_a_new_server(monkeypatch):
    once(lineage)
    before = forkserver.running()
    monkeypatch.setenv("ROOFLAB_FORKSERVER_TEST", "set")
    assert once(sees_variable).cases[0].ranks[0].output.tolist() == [True]
    assert forkserver.running() != before and _gone(before)


def test_a_rank_that_kills_the_server_fails_its_run_and_a_new_server_runs_the_next():
    once(lineage)
    killed = forkserver.running()
    launched = launch.run(kills_the_server, [(2, [(torch.ones(1),)] * 2)], limit=30)
    assert launched.cases[0].ended != "returned" or launched.error
    assert all(_gone(pid) for pid in launched.pids)
    parent = once(lineage).cases[0].ranks[0].output.tolist()[1]
    assert parent == forkserver.running() and parent != killed


def test_the_server_ends_with_its_grader():
    grader = subprocess.run(
        [sys.executable, "-c",
         "import os, torch\n"
         "from rooflab.autograder.ranks import forkserver, launch\n"
         "launch.run(abs, [(2, [(torch.ones(1),)] * 2)], limit=30)\n"
         "print(forkserver.running(), flush=True)\n"
         "os._exit(0)  # no atexit: as a kernel that is killed\n"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    server = int(grader.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while not _gone(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(server)


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie whose new parent has not reaped it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_one_server_serves_test_after_test(monkeypatch):
    """pytest names the test under way in PYTEST_CURRENT_TEST: the server stays."""
    before = once(lineage).cases[0].ranks[0].output.tolist()[1]
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")
    after = once(lineage).cases[0].ranks[0].output.tolist()[1]
    assert before == after == forkserver.running()
