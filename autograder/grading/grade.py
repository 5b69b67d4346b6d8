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
4. scoring.py gives it points, less any late penalty; gradebook.py writes the learner's
   result and the notebook as graded (feedback.py), then the class's views.

Notebooks are graded in parallel (``--jobs``), except on a GPU, where timings would
disturb each other: one at a time there. ``--labs`` grades some labs only (by number, or
the ones each learner has begun). ``--resume`` skips every notebook whose result is
already written and whose content has not changed since; ``--shard i/n`` grades one
share of the learners (shards.py), for a CI matrix or a job array, and ``rooflab grade
--merge SHARD_DIRS… --out DIR`` joins them.

The exit status says whether grading worked (0), not what the grades are.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
from ..course.points import of_lab
from . import gradebook, scoring, shards
from .cells import CHECK_TAG, MARKER_LINE, exercises, one_cell_each, restore, started
from .confinement import Confinement, prepare
from .execute import OUTPUT_PER_CELL, OUTPUT_PER_NOTEBOOK, TAKEN, WORKER
from .feedback import keep_notebook
from .scoring import Policy, iso
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
    # When it was handed in (seconds since the epoch): its date in the zip, on its file,
    # or in the instructor's manifest (``--submitted``); and which of them.
    submitted: float | None = None
    submitted_from: str = ""

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
    zipped: set[Path] = set()  # the notebooks unpacked from a zip, dated by it
    problems = []
    for number, path in enumerate(paths):
        if path.suffix == ".zip":
            learner = path.stem
            # A folder per argument: two zips of one name must not unpack over each other.
            try:
                shown = _unpack(path, unpack_into / str(number) / learner)
            except (zipfile.BadZipFile, OSError, ValueError) as error:
                problems.append(f"{path}: not graded, the zip cannot be read ({error})")
                continue
            notebooks = sorted(shown)
            zipped.update(shown)
        elif path.is_dir():
            learner, shown = path.name, {}
            notebooks, links = _own_notebooks(path)
            # A link could hand in anyone's notebook (another learner's, the solutions):
            # the grader reads a notebook outside the sandbox, so it reads none.
            problems += [f"{link}: a link, not a notebook of this submission: not graded"
                         for link in links]
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
        source = ("its date in the zip" if set(named) & zipped
                  else "its file's modification time")
        if len(named) == 1:
            only = next(iter(named))
            tasks.append(Task(learner, only, lab, submitted=only.stat().st_mtime,
                              submitted_from=source))
            continue
        # The latest modification; a tie goes to the last name, so a rerun picks the same.
        newest = max(named, key=lambda nb: (nb.stat().st_mtime, named[nb]))
        others = [named[nb] for nb in sorted(named) if nb != newest]
        when = newest.stat().st_mtime
        if pick == "newest":
            tasks.append(Task(learner, newest, lab, left_out=others, submitted=when,
                              submitted_from=source))
        else:
            everyone = sorted(named.values())
            tasks.append(Task(learner, newest, lab, clash=everyone, submitted=when,
                              submitted_from=source))
            problems.append(f"{learner}: {len(everyone)} notebooks for {lab.stem}: "
                            f"{', '.join(everyone)}; none is graded: keep one, or grade "
                            "with --pick newest")
    return tasks, problems


def _own_notebooks(folder: Path) -> tuple[list[Path], list[Path]]:
    """(the notebooks in ``folder`` and its subfolders, the links among them, or in the
    way to them, which are left out)."""
    inside = folder.resolve()
    own, links = [], []
    for notebook in sorted(folder.rglob("*.ipynb")):
        # The folders in between (the submission's own folder may be a link: it is the
        # instructor's argument).
        between = [p for p in notebook.relative_to(folder).parents if p != Path(".")]
        linked = notebook.is_symlink() or any((folder / p).is_symlink() for p in between)
        if linked or not notebook.resolve().is_relative_to(inside):
            links.append(notebook)
        else:
            own.append(notebook)
    return own, links


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
    return {**_header(task), "notebook": ", ".join(task.clash), "problems": [why],
            "clash": task.clash, "grades": [Grade(e.problem_id, e.cell_id, "FAIL", why)
                                            .as_dict() for e in one_cell_each(wanted)],
            "finished": time.time()}


def _header(task: Task) -> dict:
    """What every result of ``task`` starts with."""
    from ..device import current

    device = current()
    return {"learner": task.learner, "lab": task.lab_name, "notebook": str(task.notebook),
            "mode": device.mode, "measured": device.can_measure, "changed": [],
            "problems": [], "grades": [], "seconds": 0.0, "started": time.time(),
            "submitted": task.submitted, "submitted_from": task.submitted_from,
            "submitted_iso": iso(task.submitted) if task.submitted is not None else ""}


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


def parse_labs(text: str | None) -> set[str] | str | None:
    """``--labs``: "00,01" (lab numbers) -> {"00", "01"}; "changed" (the labs a learner has
    begun) as it is; None: every lab. Raises ValueError."""
    if not text:
        return None
    if text.strip() == "changed":
        return "changed"
    numbers = {part.strip() for part in text.split(",") if part.strip()}
    if not numbers or not all(re.fullmatch(r"\d\d", n) for n in numbers):
        hint = (" (the folder of lab notebooks is --course)" if Path(text).exists() else "")
        raise ValueError(f"--labs is lab numbers, e.g. 00,01, or 'changed', not {text!r}{hint}")
    return numbers


