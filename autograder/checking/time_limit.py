"""A time limit for one case of a check: an endless loop ends as a failure, not a hang.

Triton's interpreter runs a kernel as Python, and host code is Python too, so a loop that
never ends can be interrupted by a signal: ``limited(seconds)`` arms a real-time timer
whose handler raises ``TimeLimitExceeded`` in the main thread. It derives from
``BaseException`` so that a candidate's ``except Exception`` cannot swallow it.

Where no signal can be delivered (not the main thread, or no SIGALRM, as on Windows) the
block runs without a limit; ``rooflab check`` runs the candidate in a child process and
enforces its own limit from outside, which also covers a GPU kernel that never returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

# The slowest case of a course solution takes about 20 s in the interpreter on a busy
# 2-core machine (the 512³ matmul traced for traffic); a limit several times that leaves a
# slow but honest kernel alone.
DEFAULT_S = 120.0
ENV = "ROOFLAB_TIME_LIMIT"


class TimeLimitExceeded(BaseException):  # noqa: N818 (not an error of the grader's own)
    """A case ran past its time limit."""

    def __init__(self, seconds: float):
        super().__init__(f"ran past the time limit of {seconds:g} s")
        self.seconds = seconds


def default_s() -> float:
    """$ROOFLAB_TIME_LIMIT if set (0 or less: no limit), else ``DEFAULT_S``."""
    value = os.environ.get(ENV)
    return float(value) if value else DEFAULT_S


def _can_interrupt() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def limited(seconds: float | None) -> Iterator[None]:
    """Raise ``TimeLimitExceeded`` in the block once ``seconds`` have passed (None or <= 0:
    no limit). Restores any timer and handler that were there before."""
    if not seconds or seconds <= 0 or not _can_interrupt():
        yield
        return

    def expire(signum, frame):
        raise TimeLimitExceeded(seconds)

    previous_handler = signal.signal(signal.SIGALRM, expire)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer[0]:  # someone else's timer was running: give it back
            signal.setitimer(signal.ITIMER_REAL, *previous_timer)
