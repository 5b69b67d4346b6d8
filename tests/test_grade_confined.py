"""`rooflab grade` confines each notebook: tried by hostile learners, end to end on a CPU.

A class of four is graded in the course's own environment, where ``rooflab.kernels``
holds every answer, as the README's instructor command does:

* an honest learner, whose lab 01 passes;
* one whose lab 01 imports the course's kernels instead of writing them: the sandbox
  mounts the kernels without their answers over the installed ones, so NOT IMPLEMENTED;
* one whose lab 00 hands in the grader's own references: each exercise fails, naming them;
* one whose lab 00 tries, from its own cells, everything confinement forbids: reading
  the grader's environment in any process in view (/proc/N/environ, cmdline, mem),
  another submission, finding the gradebook through /proc, writing a result of its own
  into it, writing outside its folder, reaching a server of the grader's, and leaving
  processes behind, one of them from a cell that then ends the kernel. Where an attempt
  works, that exercise computes a wrong answer, so a pass is the proof it failed; what
  it would have written is looked for outside afterwards.
"""

import inspect
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import cheats
import pytest

from rooflab.autograder.confine import why_unavailable
from rooflab.autograder.grading.release import release

pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
MARKER = f"rooflab-leftover-{os.getpid()}"


def _solved(lab: str) -> dict:
    return json.loads((ROOT / "solutions" / f"{lab}.ipynb").read_text())


def _with(notebook: dict, changes: dict) -> dict:
    for cell in notebook["cells"]:
        if cell["id"] in changes:
            cell["source"] = changes[cell["id"]]("".join(cell["source"]))
    return notebook


def _imports_the_answers(notebook: dict) -> dict:
    """Lab 01's three exercises (vector add both ways in), each handed in as an import of
    the course's own kernel, in every cell that defines it."""
    imports = {"def vector_add(": "from rooflab.kernels.vector_add import add_kernel, "
                                  "vector_add\n",
               "def strided_copy(": "from rooflab.kernels.strided_copy import strided_copy\n",
               "def transpose(": "from rooflab.kernels.transpose import transpose\n"}
    changes = {}
    for cell in notebook["cells"]:
        for defines, line in imports.items():
            if cell["cell_type"] == "code" and defines in "".join(cell["source"]):
                changes[cell["id"]] = lambda s, line=line: line
    assert len(changes) == 4, changes
    return _with(notebook, changes)


# Lab 00's six exercises, each handed in as the grader's own reference.
LAB00 = {"00-005": ("cost_vector_add", "roofline/cost_vector_add"),
         "00-008": ("cost_softmax", "roofline/cost_softmax"),
         "00-011": ("cost_matmul", "roofline/cost_matmul"),
         "00-014": ("cost_attention", "roofline/cost_attention"),
         "00-017": ("time_floor", "roofline/time_floor"),
         "00-028": ("measure", "roofline/timer")}
BORROWS_THE_REFERENCES = {
    cell: (lambda s, name=name, problem=problem: "from rooflab.autograder import get_problem\n"
           f"{name} = get_problem({problem!r}).reference\n")
    for cell, (name, problem) in LAB00.items()}


def _daemon(what: str) -> str:
    """Lines that leave a process in a session of its own, doing ``what`` after 3 s."""
    body = f"import time; time.sleep(3); {what}; time.sleep(60)"
    return (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {body!r}, "
            f"{MARKER!r}], start_new_session=True)\n")


