"""`rooflab grade`, end to end on a CPU: a release is built, a class of six submissions to
lab 00 is graded in parallel, interrupted, and resumed; each learner gets the grade their
notebook earns, whatever it did to the checks, the timer or the kernel, and every exercise
a learner did not break still passes."""

import copy
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from datetime import datetime
from pathlib import Path
from xml.etree import ElementTree

import pytest

from rooflab.autograder.confine import why_unavailable
from rooflab.autograder.grading import gradebook
from rooflab.autograder.grading.cells import exercises, restore
from rooflab.autograder.grading.release import release

pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
SOLVED = json.loads((ROOT / "solutions" / "00_roofline.ipynb").read_text())
# Far ahead, so that a zip dated when the test runs is on time.
DEADLINE_ISO, DAY = "2099-12-01T12:00:00+00:00", 86400.0
DEADLINE = datetime.fromisoformat(DEADLINE_ISO).timestamp()
EXERCISES = ["roofline/cost_vector_add", "roofline/cost_softmax", "roofline/cost_matmul",
             "roofline/cost_attention", "roofline/time_floor", "roofline/timer"]


def _edited(changes: dict, without: tuple[str, ...] = ()) -> dict:
    """The solved notebook with each cell of ``changes`` changed (cell id: new source from
    the old) and the cells ``without`` deleted."""
    notebook = copy.deepcopy(SOLVED)
    notebook["cells"] = [c for c in notebook["cells"] if c["id"] not in without]
    for cell in notebook["cells"]:
        if cell["id"] in changes:
            cell["source"] = changes[cell["id"]]("".join(cell["source"]))
    return notebook


CLASS = {
    # learner: (how it is handed in, the notebook, what each exercise must get)
    "alice": ("notebook", SOLVED, {}),
    # A check deleted: restored, and passes.
    "bob": ("folder", _edited({}, without=("00-006",)), {}),
    # A wrong answer, and its check edited to print a pass.
    "carol": ("zip", _edited({
        "00-008": lambda s: s.replace("flops = 5 * elements", "flops = 4 * elements"),
        "00-009": lambda s: 'print("PASS roofline/cost_softmax")',
    }), {"roofline/cost_softmax": "flops: got"}),
    # An endless loop, interrupted at the cell's time limit; then more memory than the cap
    # allows, in an exercise of its own: grading goes on after each. The loop sleeps, to
    # leave the CPU to the notebook graded beside it.
    "dave": ("notebook", _edited({
        "00-011": lambda s: "import time\nwhile True:\n    time.sleep(0.05)\n" + s,
        "00-017": lambda s: "import torch\n_hog = torch.empty(1 << 40, dtype=torch.uint8)\n" + s,
    }), {"roofline/cost_matmul": "cell 00-011 failed (it ran past the cell time limit",
         "roofline/time_floor": "cell 00-017 failed ("}),
    # A clock running at half speed; and, in an exercise of its own, sys.exit(0), which
    # must not read as a pass.
    "erin": ("notebook", _edited({
        "00-028": lambda s: ("import time as _time\n_clock = _time.perf_counter\n"
                             "_time.perf_counter = lambda: _clock() * 0.5\n") + s,
        "00-005": lambda s: "import sys\nsys.exit(0)\n" + s,
    }), {"roofline/timer": "replaced time.perf_counter",
         "roofline/cost_vector_add": "cell 00-005 failed (SystemExit: 0)"}),
    # A cell ending the kernel: the notebook runs again without it, and only its own
    # exercise fails.
    "frank": ("notebook", _edited({"00-014": lambda s: "import os\nos._exit(0)\n" + s}),
              {"roofline/cost_attention": "cell 00-014 ended the kernel"}),
}


def _hand_in(folder: Path, learner: str, how: str, notebook: dict) -> Path:
    text = json.dumps(notebook)
    if how == "folder":
        (folder / learner).mkdir()
        (folder / learner / "00_roofline.ipynb").write_text(text)
        return folder / learner
    if how == "zip":
        with zipfile.ZipFile(folder / f"{learner}.zip", "w") as archive:
            archive.writestr("work/lab00.ipynb", text)
        return folder / f"{learner}.zip"
    (folder / f"{learner}.ipynb").write_text(text)
    return folder / f"{learner}.ipynb"


