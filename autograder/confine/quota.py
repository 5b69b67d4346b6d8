"""A cap on what graded code writes into its scratch folder.

The sandbox lets graded code write in one folder, on disk (a tmpfs would hold it in
memory). Nothing in bubblewrap bounds how much: so the grader watches the folder while the
code runs, and once it holds more than its cap, ends the code (``on_over``), which then
fails and says why. The folder is measured every ``every_s`` seconds, by the blocks its
files take: between two looks it can outgrow the cap by what a disk writes in that time.
The grader's own files in it (``left_out``: the report and the answers it reads back) do
not count.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

SCRATCH_CAP = 512 * 2**20  # bytes: far above what any exercise's code needs to write


def used_bytes(folder: Path, left_out: Iterable[str] = ()) -> int:
    """The bytes the files under ``folder`` take on disk (links not followed), less those
    named in ``left_out`` (paths relative to ``folder``)."""
    skip = {str(folder / name) for name in left_out}
    total, stack = 0, [str(folder)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue  # gone, or not ours to read: nothing of it counts
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.path not in skip:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total


class ScratchWatch:
    """While open, calls ``on_over(bytes)`` once if ``folder`` holds more than ``cap``."""

    def __init__(self, folder: Path, on_over: Callable[[int], None], cap: int | None = None,
                 every_s: float = 0.25, left_out: Iterable[str] = ()):
        self.folder, self.on_over, self.every_s = folder, on_over, every_s
        self.cap = SCRATCH_CAP if cap is None else cap
        self.left_out = tuple(left_out)
        self.over = 0  # the bytes found when the cap was passed; 0 while it was not
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            used = used_bytes(self.folder, self.left_out)
            if used > self.cap:
                self.over = used
                self.on_over(used)
                return

    def __enter__(self) -> ScratchWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def over_words(used: int, cap: int | None = None) -> str:
    """What a check that passed its scratch cap is told."""
    cap = SCRATCH_CAP if cap is None else cap
    return (f"wrote {used / 2**20:.0f} MB into its scratch folder, past the cap of "
            f"{cap / 2**20:g} MB, and was stopped: graded code may write files, not fill "
            "the disk")
