"""What every benchmark on CPU ranks shares: start N gloo ranks on this machine, gather
what each reports, and gate, print and write the report.

A benchmark gives ``run`` its rank function, ``work(rank, world, *args)``, a module-level
function (fork hands it over, spawn pickles it by name). It is called once the rank has
joined a gloo process group, with one torch thread (N ranks share the machine's cores,
as in the grader), and returns what this side gathers: anything picklable. An exception
in it is reported with the rank's traceback.

Benchmarks on ranks are registered in ``bench.RANK_BENCHES`` by name, as
``"module:function"``; ``rooflab bench NAME`` calls the function with the command's
options and exits with what it returns. Every such function has this signature::

    def main(*, json_path: str | None, baseline: str | None, tolerance: float) -> int

* ``json_path``: also write the record as JSON, to this file, or into this folder (a path
  ending in "/" or an existing folder) as ``<cpu>-<date>-<name>.json``; None: do not;
* ``baseline``: a record to gate against, or "newest" (this CPU's newest record of the
  bench in ``bench/results/``); None: no gate;
* ``tolerance``: how far below its record a row's ratio to the library may fall (0.05),
  widened by the row's spread over its runs where that is wider (``gate.py``);
* returns the exit status: 0, or 1 when the gate finds a regression;
* raises ``gate.Refused`` for a baseline or tolerance the gate cannot judge with, before
  any rank starts (``against``, the first line of every ``main``).

The ranks here are plain ``multiprocessing`` processes, not the grader's launcher
(``ranks/launch.py``): that one records every torch.distributed call, which would charge
a ring's many point-to-point calls against the library's one.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from ..device import cpu_name, versions
from . import gate

# gloo's own limit on one collective: far beyond any step here, so that a deadlock shows
# as ``run``'s report of the ranks that never finished.
GLOO_TIMEOUT = datetime.timedelta(seconds=120)


def run(work: Callable, world: int, args: tuple, limit: float, what: str) -> dict[int, object]:
    """``work(rank, world, *args)`` on ``world`` gloo ranks: each rank's answer, by rank.
    Raises RuntimeError naming the rank that failed (with its traceback), died, or had not
    finished after ``limit`` seconds; ``what`` names the code under test in that message.
    Every rank process is ended and the group's files removed before it returns."""
    # fork starts a rank in milliseconds, where spawn imports torch again in each; fork
    # only where this process has not started CUDA, which a fork does not survive.
    context = multiprocessing.get_context("spawn" if torch.cuda.is_initialized() else "fork")
    folder = Path(tempfile.mkdtemp(prefix="rooflab-bench-"))
    results = context.Queue()
    processes = [context.Process(target=_rank, daemon=True, args=(
        rank, world, str(folder / "store"), work, args, results)) for rank in range(world)]
    try:
        for process in processes:
            process.start()
        return _gather(results, processes, time.monotonic() + limit, what)
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        shutil.rmtree(folder, ignore_errors=True)


def _rank(rank: int, world: int, store: str, work: Callable, args: tuple,
          results: multiprocessing.Queue) -> None:
    try:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this machine
        dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                                world_size=world, timeout=GLOO_TIMEOUT)
        answer = work(rank, world, *args)
        dist.destroy_process_group()
        results.put((rank, answer, None))
    except BaseException:  # noqa: BLE001 (the parent reports it)
        results.put((rank, None, traceback.format_exc()))


def _gather(results: multiprocessing.Queue, processes: list, deadline: float,
            what: str) -> dict[int, object]:
    gathered: dict[int, object] = {}
    while len(gathered) < len(processes):
        try:
            rank, answer, failure = results.get(timeout=1.0)
        except queue.Empty:
            silent = [r for r, p in enumerate(processes)
                      if r not in gathered and p.exitcode not in (None, 0)]
            if silent:
                raise RuntimeError(f"rank {silent[0]} died (exit code "
                                   f"{processes[silent[0]].exitcode})") from None
            if time.monotonic() > deadline:
                missing = sorted(set(range(len(processes))) - set(gathered))
                raise RuntimeError(f"the ranks took too long: ranks {missing} never "
                                   f"finished (a deadlock in {what}?)") from None
            continue
        if failure is not None:
            raise RuntimeError(f"rank {rank} failed:\n{failure}")
        gathered[rank] = answer
    return gathered


# --- the report ----------------------------------------------------------------------------


def machine(name: str, world: int) -> dict:
    """The head of a record: the bench, the machine its ranks ran on (this CPU), the date,
    the versions."""
    return {"bench": name, "card": cpu_name(), "kind": "cpu", "cores": os.cpu_count(),
            "backend": "gloo", "ranks": world, "date": datetime.date.today().isoformat(),
            "versions": versions.installed()}


def against(name: str, baseline: str | None, tolerance: float) -> gate.Baseline | None:
    """The record bench ``name`` is gated against, read and checked, at the start of its
    ``main``: a wrong one is refused (``gate.Refused``) before any rank starts. None: no
    gate."""
    return gate.load(baseline, cpu_name(), name, tolerance) if baseline else None


def finish(name: str, rows: Sequence, text: str, rerun: Callable[[object], Sequence],
           data: Callable[[], dict], *, json_path: str | None,
           against: gate.Baseline | None) -> int:
    """The end of every bench's ``main``: print the table, gate against ``against``
    (``rerun(row)`` times again what a row that moved measured, and returns the fresh
    rows), then write the record with the spreads the gate measured (after the gate: the
    newest record is the one before this run). The exit status."""
    print(text)

    def again(row):
        return next((fresh for fresh in rerun(row) if fresh.kernel == row.kernel), None)

    moved = gate.compare(rows, against, again) if against else []
    if json_path:
        written = gate.write(json_path, gate.stamp(data(), name, moved), cpu_name(), f"-{name}")
        print(f"wrote {written}")
    return 1 if gate.regressed(moved) else 0