def _ours(marker: str) -> list[int]:
    """Processes whose command line or environment mentions ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in text:
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if why_unavailable():  # grading runs each notebook in bubblewrap
        pytest.skip(f"no sandbox here: {why_unavailable()}")
    root = tmp_path_factory.mktemp("class")
    course = root / "course"
    release(ROOT, course)
    handed = root / "submissions"
    handed.mkdir()
    paths = [str(_hand_in(handed, learner, how, nb)) for learner, (how, nb, _) in CLASS.items()]
    out, scratch = root / "gradebook", root / "tmp"
    scratch.mkdir()
    # Everyone handed in before the deadline (carol's zip is dated now), but frank, a day
    # and an hour late.
    for path in paths:
        when = DEADLINE + DAY + 3600 if "frank" in path else DEADLINE - 3600
        os.utime(path if not Path(path).is_dir() else next(Path(path).glob("*.ipynb")),
                 (when, when))
    # dave's endless loop runs out the cell time limit: 10 s, over three times lab 00's
    # longest cell (about 3 s with two notebooks at once), and no longer than that.
    command = [sys.executable, "-m", "rooflab.autograder.cli", "grade", *paths, "--out",
               str(out), "--course", str(course), "--jobs", "2", "--cell-timeout", "10",
               "--memory", "6G", "--deadline", DEADLINE_ISO, "--late-penalty", "25%"]
    env = dict(os.environ, TMPDIR=str(scratch))  # every notebook's scratch, to find later
    # First run: interrupted (Ctrl-C) once a notebook is graded.
    first = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not list((out / "results").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    first_err = first.communicate(timeout=60)[1]
    time.sleep(1)
    left = _ours(str(scratch))
    before = {p.name: p.stat().st_mtime_ns for p in (out / "results").glob("*.json")}
    interrupted_book = json.loads((out / "gradebook.json").read_text())
    try:
        second = subprocess.run([*command, "--resume"], env=env, capture_output=True,
                                text=True, timeout=400)
    finally:
        for pid in _ours(str(scratch)):  # never leave a hung grading behind the suite
            os.kill(pid, signal.SIGKILL)
    return {"out": out, "first": (first.returncode, first_err), "left": left,
            "before": before, "second": second, "scratch": scratch,
            "interrupted_book": interrupted_book}


def test_an_interrupted_grading_ends_its_notebooks_and_resumes_without_grading_twice(graded):
    status, err = graded["first"]
    assert status == 130, err
    assert "--resume" in err
    assert graded["left"] == [], "processes left running after the interruption"
    assert graded["before"] and len(graded["before"]) < len(CLASS)
    # The gradebook an interruption leaves holds what was graded by then.
    assert len(graded["interrupted_book"]["results"]) == len(graded["before"])
    second = graded["second"]
    assert second.returncode == 0, second.stderr
    assert f"{len(graded['before'])} already graded (--resume)" in second.stderr
    results = graded["out"] / "results"
    for name, mtime in graded["before"].items():
        assert (results / name).stat().st_mtime_ns == mtime, f"{name} was graded again"
    assert len(list(results.glob("*.json"))) == len(CLASS)
    assert _ours(str(graded["scratch"])) == []


def test_each_learner_gets_the_grade_their_notebook_earns(graded):
    results = {r["learner"]: r for r in gradebook.load_results(graded["out"])}
    assert sorted(results) == sorted(CLASS)
    for learner, (_, _, failing) in CLASS.items():
        grades = {g["exercise"]: g for g in results[learner]["grades"]}
        assert list(grades) == EXERCISES
        for exercise, grade in grades.items():
            if exercise in failing:
                assert grade["verdict"] == "FAIL", (learner, exercise)
                assert failing[exercise] in grade["message"], (learner, grade["message"])
            else:
                assert grade["verdict"] == "PASS", (learner, exercise, grade["message"])
        assert results[learner]["seconds"] > 0


def test_protected_cells_are_restored_and_reported(graded):
    results = {r["learner"]: r for r in gradebook.load_results(graded["out"])}
    assert results["bob"]["changed"] == ["check cell 00-006 deleted"]
    assert results["carol"]["changed"] == ["check cell 00-009 edited"]
    assert results["alice"]["changed"] == []


def test_notebooks_are_graded_in_parallel(graded):
    spans = sorted((r["started"], r["finished"]) for r in gradebook.load_results(graded["out"]))
    assert any(b_start < a_end for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def test_the_views_agree_with_the_results(graded):
    out = graded["out"]
    suites = ElementTree.parse(out / "junit.xml").getroot()
    failures = {s.get("name"): int(s.get("failures")) for s in suites}
    assert failures == {f"{learner}.00_roofline": len(failing)
                        for learner, (_, _, failing) in CLASS.items()}
    rows = (out / "gradebook.csv").read_text().splitlines()
    assert rows[0].startswith("learner,lab,exercise,verdict,points")
    assert len(rows) == 1 + len(CLASS) * len(EXERCISES)
    page = (out / "gradebook.html").read_text()
    assert all(learner in page for learner in CLASS)
    assert "predicted" in page  # a CPU grades correctness and predicts performance


def test_points_and_lateness_reach_the_gradebook_and_each_learners_feedback(graded):
    out = graded["out"]
    results = {r["learner"]: r for r in gradebook.load_results(out)}
    for learner, (_, _, failing) in CLASS.items():
        # Lab 00 gives each exercise 1 point; frank is two days late (a day and an hour)
        # at 25% a day.
        expected = (len(EXERCISES) - len(failing)) * (0.5 if learner == "frank" else 1)
        assert results[learner]["points"]["earned"] == expected, learner
        assert results[learner]["points"]["possible"] == len(EXERCISES)
        page = (out / "feedback" / learner / "index.html").read_text()
        assert f"{expected:g} / {len(EXERCISES)} points" in page
        assert not any(other in page for other in CLASS if other != learner)
        # The notebook as graded, each check's card in its output, without the grader's
        # own line at the top of each check cell.
        executed = json.loads((out / "feedback" / learner / "00_roofline.ipynb").read_text())
        sources = ["".join(c["source"]) for c in executed["cells"]]
        assert not any("at_cell(" in source for source in sources)
        assert any(c.get("outputs") for c in executed["cells"] if c["cell_type"] == "code")
    assert "2 days late" in results["frank"]["points"]["late"]
    canvas = (out / "grades-canvas.csv").read_text().splitlines()
    assert canvas[1].split(",")[-1] == str(len(EXERCISES))  # points possible
    assert sorted(line.split(",")[-1] for line in canvas[2:]) == sorted(
        f"{results[name]['points']['earned']:g}" for name in CLASS)


# --- the pieces, quickly ------------------------------------------------------------------

LAB = json.loads((ROOT / "labs" / "00_roofline.ipynb").read_text())


def test_exercises_are_the_check_cells_of_the_lab():
    assert [e.problem_id for e in exercises(LAB)] == EXERCISES


def test_a_submission_without_cell_ids_is_matched_by_its_solution_cells():
    old = copy.deepcopy(SOLVED)
    for cell in old["cells"]:
        cell.pop("id", None)
    restored = restore(LAB, old)
    sources = {c["id"]: c["source"] for c in restored.notebook["cells"]}
    assert "3 * n * dtype_bytes" in sources["00-005"]
    assert restored.changed == []


def test_cells_a_learner_added_are_kept_in_place_and_moved_checks_are_put_back():
    mine = copy.deepcopy(SOLVED)
    check = next(c for c in mine["cells"] if c["id"] == "00-006")
    mine["cells"].remove(check)
    mine["cells"].append(check)  # a check moved to the end
    index = next(i for i, c in enumerate(mine["cells"]) if c["id"] == "00-005")
    mine["cells"].insert(index + 1, {"cell_type": "code", "id": "scratch", "metadata": {},
                                     "source": "helper = 1", "outputs": [],
                                     "execution_count": None})
    restored = restore(LAB, mine)
    ids = [c["id"] for c in restored.notebook["cells"]]
    assert ids.index("scratch") == ids.index("00-005") + 1
    assert ids.index("00-006") == ids.index("scratch") + 1
    assert restored.added == 1