def _hostile(paths: dict) -> dict:
    """Lab 00, solved, but each exercise's cell also tries one thing confinement forbids;
    if it works, the exercise's answer goes wrong."""
    forged = json.dumps({"learner": "oscar", "lab": "00_roofline", "grades": []})
    result = str(paths["out"] / "results" / "oscar--00_roofline.json")

    def wrong_if(condition: str, name: str) -> str:
        return (f"\nif {condition}:\n    _right_{name} = {name}\n"
                f"    {name} = lambda *a: tuple(2 * v for v in _right_{name}(*a))\n")

    reads = (f"import os\n_seen = os.path.exists({str(paths['other'])!r}) or "
             f"os.path.exists({str(paths['out'])!r})\n")
    # The grader's command line in /proc, or its environment in any process in view (the
    # sandbox's own first process, bubblewrap, among them): environ, cmdline and memory.
    secret = cheats.GRADERS_SECRET[1][::-1]  # reversed: the cell itself is in view
    proc = ("import os\n_found = [p for p in os.listdir('/proc') if p.isdigit() and "
            "b'--out' in open(f'/proc/{p}/cmdline', 'rb').read()]\n"
            + inspect.getsource(cheats.seen_in_proc)
            + f"_seen = seen_in_proc({secret!r}[::-1].encode())\n"
            "_found = _found or _seen['holding'] or _seen['memory_read'] == 0\n")
    # The grader's scratch folder, where the other notebooks' folders are: the sandbox
    # has a /tmp of its own, so a write there lands in it, and is looked for outside.
    writes = ("_wrote = []\n"
              f"open({str(paths['tmp'] / 'mine.txt')!r}, 'w').write('x')\n"
              f"for _path in [{result!r}, {str(paths['labs'] / 'mine.txt')!r}]:\n"
              "    try:\n        open(_path, 'w').write('x')\n        _wrote.append(_path)\n"
              "    except OSError:\n        pass\n")
    net = ("import socket\ntry:\n"
           f"    socket.create_connection(('127.0.0.1', {paths['port']}), timeout=2)\n"
           "    _reached = True\nexcept OSError:\n    _reached = False\n")
    rewrite = f"open({result!r}, 'w').write({forged!r})"
    # Its records folder swapped for a link to a folder of the grader's, which the grader,
    # taking the records out, would empty.
    swap = ("import os, shutil\n_into = os.environ['ROOFLAB_GRADE_INTO']\ntry:\n"
            "    shutil.rmtree(_into)\nexcept OSError:\n    pass\ntry:\n"
            f"    os.symlink({str(paths['victim'])!r}, _into)\nexcept OSError:\n    pass\n")
    return _with(_solved("00_roofline"), {
        "00-005": lambda s: s + "\n" + reads + wrong_if("_seen", "cost_vector_add"),
        "00-008": lambda s: s + "\n" + proc + wrong_if("_found", "cost_softmax"),
        "00-011": lambda s: s + "\n" + writes + wrong_if("_wrote", "cost_matmul"),
        "00-017": lambda s: s + "\n" + net + wrong_if("_reached", "time_floor"),
        # A background process that rewrites its result later, from a cell that goes on...
        "00-028": lambda s: _daemon(rewrite) + swap + s,
        # ... and one left by a cell that ends the kernel.
        "00-014": lambda s: _daemon(rewrite) + "import os\nos._exit(1)\n" + s,
    })


def _alive() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and MARKER.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if why_unavailable():
        pytest.skip(f"no sandbox here: {why_unavailable()}")
    root = tmp_path_factory.mktemp("confined")
    course, handed, out, tmp = root / "course", root / "handed", root / "out", root / "tmp"
    release(ROOT, course)
    victim = root / "victim"
    for folder in (handed, tmp, victim / "inner"):
        folder.mkdir(parents=True)
    (victim / "001.json").write_text("the grader's")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    paths = {"out": out, "labs": course / "labs", "tmp": tmp, "port": server.getsockname()[1],
             "other": handed / "alice.ipynb", "victim": victim}
    notebooks = {"alice": _solved("01_coalescing"),
                 "mallory": _imports_the_answers(_solved("01_coalescing")),
                 "trent": _with(_solved("00_roofline"), BORROWS_THE_REFERENCES),
                 "oscar": _hostile(paths)}
    for learner, notebook in notebooks.items():
        (handed / f"{learner}.ipynb").write_text(json.dumps(notebook))
    command = [sys.executable, "-m", "rooflab.autograder.cli", "grade",
               *(str(handed / f"{name}.ipynb") for name in notebooks), "--out", str(out),
               "--course", str(course), "--jobs", "2", "--cell-timeout", "60",
               "--memory", "6G"]
    start = time.monotonic()
    name, secret = cheats.GRADERS_SECRET
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TMPDIR=str(tmp), **{name: secret}))
    seconds = time.monotonic() - start
    left = _alive()
    time.sleep(4)  # past the daemons' 3 s: had one lived, it would have written by now
    connected = True
    try:
        server.accept()
    except TimeoutError:
        connected = False
    finally:
        server.close()
    for pid in _alive():
        os.kill(pid, 9)
    results = {path.stem.split("--")[0]: json.loads(path.read_text())
               for path in sorted((out / "results").glob("*.json"))}
    return {"done": done, "results": results, "left": left, "connected": connected,
            "paths": paths, "seconds": seconds}