def chosen(tasks: list[Task], labs: set[str] | str | None) -> list[Task]:
    """The tasks of the labs asked for, in a stable order: by number, or, with "changed",
    the labs whose notebook the learner has begun (``cells.started``)."""
    ordered = sorted(tasks, key=lambda t: (t.learner, t.lab_name, str(t.notebook)))
    if labs is None:
        return ordered
    if labs == "changed":
        return [t for t in ordered if t.clash or _begun(t)]
    return [t for t in ordered if t.lab_name[:2] in labs]


def _begun(task: Task) -> bool:
    try:
        submission = json.loads(task.notebook.read_text())
    except (OSError, ValueError):
        return True  # unreadable: graded, so that the gradebook says so
    return started(json.loads(task.lab.read_text()), submission)


def digest(path: Path) -> str:
    """The notebook's content, hashed: ``--resume`` grades a changed notebook again."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def with_cell_markers(notebook: dict) -> dict:
    """Each check cell tells the record which cell it is (handin.at_cell), first. (The
    grader goes by the cell that was running when a record was written: execute.py.)"""
    for cell in notebook["cells"]:
        if cell.get("cell_type") == "code" and CHECK_TAG in cell.get("metadata", {}).get(
                "tags", []):
            source = cell["source"] if isinstance(cell["source"], str) else "".join(
                cell["source"])
            cell["source"] = f"{MARKER_LINE}{cell['id']!r})\n" + source
    return notebook


def grade_one(task: Task, limits: Limits, seed: int, confinement: Confinement,
              feedback_to: Path | None = None) -> dict:
    """Grade one notebook: its result (what the gradebook holds). With ``feedback_to``
    (the gradebook folder), the notebook as graded is kept there for its learner."""
    lab = json.loads(task.lab.read_text())
    start = time.monotonic()
    result = {**_header(task), "confined": confinement.confined}
    try:
        result["sha256"] = digest(task.notebook)
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
        for cell in run.get("cells", []):
            if cell.get("output_cut"):
                result["problems"].append(
                    f"cell {cell['id'] or cell['index']}: {cell['output_cut'] / 2**20:.1f} MB "
                    "of its output was cut (a graded notebook keeps "
                    f"{OUTPUT_PER_CELL / 2**20:g} MB per cell, "
                    f"{OUTPUT_PER_NOTEBOOK / 2**20:g} MB in all)")
        for index in run.get("crashed", []):
            result["problems"].append(f"cell {index} ended the kernel; the notebook ran "
                                      "again without it")
        grades = grade_exercises(wanted, run, taken_records(into / TAKEN), seed)
        if feedback_to is not None:
            keep_notebook(into / "executed.ipynb", feedback_to, task.learner, task.lab_name)
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


def _execute(into: Path, limits: Limits, seed: int, confinement: Confinement) -> dict:
    """Run execute.py on ``into``/notebook.ipynb in its own session; end it, kernel and
    all, past the notebook's time limit. Returns its run.json (or what went wrong)."""
    from ..device.roofline import cache_dir

    env = dict(os.environ, **{handin.SEED_ENV: str(seed)})
    # A check's own limit per case, under the cell's, so that an endless kernel fails
    # its check with a message before the cell is interrupted.
    env.setdefault("ROOFLAB_TIME_LIMIT", str(max(5.0, limits.cell_s / 4)))
    command = [sys.executable, "-c", WORKER, str(Path(__file__).resolve().parents[1]),
               str(into / "notebook.ipynb"), "--into", str(into), "--cell-timeout",
               str(limits.cell_s), "--memory", str(limits.memory_bytes),
               "--cache", str(cache_dir()), *confinement.execute_args()]
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


@dataclass
class Options:
    """How a class is graded, beyond its limits (the command line's options)."""

    jobs: int = 0  # notebooks at once; 0: half the cores (always 1 on a GPU)
    resume: bool = False
    shard: str | None = None  # "i/n"
    unconfined: bool = False
    pick: str = "error"
    roster: list[str] | None = None  # the class, to name who handed in nothing
    details: dict[str, dict[str, str]] = field(default_factory=dict)  # ids, by learner
    labs: set[str] | str | None = None  # parse_labs
    policy: Policy = field(default_factory=Policy)
    # When each learner handed in, from the instructor's manifest: (learner, lab number or
    # "") -> seconds since the epoch. It wins over the notebook's own date.
    submitted: dict[tuple[str, str], float] = field(default_factory=dict)
    views_every_s: float = 30.0  # the class's views are written again as results arrive


