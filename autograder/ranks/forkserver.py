"""A warm process that forks launchers: torch imported once per grader, not once a check.

A launcher that starts as a fresh Python spends some 3 s importing torch and the harness
before it forks a rank, and a case then runs in milliseconds: a notebook with five checks
on ranks, or a test suite with hundreds, spends nearly all its time importing. So the
grader keeps one server (``python -m rooflab.autograder.ranks.forkserver``), started on
its first launch with the environment a launcher would get. The server imports what the
launcher imports before it loads a learner's function, and nothing more, then waits; for
each job it forks a child that becomes the launcher (``launcher.main``), exactly as a
fresh one would run from there: it installs the record, imports the job's preloads, loads
the function, forks the ranks.

The server never runs a learner's code and never reads anything but the grader's pipe,
which no child keeps (each child's stdin and stdout are replaced before it does anything
else). A child is its own process group, so the grader kills it and all it started as it
kills a fresh launcher. The grader waits on a child it did not start through a pidfd; the
server reaps the child only when the grader asks, after the grader killed its group, so
the pid cannot be taken by another process in between.

The server ends when its grader ends (its pipe closes, or its parent is gone), when it
has been idle for ``IDLE_S``, or when the grader's environment or folder changes (a new
one is started for the new one). Where anything about it fails (another OS, a pipe that
breaks, a reply that does not come) the grader drops it and starts a fresh launcher
instead: slower, never wrong.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

START_S = 120.0  # for the server to import torch and say it is ready
REPLY_S = 10.0  # for it to answer a request: a fork, a reap
IDLE_S = 900.0  # without a job, after which it ends (a notebook left open)
PARENT_POLL_S = 1.0


def _pidfds_work() -> bool:
    """Linux 5.3 and later, where no seccomp filter refuses the call."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


AVAILABLE = sys.platform.startswith("linux") and _pidfds_work()


# --- the grader's side -------------------------------------------------------------------

class Forked:
    """A launcher forked by the server: waited on through a pidfd (it is not our child),
    reaped by the server once ``release`` is called."""

    def __init__(self, server: Server, pid: int):
        self.server, self.pid = server, pid
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # never expected: but a launcher no one waits on must not run
            server.request(f"reap {pid}")
            raise

    def exited(self) -> bool:
        return bool(select.select([self._pidfd], [], [], 0)[0])

    def release(self) -> None:
        """Once its group is killed: the server reaps it; the pidfd is closed."""
        try:
            self.server.request(f"reap {self.pid}")
        except OSError:  # the server is gone (a rank may kill it): its orphans go to init
            if self.server is _server:
                stop()
        finally:
            os.close(self._pidfd)


class Server:
    def __init__(self, environment: dict[str, str]):
        self.key = _key(environment)
        self.owner = os.getpid()
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=environment, start_new_session=True)
        self._pending = b""
        self._lock = threading.Lock()  # one request and its answer at a time
        if self._line(START_S) != "ready":
            raise OSError("the fork server did not start")

    def request(self, line: str) -> str:
        with self._lock:
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()
            return self._line(REPLY_S)

    def _line(self, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        out = self.process.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise OSError("the fork server did not answer")
            chunk = os.read(out, 4096)
            if not chunk:
                raise OSError("the fork server is gone")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        """Close its pipe (it ends at once: no job is under way between launches), then
        make sure, and reap it. A process forked from the grader leaves it alone."""
        if os.getpid() != self.owner:
            return
        try:
            self.process.stdin.close()
            self.process.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()


_server: Server | None = None


# Variables a caller rewrites as it goes, which nothing the server imports reads: pytest
# names the test under way in one, and a server per test would import torch per test.
# The launcher still sees their values of the moment (it takes the job's environment).
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})


def _key(environment: dict[str, str]) -> tuple:
    """What a fresh launcher would inherit that the server fixes when it starts: the
    environment (read as torch and the harness import), the folder, the interpreter."""
    fixed = sorted((name, value) for name, value in environment.items()
                   if name not in VOLATILE)
    return (os.getpid(), os.getcwd(), sys.executable, tuple(fixed))


def launcher(job: Path, environment: dict[str, str]) -> Forked | None:
    """The launcher for ``job``, forked by this process's server (started, or started
    again, as needed). None where no server can be had: start a fresh launcher then."""
    global _server
    if not AVAILABLE:
        return None
    if _server is not None and _server.key != _key(environment):
        stop()
    for _ in range(2):  # a server that died since the last job is replaced once
        try:
            if _server is None:
                _server = Server(environment)
            return Forked(_server, int(_server.request(f"run {job}")))
        except (OSError, ValueError):
            stop()
        except BaseException:  # a KeyboardInterrupt mid-request: the pipe's state is unknown
            stop()
            raise
    return None


def running() -> int | None:
    """The server's pid, while there is one."""
    return None if _server is None else _server.process.pid


def stop() -> None:
    global _server
    server, _server = _server, None
    if server is not None:
        server.close()


atexit.register(stop)


# --- the server's side -------------------------------------------------------------------

def serve(parent: int) -> None:
    # What the launcher imports before it installs the record: torch, torch.distributed,
    # the harness. Importing more would change what a learner's module sees.
    from . import launcher, rank, record, transport  # noqa: F401

    os.write(1, b"ready\n")
    pending = b""
    idle_since = time.monotonic()
    while True:
        if os.getppid() != parent:  # the grader died (its pipe may live on elsewhere)
            return
        if not select.select([0], [], [], PARENT_POLL_S)[0]:
            if time.monotonic() - idle_since > IDLE_S:
                return
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, _, pending = pending.partition(b"\n")
            verb, _, argument = line.decode().partition(" ")
            if verb == "run":
                pid = _fork_launcher(argument)
                os.write(1, f"{pid}\n".encode())
            elif verb == "reap":
                _reap(int(argument))
                os.write(1, b"reaped\n")
            idle_since = time.monotonic()


def _fork_launcher(job: str) -> int:
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _become_launcher(job, me)
        finally:
            os._exit(1)
    try:
        os.setpgid(pid, pid)  # as the child does: whichever runs first
    except OSError:
        pass
    return pid


def _become_launcher(job: str, server: int) -> None:
    os.setpgid(0, 0)
    output = os.open(Path(job) / "launcher.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    nothing = os.open(os.devnull, os.O_RDONLY)
    # The server's pipe is fds 0 and 1: replaced here, so no rank ever holds it.
    os.dup2(nothing, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(nothing)
    os.close(output)
    from . import launcher

    os._exit(launcher.main(job, parent=server))


def _reap(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the grader has; if it could not, this waits not
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


if __name__ == "__main__":
    serve(int(sys.argv[1]))