def _verdicts(result: dict) -> dict[str, str]:
    return {grade["exercise"]: grade["verdict"] for grade in result["grades"]}


def test_an_honest_notebook_passes_confined(graded):
    assert graded["done"].returncode == 0, graded["done"].stderr
    alice = graded["results"]["alice"]
    assert alice["confined"] is True
    assert set(_verdicts(alice).values()) == {"PASS"}, alice["grades"]


def test_importing_the_courses_kernels_gets_their_stubs(graded):
    """And is told so: not that the exercise is unwritten."""
    grades = graded["results"]["mallory"]["grades"]
    assert [g["verdict"] for g in grades] == ["FAIL"] * 3, grades
    assert {g["exercise"] for g in grades} == {
        "coalescing/vector_add", "coalescing/strided_copy", "coalescing/transpose"}
    for grade in grades:
        assert "which this copy of the course ships as a stub" in grade["message"], grade


def test_handing_in_the_graders_references_fails_every_exercise(graded):
    grades = graded["results"]["trent"]["grades"]
    assert [g["verdict"] for g in grades] == ["FAIL"] * 6, grades
    for grade in grades:
        assert "calls the grader's own rooflab.autograder.problems.roofline" in grade["message"]


def test_a_notebook_sees_no_other_submission_no_gradebook_and_no_grader(graded):
    verdicts = _verdicts(graded["results"]["oscar"])
    assert verdicts["roofline/cost_vector_add"] == "PASS"  # read neither alice nor --out
    # No process in view has --out in its command line, nor the grader's secret in its
    # environment, command line or memory (and the memory of one was read).
    assert verdicts["roofline/cost_softmax"] == "PASS"


def test_a_notebook_writes_nowhere_but_its_own_folder(graded):
    paths = graded["paths"]
    assert _verdicts(graded["results"]["oscar"])["roofline/cost_matmul"] == "PASS"
    assert not (paths["labs"] / "mine.txt").exists()
    assert not (paths["tmp"] / "mine.txt").exists()


def test_a_notebook_reaches_no_network_but_its_own_loopback(graded):
    assert _verdicts(graded["results"]["oscar"])["roofline/time_floor"] == "PASS"
    assert not graded["connected"]


def test_a_notebook_cannot_make_the_grader_touch_a_folder_of_its_own(graded):
    victim = graded["paths"]["victim"]
    assert (victim / "001.json").read_text() == "the grader's" and (victim / "inner").is_dir()
    assert _verdicts(graded["results"]["oscar"])["roofline/timer"] == "PASS"


def test_nothing_a_notebook_starts_outlives_it_or_rewrites_its_result(graded):
    assert graded["left"] == []
    oscar = graded["results"]["oscar"]
    assert oscar["grades"], "the result was rewritten"
    verdicts = _verdicts(oscar)
    assert verdicts["roofline/cost_attention"] == "FAIL"  # its cell ended the kernel
    assert verdicts["roofline/timer"] == "PASS"