def grade(paths: list[Path], out: Path, labs: Path, limits: Limits,
          options: Options | None = None, progress=sys.stderr) -> int:
    """Grade every submission into ``out``; returns how many results were written now, one
    per learner and lab (a lab not graded for its clash of notebooks counts: its result
    says so). Raises CannotConfine (a ValueError) where notebooks cannot be confined and
    ``options.unconfined`` is not given, or could import the answers."""
    from ..device import current

    options = options or Options()
    with tempfile.TemporaryDirectory(prefix="rooflab-unpacked-") as unpacked:
        confinement = prepare(options.unconfined, Path(unpacked))
        if not confinement.confined:
            print("rooflab grade: UNCONFINED: graded notebooks run with this user's rights "
                  "(the gradebook says so)", file=progress)
        out.mkdir(parents=True, exist_ok=True)
        mine = shards.share(paths, options.shard)  # nothing of another shard is opened
        if options.shard:
            shards.write(out, paths, options.shard, _settings(labs, options))
        tasks, problems = find_tasks(mine, labs, Path(unpacked) / "submissions", options.pick)
        for line in problems:
            print(f"rooflab grade: {line}", file=progress)
        tasks = chosen(tasks, options.labs)
        for task in tasks:
            when = options.submitted.get((task.learner, task.lab_name[:2]),
                                         options.submitted.get((task.learner, "")))
            if when is not None:
                task.submitted, task.submitted_from = when, "the manifest of submission times"
        todo = _to_grade(tasks, out, options, current().can_measure)
        if len(todo) < len(tasks):
            print(f"rooflab grade: {len(tasks) - len(todo)} already graded (--resume): "
                  "their notebooks are unchanged", file=progress)
        # A gradebook from the start (what --resume kept, scored again), so that a job cut
        # off before its first notebook is done still has one.
        gradebook.write_views(out, options.roster, options.details)
        on_gpu = current().can_measure
        workers = 1 if on_gpu else (options.jobs or max(1, (os.cpu_count() or 2) // 2))
        seed = secrets.randbelow(1 << 30)
        done, views_at = 0, time.monotonic()

        def one(task: Task) -> dict:
            if task.clash:
                result = refused(task)
            else:
                result = grade_one(task, limits, seed, confinement, feedback_to=out)
            if task.left_out:
                result["problems"].append(f"also handed in for this lab, not graded (--pick "
                                          f"newest): {', '.join(task.left_out)}")
            scoring.score(result, of_lab(json.loads(task.lab.read_text())), options.policy)
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
                points = result["points"]
                how = ("not graded, several notebooks for this lab" if result.get("clash")
                       else f"{passed}/{len(result['grades'])} passed, {points['earned']:g}/"
                            f"{points['possible']:g} points, {result['seconds']:.1f} s")
                print(f"[{done}/{len(todo)}] {result['learner']} {result['lab']}: {how}",
                      file=progress, flush=True)
                # A job cut off by its time limit still leaves a gradebook of what was done.
                if time.monotonic() - views_at > options.views_every_s:
                    gradebook.write_views(out, options.roster, options.details)
                    views_at = time.monotonic()
        except KeyboardInterrupt:
            # Interrupted (Ctrl-C, or a job scheduler's SIGTERM): end every notebook still
            # running, kernels too. What is written stays; --resume goes on from there.
            _stopping.set()
            pool.shutdown(wait=False, cancel_futures=True)
            _end_all()
            gradebook.write_views(out, options.roster, options.details)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        pool.shutdown()
    gradebook.write_views(out, options.roster, options.details)
    if options.shard:
        shards.write(out, paths, options.shard, _settings(labs, options), finished=True)
    return done


def _settings(labs: Path, options: Options) -> dict:
    """What the shards of one grading must share, for ``--merge`` to compare."""
    course = hashlib.sha256()
    for lab in sorted(labs.glob("[0-9][0-9]_*.ipynb")):
        course.update(lab.name.encode() + lab.read_bytes())
    chosen_labs = sorted(options.labs) if isinstance(options.labs, set) else options.labs
    return {"labs": chosen_labs, "course": course.hexdigest()[:16],
            "policy": options.policy.as_dict(), "pick": options.pick}


def _to_grade(tasks: list[Task], out: Path, options: Options, measured: bool) -> list[Task]:
    """The tasks to grade now. With ``--resume``, a result of the same notebook graded on
    the same kind of device (``measured``: a GPU's timings) is kept, scored again under
    this grading's settings (points, deadlines) without running it; a result that says its
    lab was not graded (a clash) is written again each time, and so is a CPU's result on
    a GPU, where its NEEDS A GPU can be decided and its speed measured."""
    if not options.resume:
        return tasks
    todo = []
    for task in tasks:
        path = gradebook.result_path(out, task.learner, task.lab_name)
        if task.clash or not gradebook.graded(out, task.learner, task.lab_name,
                                              digest(task.notebook)):
            todo.append(task)
            continue
        before = json.loads(path.read_text())
        if bool(before.get("measured")) != measured:
            todo.append(task)
            continue
        result = json.loads(json.dumps(before))  # scored in place: a copy
        result.update(submitted=task.submitted, submitted_from=task.submitted_from,
                      submitted_iso=iso(task.submitted) if task.submitted is not None else "")
        scoring.score(result, of_lab(json.loads(task.lab.read_text())), options.policy)
        if result != before:
            gradebook.write_atomic(path, json.dumps(result, indent=1))
    return todo
