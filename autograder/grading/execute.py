"""One notebook in a fresh kernel, as a grader runs it: confined, with limits, and a crash
that ends one exercise rather than the grading.

This module is run by the grader (grade.py, ``WORKER``) once per submission, in its own
session, so that a notebook that outlives its time limit can be
ended with everything it started. It runs no learner code itself. Here:

* a fresh IPython kernel of this Python runs the notebook cell by cell (nbclient, as nbval
  does), with a time limit per cell (the kernel is interrupted, and the cell fails);
* the kernel runs in a sandbox (``confine/``): it can write only to its own folder
  (``--into``/box-N, a new one each time the notebook runs), sees the course's kernels
  without their answers (``--overlay``), has no network but its own loopback, and every
  process it starts ends with it. Its channels to this process are Unix sockets in that
  folder;
* the kernel inherits a cap on its address space (``--memory``): a huge allocation fails
  as a MemoryError in its cell; its folder is capped (``confine/quota.py``: past the cap
  the kernel is ended, as by a cell that ended it); the outputs kept are capped too, per
  cell and in all (``with_capped_outputs``): what is past a cap is dropped as it
  arrives, and the cell says how much;
* a cell that ends the kernel (``os._exit``, a segfault, ``sys.exit`` in a thread, the
  memory cap hit in native code) is noted, and the notebook runs again from the top in a
  new kernel with that cell replaced by an error, so the exercises after it are graded;
* the kernel's first process (bubblewrap's, confined) is noted in ``--into``/kernel.pid,
  for the grader to end it, and everything in the sandbox with it, if it must;
* every check leaves its record in the box's records folder (``checking/handin.py``); as
  each cell ends, this process takes what it left into ``--into``/taken/<cell id>/, out
  of the kernel's reach: a record counts for the cell that was running when it was
  written, whatever it says, and nothing written later can change it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import resource
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..checking import handin
from ..confine import Sandbox, ScratchWatch, over_words

RESTARTS = 3  # cells that may end the kernel before the rest of the notebook is given up
CRASHED = "CellEndedTheKernel"


def _kernel_manager(box: Path, sandbox: Sandbox | None):
    """A kernel manager that starts this very Python's ipykernel (the course's
    environment), not whichever "python3" kernel Jupyter finds first; in ``sandbox``
    unless it is None. Its channels are Unix sockets in the box (the sandbox has a network
    of its own), and it is interrupted by a message (a signal would reach bubblewrap)."""
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if sandbox is not None:
        argv = sandbox.command(argv, cwd=box / "work")

    class ThisPython(AsyncKernelManager):
        @property
        def kernel_spec(self) -> KernelSpec:
            return KernelSpec(argv=argv, display_name="rooflab grading", language="python",
                              interrupt_mode="message")

    run = box / "run"
    run.mkdir(parents=True, exist_ok=True)
    return ThisPython(transport="ipc", connection_file=str(run / "kernel.json"),
                      ip=str(run / "kernel"))


def without_output_widgets(client):
    """``client`` (an nbclient NotebookClient), no longer playing JupyterLab's part for
    the Output widget (which ``interact`` displays into). To play it, nbclient sends comm
    messages on the shell channel while it waits there for the cell's reply, and now and
    then that reply is never seen: the cell then waits out its whole time limit
    (jupyter/nbclient#312; lab 00's ``interact`` cell, once in a few dozen runs). No
    grade rests on a widget's output: a check's verdict is its record."""
    client.widget_registry = {}
    return client


# What a notebook's outputs may hold, kept by this process (and so in its memory, and in
# the learner's feedback notebook): a cell's output past its cap, or past the notebook's,
# is dropped as it arrives, and the cell says how much was cut.
OUTPUT_PER_CELL = 2 * 2**20
OUTPUT_PER_NOTEBOOK = 16 * 2**20


def with_capped_outputs(client, per_cell: int = OUTPUT_PER_CELL,
                        per_notebook: int = OUTPUT_PER_NOTEBOOK):
    """``client`` (an nbclient NotebookClient), keeping at most ``per_cell`` bytes of each
    cell's outputs and ``per_notebook`` in all; an error is always kept, its text cut to
    fit. ``client.cut`` maps a cell's index to the bytes dropped from it."""
    keep_output = client.output
    client.cut, kept = {}, {"notebook": 0}

    def output(outs, msg, display_id, cell_index):
        size = len(json.dumps(msg.get("content", {}), default=str))
        if msg.get("msg_type") == "error":  # the cell's failure: kept, its text bounded
            content = msg["content"]
            content["evalue"] = str(content.get("evalue", ""))[:4000]
            content["traceback"] = [str(line)[:4000] for line in
                                    content.get("traceback", [])[-40:]]
            return keep_output(outs, msg, display_id, cell_index)
        in_cell = kept.get(cell_index, 0)
        room = min(per_cell - in_cell, per_notebook - kept["notebook"])
        text = msg.get("content", {}).get("text")
        if size > room and msg.get("msg_type") == "stream" and isinstance(text, str) \
                and room > 0:  # a stream is kept up to the cap: its head says most
            msg["content"]["text"] = text[:room]
            client.cut[cell_index] = client.cut.get(cell_index, 0) + size - room
            size = room
        elif size > room:
            client.cut[cell_index] = client.cut.get(cell_index, 0) + size
            return None
        kept[cell_index] = in_cell + size
        kept["notebook"] += size
        return keep_output(outs, msg, display_id, cell_index)

    client.output = output
    return client


def cut_note(cut_bytes: int, per_cell: int = OUTPUT_PER_CELL,
             per_notebook: int = OUTPUT_PER_NOTEBOOK) -> str:
    """What a cell's output says when some of it was dropped."""
    return (f"[rooflab grade: {cut_bytes / 2**20:.1f} MB of this cell's output was cut: a "
            f"graded notebook keeps {per_cell / 2**20:g} MB of output per cell and "
            f"{per_notebook / 2**20:g} MB in all]\n")


def _error_output(name: str, value: str) -> dict:
    return {"output_type": "error", "ename": name, "evalue": value, "traceback": []}


def run(notebook: dict, into: Path, cell_timeout: float,
        confine: Callable[[Path], Sandbox] | None) -> dict:
    """Run ``notebook`` (nbformat 4 as a dict), keeping its outputs; return what happened:
    each code cell's error (if any) and seconds, and the cells that ended the kernel. Each
    run of it gets a new box (``into``/box-N), in a sandbox made by ``confine`` unless it
    is None: nothing a kernel left in its box is touched by this process, but its records."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    crashed: dict[int, str] = {}
    taken = into / TAKEN
    for attempt in range(RESTARTS + 1):
        shutil.rmtree(taken, ignore_errors=True)  # a rerun's records replace the last's
        box = into / f"box-{attempt}"
        records = box / "records"
        for folder in (records, box / "work"):
            folder.mkdir(parents=True)
        sandbox = confine(box) if confine is not None else None
        nb = nbformat.from_dict(json.loads(json.dumps(notebook)))
        client = with_capped_outputs(without_output_widgets(NotebookClient(
            nb, km=_kernel_manager(box, sandbox), timeout=cell_timeout,
            interrupt_on_timeout=True, allow_errors=True,
            resources={"metadata": {"path": str(box / "work")}})),
            OUTPUT_PER_CELL, OUTPUT_PER_NOTEBOOK)
        cells: list[dict] = []
        current = -1
        watch = ScratchWatch(box, functools.partial(_end_kernel, client))
        try:
            with watch, client.setup_kernel(env=_kernel_env(records)):
                (into / "kernel.pid").write_text(str(client.km.provisioner.pid))
                for index, cell in enumerate(nb.cells):
                    if cell.cell_type != "code":
                        continue
                    current = index
                    start = time.monotonic()
                    if index in crashed:
                        error = _error_output(CRASHED, crashed[index])
                        cell.outputs = [nbformat.from_dict(error)]
                    else:
                        try:
                            client.execute_cell(cell, index)
                        finally:
                            take_records(records, taken / str(cell.get("id", index)))
                    seconds = time.monotonic() - start
                    cut = client.cut.get(index, 0)
                    if cut:
                        cell.outputs.append(nbformat.from_dict({
                            "output_type": "stream", "name": "stderr",
                            "text": cut_note(cut, OUTPUT_PER_CELL, OUTPUT_PER_NOTEBOOK)}))
                    errors = [o for o in cell.outputs if o.get("output_type") == "error"]
                    error = f"{errors[0]['ename']}: {errors[0]['evalue']}" if errors else ""
                    if error.startswith("KeyboardInterrupt") and seconds >= cell_timeout:
                        error = (f"it ran past the cell time limit of {cell_timeout:g} s and "
                                 "was interrupted")
                    cells.append({"index": index, "id": cell.get("id", ""),
                                  "seconds": round(seconds, 3), "error": error,
                                  "output_cut": cut})
        except DeadKernelError:
            if watch.over:  # it was ended here, for what it wrote
                crashed[current] = (f"this cell {over_words(watch.over)}; the rest of the "
                                    "notebook ran again in a new kernel without it")
                continue
            crashed[current] = ("this cell ended the kernel (os._exit, sys.exit in a thread, "
                                "a crash in native code, or the memory cap): the rest of the "
                                "notebook ran again in a new kernel without it")
            continue
        nbformat.write(nb, into / "executed.ipynb")
        return {"cells": cells, "crashed": sorted(crashed)}
    return {"cells": [], "crashed": sorted(crashed), "gave_up": f"more than {RESTARTS} cells "
            "ended the kernel: the notebook was not run to the end"}


def _end_kernel(client, used: int) -> None:
    """End the kernel now, with everything in its sandbox (bubblewrap is its first process:
    its pid namespace goes with it)."""
    try:
        os.kill(client.km.provisioner.pid, signal.SIGKILL)
    except (AttributeError, OSError, TypeError):
        pass  # not started yet, or already gone


TAKEN = "taken"  # into/taken/<cell id>/: the records each cell left, out of the kernel's reach


RECORD = re.compile(r"\d+(\.json|-outputs\.pt)")  # what handin.keep writes


def take_records(records: Path, into: Path) -> None:
    """Move every record in ``records`` (the kernel's) into ``into`` (the grader's).

    The kernel can write in ``records``: it could put a link there, or the folder itself
    could be a link (the sandbox mounts it on its own, so that it cannot be replaced, and
    unconfined it could). So the folder is opened without following a link, and only the
    plain files named as records are moved, by name within it; nothing else is touched."""
    try:
        folder = os.open(records, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return  # gone, or a link: no record came from it
    try:
        for entry in os.scandir(folder):
            if RECORD.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                into.mkdir(parents=True, exist_ok=True)
                os.rename(entry.name, into / entry.name, src_dir_fd=folder)
    finally:
        os.close(folder)


def _kernel_env(records: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[handin.INTO_ENV] = str(records)
    return env


def sandbox_for(box: Path, read_only: list[Path], overlays: list[str],
                cache: Path | None = None) -> Sandbox:
    """The kernel's sandbox: writes to ``box`` only, its records folder mounted on its
    own; ``overlays`` are INSIDE=OUTSIDE. It starts with a copy of the grader's ``cache``
    (the ceilings measured on this card), so that no notebook measures them again."""
    mine = box / "home" / ".cache" / "rooflab"
    if cache is not None and cache.is_dir():
        shutil.copytree(cache, mine, dirs_exist_ok=True)
    mine.mkdir(parents=True, exist_ok=True)
    pairs = dict(item.split("=", 1) for item in overlays)
    return Sandbox(box, read_only=read_only,
                   overlays={Path(k): Path(v) for k, v in pairs.items()},
                   pinned=[box / "records"],
                   env={handin.INTO_ENV: str(box / "records"), "ROOFLAB_CACHE_DIR": str(mine)})


def cap_memory(limit_bytes: int) -> None:
    """Cap this process's address space, and so its kernel's (which inherits it)."""
    if limit_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rooflab.autograder.grading.execute")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--into", type=Path, required=True)
    parser.add_argument("--cell-timeout", type=float, required=True)
    parser.add_argument("--memory", type=int, default=0, help="bytes; 0: no cap")
    parser.add_argument("--unconfined", action="store_true", help="no sandbox")
    parser.add_argument("--read-only", type=Path, action="append", default=[],
                        help="a folder the kernel may read")
    parser.add_argument("--overlay", action="append", default=[], metavar="INSIDE=OUTSIDE",
                        help="OUTSIDE mounted over INSIDE, read-only, in the sandbox")
    parser.add_argument("--cache", type=Path, help="the grader's cache, copied for each kernel")
    args = parser.parse_args(argv)
    cap_memory(args.memory)
    confine = None if args.unconfined else functools.partial(
        sandbox_for, read_only=args.read_only, overlays=args.overlay, cache=args.cache)
    outcome = run(json.loads(args.notebook.read_text()), args.into.resolve(),
                  args.cell_timeout, confine)
    partial = args.into / "run.json.partial"
    partial.write_text(json.dumps(outcome))
    partial.replace(args.into / "run.json")
    return 0


# How the grader starts this module: with the autograder's package bare. Its __init__
# loads torch and Triton, seconds of every notebook's start, and this process runs no
# learner code and needs neither (the kernel imports the autograder itself).
WORKER = ("import sys, types\n"
          "package = types.ModuleType('rooflab.autograder')\n"
          "package.__path__ = [sys.argv.pop(1)]\n"
          "sys.modules[package.__name__] = package\n"
          "from rooflab.autograder.grading.execute import main\n"
          "sys.exit(main())\n")

if __name__ == "__main__":
    sys.exit(main())