def test_grading_refuses_to_run_unconfined_where_the_answers_are_installed(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rooflab.autograder.cli", "grade",
                           str(tmp_path / "x.ipynb"), "--out", str(tmp_path / "out"),
                           "--course", str(ROOT), "--unconfined"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "holds the course's answers" in done.stderr
    assert not (tmp_path / "out").exists()


def test_grading_refuses_to_run_without_bubblewrap(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rooflab.autograder.cli", "grade",
                           str(tmp_path / "x.ipynb"), "--out", str(tmp_path / "out"),
                           "--course", str(ROOT)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PATH=str(tmp_path)))
    assert done.returncode == 2
    assert "bubblewrap is not installed" in done.stderr and "--unconfined" in done.stderr


def test_the_kernels_a_graded_notebook_imports_are_stubs_for_20_seeds(tmp_path):
    """What the sandbox mounts over the installed kernels: the course's modules with their
    answers replaced by stubs, so importing one is NOT IMPLEMENTED, whatever the inputs."""
    import importlib.util

    from rooflab.autograder import check
    from rooflab.autograder.confine import package_folder
    from rooflab.autograder.course.answers import holds_answers, write_without_answers

    installed = package_folder("rooflab.kernels")
    released = write_without_answers(installed, tmp_path / "kernels")
    assert holds_answers(installed) and holds_answers(released) == []
    spec = importlib.util.spec_from_file_location("released_vector_add",
                                                  released / "vector_add.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for seed in range(20):
        result = check("coalescing/vector_add", module.vector_add, seed=seed, show=False,
                       raise_on_failure=False)
        assert result.verdict == "NOT IMPLEMENTED", result.message()


def test_a_record_counts_for_the_cell_that_was_running_when_it_was_written(tmp_path):
    """execute.py takes each cell's records out of the kernel's folder as the cell ends:
    one written in an earlier cell (or by something left running) is not the check's."""
    from rooflab.autograder.grading.execute import take_records
    from rooflab.autograder.grading.grade import taken_records

    records, taken = tmp_path / "records", tmp_path / "taken"
    records.mkdir()
    forged = {"cell": "00-006", "problem": "roofline/cost_vector_add", "verdict": "PASS"}
    (records / "001.json").write_text(json.dumps(forged))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "002.json").write_text("the grader's")
    (records / "003.json").symlink_to(tmp_path / "elsewhere" / "002.json")
    take_records(records, taken / "00-005")  # written during a learner's cell
    take_records(records, taken / "00-006")  # the check cell itself left nothing
    assert [p.name for p in records.iterdir()] == ["003.json"]  # a link: left where it is
    [(record, outputs)] = taken_records(taken)
    assert record["cell"] == "00-005"  # not what the record says
    assert outputs == taken / "00-005" / "001-outputs.pt"
    # The records folder itself a link: nothing is taken through it.
    records.rename(tmp_path / "old")
    records.symlink_to(tmp_path / "elsewhere")
    take_records(records, taken / "00-009")
    assert (tmp_path / "elsewhere" / "002.json").read_text() == "the grader's"
    assert not (taken / "00-009").exists()


def test_a_check_cell_with_a_second_record_fails(tmp_path):
    """A record written beside the check's own (by a thread, or the candidate itself,
    during the check cell) makes the exercise fail, whichever of them says PASS."""
    from rooflab.autograder.grading.cells import Exercise
    from rooflab.autograder.grading.verdicts import grade_exercises

    exercise = Exercise("00-006", "roofline/cost_vector_add")
    run = {"cells": [{"index": 3, "id": "00-006", "seconds": 0.1, "error": ""}]}
    real = {"cell": "00-006", "problem": exercise.problem_id, "seed": 5, "verdict": "FAIL",
            "message": "FAIL: wrong", "replaced": []}
    forged = dict(real, verdict="PASS", message="PASS")
    for records in ([real, forged], [forged, real]):
        [grade] = grade_exercises([exercise], run, [(r, tmp_path / "x.pt") for r in records],
                                  seed=5)
        assert grade.verdict == "FAIL" and "left 2 records" in grade.message
