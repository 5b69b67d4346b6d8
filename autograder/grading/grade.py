"""``rooflab grade SUBMISSIONS… --out DIR``: a class's notebooks, graded.

Each argument is one learner: a notebook (the learner is its file name), a folder of
notebooks or a zip of them (the learner is the folder's or the zip's name). Each notebook
is matched to its lab by its cell ids (``05-012`` is lab 05), and graded so:

1. cells.py puts back every cell that is not the learner's, as the lab has it, and notes
   each one the submission had changed;
2. execute.py runs it in a fresh kernel, confined in a sandbox (confinement.py), in a
   process of its own, with limits: per cell, per notebook (then it is ended, kernel and
   all) and on memory;
3. verdicts.py decides each exercise here, from the checks' records, checking every
   answer again;
4. gradebook.py writes the learner's result, then the class's views.

Notebooks are graded in parallel (``--jobs``), except on a GPU, where timings would
disturb each other: one at a time there. ``--resume`` skips every notebook whose result is
already written; ``--shard i/n`` grades every n-th notebook from the i-th, for a CI matrix
or a job array, and ``rooflab grade --merge SHARD_DIRS… --out DIR`` joins them.

The exit status says whether grading worked (0), not what the grades are.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..checking import handin
from . import gradebook
from .cells import CHECK_TAG, exercises, one_cell_each, restore
from .confinement import Confinement, prepare
from .execute import TAKEN
from .verdicts import Grade, grade_exercises


@dataclass
class Limits:
    cell_s: float = 600.0
    notebook_s: float = 3600.0
    memory_bytes: int = 0  # 0: no cap


@dataclass
class Task:
    learner: str
    notebook: Path
    lab: Path  # labs/NN_topic.ipynb, the lab it answers
    # Where a learner handed in several notebooks for one lab, by the names the instructor
    # knows them by: all of them when none may be graded (--pick error), else those left out.
    clash: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)

    @property
    def lab_name(self) -> str:
        return self.lab.stem


PICKS = ("error", "newest")  # --pick: what to do with several notebooks for one lab


def find_tasks(paths: list[Path], labs: Path, unpack_into: Path,
               pick: str = "error") -> tuple[list[Task], list[str]]:
    """One task per learner and lab, and what could not be graded (in words).

    A learner who handed in several notebooks for one lab gets one task all the same: with
    ``pick="error"`` it is marked as a clash, to be reported and not graded; with
    ``"newest"`` it grades the notebook modified last and names the others."""
    if pick not in PICKS:
        raise ValueError(f"--pick is one of {', '.join(PICKS)}, not {pick!r}")
    found: dict[tuple[str, Path], dict[Path, str]] = {}  # (learner, lab): notebook -> name
    problems = []
    for number, path in enumerate(paths):
        if path.suffix == ".zip":
            learner = path.stem
            # A folder per argument: two zips of one name must not unpack over each other.
            shown = _unpack(path, unpack_into / str(number) / learner)
            notebooks = sorted(shown)
        elif path.is_dir():
            learner, notebooks = path.name, sorted(path.rglob("*.ipynb"))
            shown = {}
        elif path.suffix == ".ipynb":
            learner, notebooks, shown = path.stem, [path], {}
        else:
            problems.append(f"{path}: not a notebook, a folder or a zip")
            continue
        # Jupyter's checkpoints and the resource forks a Mac puts in its zips are copies.
        notebooks = [nb for nb in notebooks if ".ipynb_checkpoints" not in nb.parts
                     and "__MACOSX" not in nb.parts]
        if not notebooks:
            problems.append(f"{path}: no notebook in it")
        for notebook in notebooks:
            lab = lab_of(notebook, labs)
            if lab is None:
                problems.append(f"{shown.get(notebook, notebook)}: matches no lab in {labs}")
            else:
                found.setdefault((learner, lab), {})[notebook] = shown.get(notebook,
                                                                           str(notebook))
    tasks = []
    for (learner, lab), named in found.items():
        if len(named) == 1:
            tasks.append(Task(learner, next(iter(named)), lab))
            continue
        # The latest modification; a tie goes to the last name, so a rerun picks the same.
        newest = max(named, key=lambda nb: (nb.stat().st_mtime, named[nb]))
        others = [named[nb] for nb in sorted(named) if nb != newest]
        if pick == "newest":
            tasks.append(Task(learner, newest, lab, left_out=others))
        else:
            everyone = sorted(named.values())
            tasks.append(Task(learner, newest, lab, clash=everyone))
            problems.append(f"{learner}: {len(everyone)} notebooks for {lab.stem}: "
                            f"{', '.join(everyone)}; none is graded: keep one, or grade "
                            "with --pick newest")
    return tasks, problems


def _unpack(archive_path: Path, folder: Path) -> dict[Path, str]:
    """Unpack a zip; each notebook in it, by the name the instructor knows it by
    (``alice.zip:work/lab01.ipynb``). Each file keeps its date in the zip as its
    modification time, for ``--pick newest``."""
    shown = {}
    with zipfile.ZipFile(archive_path) as archive:
        for info in archive.infolist():
            target = Path(archive.extract(info, folder))  # names leaving folder are cut
            if info.is_dir():
                continue
            when = time.mktime((*info.date_time, 0, 0, -1))
            os.utime(target, (when, when))
            if target.suffix == ".ipynb":
                shown[target] = f"{archive_path}:{info.filename}"
    return shown


def refused(task: Task) -> dict:
    """The result of a lab not graded for its clash: every exercise FAIL, saying why, so
    the gradebook shows it and ``--require-pass`` fails on it."""
    why = (f"not graded: {len(task.clash)} notebooks for this lab ({', '.join(task.clash)}); "
           "keep one, or grade with --pick newest")
    wanted = exercises(json.loads(task.lab.read_text()))
    return {"learner": task.learner, "lab": task.lab_name, "notebook": ", ".join(task.clash),
            "mode": _mode(), "changed": [], "problems": [why], "clash": task.clash,
            "grades": [Grade(e.problem_id, e.cell_id, "FAIL", why).as_dict()
                       for e in one_cell_each(wanted)],
            "seconds": 0.0, "started": time.time(), "finished": time.time()}


def lab_of(notebook: Path, labs: Path) -> Path | None:
    """The lab a notebook answers: the lab number its cell ids carry, else its file name."""
    try:
        cells = json.loads(notebook.read_text()).get("cells", [])
    except (OSError, ValueError):
        cells = []
    prefixes = Counter(str(cell.get("id", ""))[:2] for cell in cells
                       if str(cell.get("id", ""))[:2].isdigit())
    number = prefixes.most_common(1)[0][0] if prefixes else notebook.name[:2]
    found = sorted(labs.glob(f"{number}_*.ipynb")) if number.isdigit() else []
    return found[0] if found else None


def shard(tasks: list[Task], spec: str | None) -> list[Task]:
    """``i/n``: the i-th of n shards (1-based), every n-th task in a stable order."""
    ordered = sorted(tasks, key=lambda t: (t.learner, t.lab_name, str(t.notebook)))
    if not spec:
        return ordered
    index, count = (int(part) for part in spec.split("/"))
    if not 1 <= index <= count:
        raise ValueError(f"--shard {spec}: i must be between 1 and n")
    return ordered[index - 1::count]


def with_cell_markers(notebook: dict) -> dict:
    """Each check cell tells the record which cell it is (handin.at_cell), first. (The
    grader goes by the cell that was running when a record was written: execute.py.)"""
    for cell in notebook["cells"]:
        if cell.get("cell_type") == "code" and CHECK_TAG in cell.get("metadata", {}).get(
                "tags", []):
            source = cell["source"] if isinstance(cell["source"], str) else "".join(
                cell["source"])
            cell["source"] = (f'__import__("rooflab.autograder.checking.handin", fromlist=["_"])'
                              f'.at_cell({cell["id"]!r})\n' + source)
    return notebook


def grade_one(task: Task, limits: Limits, seed: int, confinement: Confinement) -> dict:
    """Grade one notebook: its result (what the gradebook holds)."""
    lab = json.loads(task.lab.read_text())
    start = time.monotonic()
    result = {"learner": task.learner, "lab": task.lab_name, "notebook": str(task.notebook),
              "mode": _mode(), "confined": confinement.confined, "changed": [],
              "problems": [], "grades": [], "seconds": 0.0, "started": time.time()}
    try:
        submission = json.loads(task.notebook.read_text())
    except (OSError, ValueError) as error:
        submission = None
        result["problems"].append(f"the notebook could not be read: {error}")
    wanted = exercises(lab)
    if submission is None:
        result["grades"] = [Grade(e.problem_id, e.cell_id, "FAIL", "not graded: the "
                                  "notebook could not be read").as_dict()
                            for e in one_cell_each(wanted)]
        return result
    restored = restore(lab, submission)
    result["changed"], result["added_cells"] = restored.changed, restored.added
    with tempfile.TemporaryDirectory(prefix="rooflab-grade-") as scratch:
        into = Path(scratch).resolve()  # as the sandbox names it: no link in the way
        (into / "notebook.ipynb").write_text(json.dumps(with_cell_markers(restored.notebook)))
        run = _execute(into, limits, seed, confinement)
        if run.get("killed"):
            result["problems"].append(run["killed"])
        for index in run.get("crashed", []):
            result["problems"].append(f"cell {index} ended the kernel; the notebook ran "
                                      "again without it")
        grades = grade_exercises(wanted, run, taken_records(into / TAKEN), seed)
    result["grades"] = [grade.as_dict() for grade in grades]
    result["seconds"] = round(time.monotonic() - start, 2)
    result["finished"] = time.time()
    return result


def taken_records(taken: Path) -> list[tuple[dict, Path]]:
    """Each record the checks left, with its answers file, as execute.py took them: the
    cell a record is for is the cell that was running when it was written (its folder),
    not what the record says."""
    records = []
    for path in sorted(taken.glob("*/[0-9]*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # written half, or not by a check: no record
        if isinstance(record, dict):
            record["cell"] = path.parent.name
            records.append((record, path.with_name(f"{path.stem}-outputs.pt")))
    return records


def _mode() -> str:
    from ..device import current

    return current().mode


def _execute(into: Path, limits: Limits, seed: int, confinement: Confinement) -> dict:
    """Run execute.py on ``into``/notebook.ipynb in its own session; end it, kernel and
    all, past the notebook's time limit. Returns its run.json (or what went wrong)."""
    env = dict(os.environ, **{handin.SEED_ENV: str(seed)})
    # A check's own limit per case, under the cell's, so that an endless kernel fails
    # its check with a message before the cell is interrupted.
    env.setdefault("ROOFLAB_TIME_LIMIT", str(max(5.0, limits.cell_s / 4)))
    command = [sys.executable, "-m", "rooflab.autograder.grading.execute",
               str(into / "notebook.ipynb"), "--into", str(into), "--cell-timeout",
               str(limits.cell_s), "--memory", str(limits.memory_bytes),
               *confinement.execute_args()]
    worker = subprocess.Popen(command, env=env, start_new_session=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=open(into / "worker.log", "w"))  # noqa: SIM115
    _running[worker.pid] = (worker, into)
    try:
        worker.wait(timeout=limits.notebook_s)
    except subprocess.TimeoutExpired:
        _end(worker, into)
        run = _read_json(into / "run.json") or {}
        run.setdefault("killed", f"the notebook ran past its time limit of "
                                 f"{limits.notebook_s:g} s and was ended")
        return run
    finally:
        _end_kernel(into)
        _running.pop(worker.pid, None)
    run = _read_json(into / "run.json")
    if run is None:
        log = (into / "worker.log").read_text()[-500:]
        return {"killed": f"the grader's worker ended without a report (status "
                          f"{worker.returncode}): {log}"}
    return run


