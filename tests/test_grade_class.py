"""`rooflab grade` on a class as handed in: one result per learner and lab, whatever a
learner handed in twice; shards that merge only when each folder is there and none
repeats another; and a roster, to name who handed in nothing."""

import copy
import csv
import io
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from rooflab.autograder.cli import main
from rooflab.autograder.confine import why_unavailable
from rooflab.autograder.grading import gradebook
from rooflab.autograder.grading.grade import Task, find_tasks, refused
from rooflab.autograder.grading.release import release

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600.0


def _notebook(lab: str = "01", cells: int = 3) -> str:
    """A submission to lab ``lab``: what find_tasks reads of it is its cell ids."""
    return json.dumps({"cells": [{"cell_type": "code", "id": f"{lab}-{i:03d}", "source": "",
                                  "metadata": {}} for i in range(cells)]})


@pytest.fixture
def labs(tmp_path: Path) -> Path:
    folder = tmp_path / "labs"
    folder.mkdir()
    for name in ("01_coalescing.ipynb", "02_matmul.ipynb"):
        (folder / name).write_text("")  # lab_of reads only the file names of the labs
    return folder


def _write(path: Path, text: str, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


# --- several notebooks of one learner for one lab ----------------------------------------

def test_two_notebooks_for_one_lab_are_one_task_not_graded_and_named(tmp_path, labs):
    alice = tmp_path / "alice"
    first = _write(alice / "01_coalescing.ipynb", _notebook())
    copy1 = _write(alice / "01_coalescing-Copy1.ipynb", _notebook())
    _write(alice / "02_matmul.ipynb", _notebook("02"))
    tasks, problems = find_tasks([alice], labs, tmp_path / "unpacked")
    by_lab = {t.lab_name: t for t in tasks}
    assert sorted(by_lab) == ["01_coalescing", "02_matmul"]
    assert by_lab["01_coalescing"].clash == sorted([str(first), str(copy1)])
    assert by_lab["02_matmul"].clash == []
    [line] = problems
    assert str(first) in line and str(copy1) in line and "--pick newest" in line


def test_the_same_learner_handed_in_twice_is_a_clash_too(tmp_path, labs):
    """Two zips of one name must not unpack over each other and hide one."""
    paths = []
    for folder in ("monday", "tuesday"):
        paths.append(tmp_path / folder / "alice.zip")
        paths[-1].parent.mkdir()
        with zipfile.ZipFile(paths[-1], "w") as archive:
            archive.writestr("lab.ipynb", _notebook())
    [task], [line] = find_tasks(paths, labs, tmp_path / "unpacked")
    assert task.clash == [f"{paths[0]}:lab.ipynb", f"{paths[1]}:lab.ipynb"]
    assert f"{paths[0]}:lab.ipynb" in line and f"{paths[1]}:lab.ipynb" in line


@pytest.mark.parametrize("newer", ["01_coalescing.ipynb", "01_coalescing-Copy1.ipynb"])
def test_pick_newest_grades_the_last_modified_and_names_the_others(tmp_path, labs, newer):
    alice = tmp_path / "alice"
    for name in ("01_coalescing.ipynb", "01_coalescing-Copy1.ipynb", "lab1-old.ipynb"):
        _write(alice / name, _notebook(), age_s=0 if name == newer else HOUR)
    [task], problems = find_tasks([alice], labs, tmp_path / "unpacked", pick="newest")
    assert problems == []
    assert task.notebook == alice / newer and task.clash == []
    assert sorted(task.left_out) == sorted(str(p) for p in alice.iterdir()
                                           if p.name != newer)


def test_pick_newest_in_a_zip_goes_by_the_dates_in_the_zip(tmp_path, labs):
    path = tmp_path / "bob.zip"
    with zipfile.ZipFile(path, "w") as archive:
        # The newer one first in the zip, and first by name: only its date picks it.
        archive.writestr(zipfile.ZipInfo("a/lab01.ipynb", (2024, 5, 2, 12, 0, 0)), _notebook())
        archive.writestr(zipfile.ZipInfo("b/lab01.ipynb", (2024, 5, 1, 12, 0, 0)), _notebook())
    [task], _ = find_tasks([path], labs, tmp_path / "unpacked", pick="newest")
    assert task.learner == "bob"
    assert task.notebook.parts[-2:] == ("a", "lab01.ipynb")
    assert task.left_out == [f"{path}:b/lab01.ipynb"]


def test_checkpoints_and_mac_resource_forks_are_not_second_notebooks(tmp_path, labs):
    path = tmp_path / "carol.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("01_coalescing.ipynb", _notebook())
        archive.writestr(".ipynb_checkpoints/01_coalescing-checkpoint.ipynb", _notebook())
        archive.writestr("__MACOSX/._01_coalescing.ipynb", _notebook())
    [task], problems = find_tasks([path], labs, tmp_path / "unpacked")
    assert task.clash == [] and problems == []


def test_an_unknown_pick_is_refused(tmp_path, labs):
    with pytest.raises(ValueError, match="--pick"):
        find_tasks([], labs, tmp_path, pick="oldest")


def test_a_lab_not_graded_fails_every_exercise_and_says_why():
    lab = ROOT / "labs" / "00_roofline.ipynb"
    task = Task("alice", Path("a.ipynb"), lab, clash=["x/a.ipynb", "x/b.ipynb"])
    result = refused(task)
    assert result["grades"] and all(g["verdict"] == "FAIL" for g in result["grades"])
    assert all("x/a.ipynb" in g["message"] and "x/b.ipynb" in g["message"]
               for g in result["grades"])
    assert result["clash"] == ["x/a.ipynb", "x/b.ipynb"]


def _result(out: Path, learner: str, lab: str = "00_roofline", clash: list | None = None,
            verdict: str = "PASS") -> None:
    result = {"learner": learner, "lab": lab, "notebook": f"{learner}.ipynb", "seconds": 1.0,
              "grades": [{"exercise": "roofline/timer", "verdict": verdict, "message": "",
                          "seconds": 0.5}], "problems": [], "changed": []}
    if clash:
        result["clash"] = clash
    gradebook.write_atomic(gradebook.result_path(out, learner, lab), json.dumps(result))


def test_resume_skips_a_graded_lab_and_not_one_left_ungraded(tmp_path):
    _result(tmp_path, "alice")
    _result(tmp_path, "bob", clash=["b1.ipynb", "b2.ipynb"])
    assert gradebook.graded(tmp_path, "alice", "00_roofline")
    assert not gradebook.graded(tmp_path, "bob", "00_roofline")
    assert not gradebook.graded(tmp_path, "carol", "00_roofline")


# --- merging shards ------------------------------------------------------------------------

def test_merge_refuses_a_shard_folder_that_does_not_exist(tmp_path):
    _result(tmp_path / "s1", "alice")
    shard = tmp_path / "missing"
    with pytest.raises(ValueError, match=re.escape(str(shard))):
        gradebook.merge([tmp_path / "s1", shard], tmp_path / "all")
    assert not (tmp_path / "all").exists()  # nothing half merged


@pytest.mark.parametrize("empty", ["results-empty", "no-results"])
def test_merge_takes_a_shard_that_got_no_notebook(tmp_path, empty):
    # A CI matrix wider than a small class leaves some shards with nothing to grade.
    _result(tmp_path / "s1", "alice")
    shard = tmp_path / empty
    (shard / ("results" if empty == "results-empty" else "other")).mkdir(parents=True)
    gradebook.merge([tmp_path / "s1", shard], tmp_path / "all")
    book = json.loads((tmp_path / "all" / "gradebook.json").read_text())
    assert [r["learner"] for r in book["results"]] == ["alice"]


def test_merge_refuses_a_learners_lab_in_two_shards(tmp_path):
    _result(tmp_path / "s1", "alice")
    _result(tmp_path / "s2", "bob")
    _result(tmp_path / "s2", "alice", verdict="FAIL")
    with pytest.raises(ValueError) as error:
        gradebook.merge([tmp_path / "s1", tmp_path / "s2"], tmp_path / "all")
    assert "alice--00_roofline" in str(error.value)
    assert str(tmp_path / "s1") in str(error.value) and str(tmp_path / "s2") in str(error.value)
    assert not (tmp_path / "all").exists()


def test_rooflab_grade_merge_exits_2_naming_the_missing_shard(tmp_path, capsys):
    _result(tmp_path / "s1", "alice")
    missing = tmp_path / "s2"
    status = main(["grade", "--merge", str(tmp_path / "s1"), str(missing), "--out",
                   str(tmp_path / "all")])
    assert status == 2
    assert str(missing) in capsys.readouterr().err


def test_require_pass_fails_on_a_lab_not_graded(tmp_path, capsys):
    _result(tmp_path / "s1", "alice", clash=["a1.ipynb", "a2.ipynb"], verdict="FAIL")
    status = main(["grade", "--merge", str(tmp_path / "s1"), "--out", str(tmp_path / "all"),
                   "--require-pass"])
    assert status == 1
    page = (tmp_path / "all" / "gradebook.html").read_text()
    assert "Not graded:" in page and "alice 00_roofline" in page


# --- a roster --------------------------------------------------------------------------------

def test_a_roster_is_its_first_column_without_header_blanks_or_repeats(tmp_path):
    path = tmp_path / "learners.csv"
    path.write_text("\ufefflearner,email\nalice,a@x\n\n bob ,b@x\nalice,a@x\ncarol\n",
                    encoding="utf-8")
    assert gradebook.read_roster(path) == ["alice", "bob", "carol"]
    (tmp_path / "empty.csv").write_text("learner\n")
    with pytest.raises(ValueError, match="no learner"):
        gradebook.read_roster(tmp_path / "empty.csv")
    with pytest.raises(ValueError, match="nowhere.csv"):
        gradebook.read_roster(tmp_path / "nowhere.csv")


def test_the_views_name_who_handed_in_nothing_and_who_is_not_on_the_roster(tmp_path, capsys):
    _result(tmp_path / "s1", "alice")
    _result(tmp_path / "s2", "zed")
    (tmp_path / "learners.csv").write_text("learner\nalice\nbob\ncarol\n")
    out = tmp_path / "all"
    status = main(["grade", "--merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out",
                   str(out), "--roster", str(tmp_path / "learners.csv")])
    assert status == 0
    book = json.loads((out / "gradebook.json").read_text())
    assert book["missing"] == ["bob", "carol"] and book["not_on_roster"] == ["zed"]
    rows = list(csv.DictReader(io.StringIO((out / "gradebook.csv").read_text())))
    assert [(r["learner"], r["verdict"]) for r in rows if r["verdict"] == "MISSING"] == [
        ("bob", "MISSING"), ("carol", "MISSING")]
    page = (out / "gradebook.html").read_text()
    assert re.search(r"<td>bob</td>.*handed in nothing", page)
    assert re.search(r"Not on the roster:</b> zed", page)
    err = capsys.readouterr().err
    assert "handed in nothing (2): bob, carol" in err and "not on the roster (1): zed" in err


def test_without_a_roster_the_views_name_no_one_missing(tmp_path):
    _result(tmp_path, "alice")
    gradebook.write_views(tmp_path)
    assert "missing" not in json.loads((tmp_path / "gradebook.json").read_text())


def test_a_roster_with_a_shard_is_refused(tmp_path, capsys):
    (tmp_path / "learners.csv").write_text("alice\n")
    status = main(["grade", str(tmp_path / "alice.ipynb"), "--out", str(tmp_path / "out"),
                   "--shard", "1/2", "--roster", str(tmp_path / "learners.csv")])
    assert status == 2 and "--merge" in capsys.readouterr().err


# --- end to end: a learner with two notebooks for lab 00 ------------------------------------

SOLVED = json.loads((ROOT / "solutions" / "00_roofline.ipynb").read_text())


def _wrong() -> dict:
    """The solved notebook with one wrong answer (cost_softmax)."""
    notebook = copy.deepcopy(SOLVED)
    [cell] = [c for c in notebook["cells"] if c["id"] == "00-008"]
    source = "".join(cell["source"])
    # Without the line to break, the notebook stays solved and the test tests nothing.
    assert "flops = 5 * elements" in source, "cell 00-008 no longer holds the answer"
    cell["source"] = source.replace("flops = 5 * elements", "flops = 4 * elements")
    return notebook


def _counts(err: str) -> tuple[int, int]:
    """(how many `--resume` said were already graded, the N of the progress lines)."""
    already = re.search(r"(\d+) already graded \(--resume\)", err)
    totals = {int(n) for n in re.findall(r"^\[\d+/(\d+)\]", err, re.M)}
    assert len(totals) <= 1, err
    return int(already.group(1)) if already else 0, totals.pop() if totals else 0


@pytest.mark.skipif(bool(why_unavailable()), reason=f"no sandbox here: {why_unavailable()}")
def test_one_learner_one_lab_one_result_and_the_counts_agree(tmp_path):
    pytest.importorskip("nbclient")
    course = tmp_path / "course"
    release(ROOT, course)
    alice = tmp_path / "submissions" / "alice"
    # The older copy has a wrong answer: only the newer one passes everything. The newer
    # sorts first by name, so only its time can pick it.
    old = _write(alice / "00_roofline.ipynb", json.dumps(_wrong()), age_s=HOUR)
    new = _write(alice / "00_roofline-Copy1.ipynb", json.dumps(SOLVED))
    bob = _write(tmp_path / "submissions" / "bob.ipynb", json.dumps(SOLVED))
    (tmp_path / "learners.csv").write_text("learner\nalice\nbob\ncarol\n")
    out = tmp_path / "gradebook"
    command = [sys.executable, "-m", "rooflab.autograder.cli", "grade", str(alice), str(bob),
               "--out", str(out), "--course", str(course), "--jobs", "2",
               "--cell-timeout", "20", "--memory", "6G"]

    def run(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *more], capture_output=True, text=True, timeout=400)

    # Default: alice's lab is not graded, and both her files are named, on stderr and in
    # the gradebook; bob is graded; carol handed in nothing.
    first = run("--require-pass", "--roster", str(tmp_path / "learners.csv"))
    assert first.returncode == 1, first.stderr  # alice's result fails every exercise
    assert str(old) in first.stderr and str(new) in first.stderr
    assert "handed in nothing (1): carol" in first.stderr
    results = {r["learner"]: r for r in gradebook.load_results(out)}
    assert sorted(results) == ["alice", "bob"]
    assert all(str(old) in g["message"] and str(new) in g["message"]
               for g in results["alice"]["grades"])
    assert all(g["verdict"] == "PASS" for g in results["bob"]["grades"])
    assert _counts(first.stderr) == (0, 2)

    # --pick newest, resumed: bob is not graded again, alice's newer notebook is.
    second = run("--pick", "newest", "--resume")
    assert second.returncode == 0, second.stderr
    already, todo = _counts(second.stderr)
    assert (already, todo) == (1, 1)
    assert already + todo == len(gradebook.load_results(out)) == 2
    [alice_result] = [r for r in gradebook.load_results(out) if r["learner"] == "alice"]
    assert alice_result["notebook"] == str(new)
    assert all(g["verdict"] == "PASS" for g in alice_result["grades"])
    assert any(str(old) in line for line in alice_result["problems"])

    # Resumed again: everything is graded, counted once per learner and lab.
    third = run("--pick", "newest", "--resume", "--require-pass")
    assert third.returncode == 0, third.stderr + third.stdout
    assert _counts(third.stderr) == (len(gradebook.load_results(out)), 0) == (2, 0)