# The workers running now, each in a session of its own: an interrupted grader ends them.
_running: dict[int, tuple[subprocess.Popen, Path]] = {}
_stopping = threading.Event()  # set when interrupted: a notebook ended now gets no result


def _end_all() -> None:
    for worker, into in list(_running.values()):
        _end(worker, into)


def _end(worker: subprocess.Popen, into: Path) -> None:
    for pid in (worker.pid,):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.wait()
    _end_kernel(into)


def _end_kernel(into: Path) -> None:
    """The kernel runs in a session of its own: end it whatever state it is in."""
    try:
        pid = int((into / "kernel.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def grade(paths: list[Path], out: Path, labs: Path, limits: Limits, jobs: int = 0,
          resume: bool = False, shard_spec: str | None = None, progress=sys.stderr,
          unconfined: bool = False, pick: str = "error", roster: list[str] | None = None) -> int:
    """Grade every submission into ``out``; returns how many results were written now, one
    per learner and lab (a lab not graded for its clash of notebooks counts: its result
    says so). ``roster``: the class, for the gradebook to name who handed in nothing.
    Raises CannotConfine (a ValueError) where notebooks cannot be confined and
    ``unconfined`` is not given, or could import the answers."""
    from ..device import current

    with tempfile.TemporaryDirectory(prefix="rooflab-unpacked-") as unpacked:
        confinement = prepare(unconfined, Path(unpacked))
        if not confinement.confined:
            print("rooflab grade: UNCONFINED: graded notebooks run with this user's rights "
                  "(the gradebook says so)", file=progress)
        out.mkdir(parents=True, exist_ok=True)
        tasks, problems = find_tasks(paths, labs, Path(unpacked) / "submissions", pick)
        for line in problems:
            print(f"rooflab grade: {line}", file=progress)
        tasks = shard(tasks, shard_spec)
        # A result that says its lab was not graded (a clash) is written again each time.
        todo = [t for t in tasks if not (resume and gradebook.graded(out, t.learner,
                                                                     t.lab_name))]
        if len(todo) < len(tasks):
            print(f"rooflab grade: {len(tasks) - len(todo)} already graded (--resume)",
                  file=progress)
        on_gpu = current().can_measure
        workers = 1 if on_gpu else (jobs or max(1, (os.cpu_count() or 2) // 2))
        seed = secrets.randbelow(1 << 30)
        done = 0

        def one(task: Task) -> dict:
            if task.clash:
                result = refused(task)
            else:
                result = grade_one(task, limits, seed, confinement)
            if task.left_out:
                result["problems"].append(f"also handed in for this lab, not graded (--pick "
                                          f"newest): {', '.join(task.left_out)}")
            if _stopping.is_set():
                raise KeyboardInterrupt  # its notebook was ended by the interruption
            gradebook.write_atomic(gradebook.result_path(out, task.learner, task.lab_name),
                                   json.dumps(result, indent=1))
            return result

        pool = ThreadPoolExecutor(max_workers=workers)
        previous = signal.signal(signal.SIGTERM, _interrupted)
        try:
            for result in pool.map(one, todo):
                done += 1
                passed = sum(g["verdict"] == "PASS" for g in result["grades"])
                how = ("not graded, several notebooks for this lab" if result.get("clash")
                       else f"{passed}/{len(result['grades'])} passed, "
                            f"{result['seconds']:.1f} s")
                print(f"[{done}/{len(todo)}] {result['learner']} {result['lab']}: {how}",
                      file=progress, flush=True)
        except KeyboardInterrupt:
            # Interrupted (Ctrl-C, or a job scheduler's SIGTERM): end every notebook still
            # running, kernels too. What is written stays; --resume goes on from there.
            _stopping.set()
            pool.shutdown(wait=False, cancel_futures=True)
            _end_all()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        pool.shutdown()
    gradebook.write_views(out, roster)
    return done
