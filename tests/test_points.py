"""The instructor's side past the verdicts: points and partial credit, deadlines, every
export agreeing on the totals (Canvas and Moodle read back), feedback that holds one
learner only, --labs, --resume of a changed notebook, and shards merged from their
manifests. The notebooks are not run here (grade_one is replaced by a stand-in that reads
what each notebook claims); test_grade.py and test_ci_template.py run real ones."""

import copy
import csv
import io
import json
import os
import re
import time
from pathlib import Path

import pytest

from rooflab.autograder.cli import main
from rooflab.autograder.course import points
from rooflab.autograder.course.build import front_matter, masters
from rooflab.autograder.grading import grade, gradebook, scoring, shards
from rooflab.autograder.grading.cells import exercises, one_cell_each, started
from rooflab.autograder.grading.confinement import Confinement
from rooflab.autograder.grading.verdicts import Grade

ROOT = Path(__file__).resolve().parents[1]
LAB01 = json.loads((ROOT / "labs" / "01_coalescing.ipynb").read_text())
DAY = 86400.0
DEADLINE = "2026-12-01T12:00:00+00:00"


# --- a class, graded by a stand-in --------------------------------------------------------

def _submission(lab: str, solved: dict[str, float]) -> dict:
    """The learner notebook of ``lab`` with, in its first solution cell, what the stand-in
    grader reads: each exercise solved, and its traffic fraction."""
    notebook = copy.deepcopy(json.loads(next((ROOT / "labs").glob(f"{lab}_*.ipynb"))
                                        .read_text()))
    if solved:
        cell = next(c for c in notebook["cells"] if "solution" in c["metadata"].get("tags", []))
        cell["source"] = f"CLAIMS = {json.dumps(solved)}\n"
    # Points a submission gives itself count for nothing: the grader reads the course's lab.
    notebook["metadata"]["rooflab"] = {"grading": {"coalescing/vector_add": {"points": 100}}}
    return notebook


def _stand_in(task, limits, seed, confinement, feedback_to=None) -> dict:
    """What grade_one returns, from the claims a notebook makes: PASS with the claimed
    traffic fraction, or NOT IMPLEMENTED."""
    text = task.notebook.read_text()
    claims = json.loads(re.search(r"CLAIMS = (\{.*?\})", text).group(1).replace('\\"', '"')) \
        if "CLAIMS" in text else {}
    lab = json.loads(task.lab.read_text())
    result = {**grade._header(task), "confined": False, "sha256": grade.digest(task.notebook)}
    for exercise in one_cell_each(exercises(lab)):
        fraction = claims.get(exercise.problem_id)
        verdict = "PASS" if fraction is not None else "NOT IMPLEMENTED"
        performance = {"measured": False, "predicted_traffic_fraction": fraction} \
            if fraction is not None else {}
        result["grades"].append(Grade(exercise.problem_id, exercise.cell_id, verdict, "",
                                      0.1, performance).as_dict())
    if feedback_to is not None:
        (feedback_to / "feedback" / task.learner).mkdir(parents=True, exist_ok=True)
        (feedback_to / "feedback" / task.learner / f"{task.lab_name}.ipynb").write_text(text)
    result["seconds"], result["finished"] = 0.1, time.time()
    return result


@pytest.fixture
def stand_in(monkeypatch):
    calls = []

    def grade_one(task, *args, **kwargs):
        calls.append((task.learner, task.lab_name))
        return _stand_in(task, *args, **kwargs)

    monkeypatch.setattr(grade, "grade_one", grade_one)
    monkeypatch.setattr(grade, "prepare", lambda unconfined, scratch: Confinement(False))
    return calls


# alice: lab 01 all right, the transpose at a traffic fraction of 0.8 (half its speed
# point, between 0.7 and 0.9), on time. bob: lab 01's vector add only, two days late
# (10% a day). carol: labs 00 and 01, whatever she did; dave: nothing (on the roster).
CLASS = {
    "alice": {"01": ({"coalescing/vector_add": 1.0, "coalescing/strided_copy": 1.0,
                      "coalescing/transpose": 0.8}, -DAY)},
    "bob": {"01": ({"coalescing/vector_add": 1.0}, 1.5 * DAY)},
    "carol": {"00": ({"roofline/cost_vector_add": 1.0}, -DAY),
              "01": ({"coalescing/transpose": 1.0}, -DAY)},
}
# Each (learner, lab)'s points: alice 1 + 1 + (1 + 0.5); bob 1, less 20%; carol 1 of 6 in
# lab 00 and 2 of 4 in lab 01 (1 for the transpose's answer, 1 for its speed).
EXPECTED = {("alice", "01_coalescing"): (3.5, 4), ("bob", "01_coalescing"): (0.8, 4),
            ("carol", "00_roofline"): (1, 6), ("carol", "01_coalescing"): (2, 4)}


def _hand_in(folder: Path) -> list[Path]:
    deadline = scoring.parse_time(DEADLINE)
    paths = []
    for learner, labs in CLASS.items():
        for lab, (solved, after) in labs.items():
            path = folder / learner / f"{lab}_lab.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(_submission(lab, solved)))
            os.utime(path, (deadline + after, deadline + after))
        paths.append(folder / learner)
    return paths


ROSTER = "learner,SIS Login ID,Section,username\nalice,a01,s1,alice.a\nbob,b02,s1,bob.b\n" \
         "carol,c03,s2,carol.c\ndave,d04,s2,dave.d\n"


def _grade(tmp_path: Path, *more: str, out: str = "out", paths=None) -> int:
    (tmp_path / "roster.csv").write_text(ROSTER)
    paths = paths or _hand_in(tmp_path / "handed")
    return main(["grade", *map(str, paths), "--out", str(tmp_path / out), "--course",
                 str(ROOT), "--speed-on-cpu", "predicted", "--deadline", DEADLINE,
                 "--late-penalty", "10%", *more])


def test_points_partial_credit_and_lateness_agree_in_every_export(tmp_path, stand_in):
    assert _grade(tmp_path, "--roster", str(tmp_path / "roster.csv")) == 0
    out = tmp_path / "out"
    results = {(r["learner"], r["lab"]): r for r in gradebook.load_results(out)}
    got = {key: (r["points"]["earned"], r["points"]["possible"]) for key, r in results.items()}
    assert _rounded(got) == _rounded(EXPECTED)
    transpose = next(g for g in results["alice", "01_coalescing"]["grades"]
                     if g["exercise"] == "coalescing/transpose")["points"]
    assert (transpose["correctness"], transpose["speed"]) == pytest.approx((1, 0.5))
    assert "predicted roofline fraction 0.80 between 0.7 and 0.9" in transpose["why"]
    bob = results["bob", "01_coalescing"]["points"]
    assert bob["late_days"] == 2 and bob["before_penalty"] == 1 and "2 days late" in bob["late"]

    # The per-exercise CSV adds up to the same totals.
    rows = list(csv.DictReader(io.StringIO((out / "gradebook.csv").read_text())))
    summed: dict = {}
    for row in rows:
        if row["verdict"] != "MISSING":
            key = (row["learner"], row["lab"])
            earned, possible = summed.get(key, (0.0, 0.0))
            summed[key] = (earned + float(row["points"]), possible + float(row["points_possible"]))
    before_penalty = {**EXPECTED, ("bob", "01_coalescing"): (1, 4)}
    assert _rounded(summed) == _rounded(before_penalty)  # per exercise: before any penalty
    assert [r["learner"] for r in rows if r["verdict"] == "MISSING"] == ["dave"]

    # Canvas and Moodle, read back as each reads its layout.
    canvas = _read_canvas((out / "grades-canvas.csv").read_text())
    moodle = _read_moodle((out / "grades-moodle.csv").read_text())
    assert canvas["possible"] == moodle["possible"] == {"00_roofline": 6, "01_coalescing": 4}
    by_login = {"a01": "alice", "b02": "bob", "c03": "carol", "d04": "dave"}
    by_username = {f"{n}.{n[0]}": n for n in by_login.values()}
    for platform, key in ((canvas, by_login), (moodle, by_username)):
        grades = {(key[who], lab): value for (who, lab), value in platform["grades"].items()}
        for (learner, lab), (earned, _) in EXPECTED.items():
            assert grades[learner, lab] == pytest.approx(earned)
        assert grades["alice", "00_roofline"] == 0  # handed in nothing for it
        assert grades["dave", "01_coalescing"] == grades["dave", "00_roofline"] == 0

    page = (out / "gradebook.html").read_text()
    for earned, possible in EXPECTED.values():
        assert f"{earned:g} / {possible:g}" in page
    book = json.loads((out / "gradebook.json").read_text())
    assert book["missing"] == ["dave"]


def _rounded(totals: dict) -> dict:
    return {key: tuple(round(float(x), 4) for x in value) for key, value in totals.items()}


def _read_canvas(text: str) -> dict:
    """As Canvas reads its gradebook: identity columns, then one per assignment; the row
    whose Student is "Points Possible" gives each assignment's points."""
    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0]
    assert header[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    labs = header[5:]
    assert rows[1][0].strip() == "Points Possible"
    possible = dict(zip(labs, map(float, rows[1][5:]), strict=True))
    grades = {(row[3], lab): float(value) for row in rows[2:]
              for lab, value in zip(labs, row[5:], strict=True)}
    return {"possible": possible, "grades": grades}


def _read_moodle(text: str) -> dict:
    """As Moodle's grade import maps it: an identifier column, then one column per grade
    item, named "<item> (out of <max>)"."""
    rows = list(csv.DictReader(io.StringIO(text)))
    items = [c for c in rows[0] if c not in ("Username", "Email address", "ID number")]
    possible = {}
    for column in items:
        name, out_of = re.fullmatch(r"(.+) \(out of ([\d.]+)\)", column).groups()
        possible[name] = float(out_of)
    grades = {(row["Username"], re.sub(r" \(out of .*\)", "", c)): float(row[c])
              for row in rows for c in items}
    return {"possible": possible, "grades": grades}


def test_each_learners_feedback_holds_their_results_only(tmp_path, stand_in):
    assert _grade(tmp_path, "--roster", str(tmp_path / "roster.csv")) == 0
    feedback = tmp_path / "out" / "feedback"
    assert sorted(p.name for p in feedback.iterdir()) == ["alice", "bob", "carol"]
    for learner in ("alice", "bob", "carol"):
        files = sorted(p.name for p in (feedback / learner).iterdir())
        assert files == sorted(["index.html", *(f"{lab}.ipynb" for (who, lab) in EXPECTED
                                                if who == learner)])
        page = (feedback / learner / "index.html").read_text()
        for other in {"alice", "bob", "carol", "dave"} - {learner}:
            assert other not in page, (learner, other)
        for (who, lab), (earned, possible) in EXPECTED.items():
            if who == learner:
                assert lab in page and f"{earned:g} / {possible:g}" in page


def test_resume_keeps_an_unchanged_notebook_and_grades_a_changed_one(tmp_path, stand_in):
    paths = _hand_in(tmp_path / "handed")
    assert _grade(tmp_path, paths=paths) == 0
    stand_in.clear()
    changed = tmp_path / "handed" / "bob" / "01_lab.ipynb"
    deadline = scoring.parse_time(DEADLINE)
    changed.write_text(json.dumps(_submission("01", {"coalescing/vector_add": 1.0,
                                                     "coalescing/strided_copy": 1.0})))
    os.utime(changed, (deadline - DAY, deadline - DAY))  # and now on time
    # A cap instead of a penalty: scored again without running the unchanged notebooks.
    assert main(["grade", *map(str, paths), "--out", str(tmp_path / "out"), "--course",
                 str(ROOT), "--speed-on-cpu", "predicted", "--resume"]) == 0
    assert stand_in == [("bob", "01_coalescing")]
    results = {(r["learner"], r["lab"]): r for r in gradebook.load_results(tmp_path / "out")}
    assert results["bob", "01_coalescing"]["points"]["earned"] == 2
    assert results["alice", "01_coalescing"]["points"]["earned"] == 3.5
    assert results["alice", "01_coalescing"]["policy"]["deadlines"] == {}


def test_labs_picks_lab_numbers_or_the_labs_each_learner_began(tmp_path, stand_in):
    paths = _hand_in(tmp_path / "handed")
    untouched = tmp_path / "handed" / "alice" / "02_lab.ipynb"
    untouched.write_text(json.dumps(_submission("02", {})))  # as handed out
    assert _grade(tmp_path, "--labs", "00", paths=paths, out="by-number") == 0
    assert stand_in == [("carol", "00_roofline")]
    stand_in.clear()
    assert _grade(tmp_path, "--labs", "changed", paths=paths, out="begun") == 0
    assert sorted(stand_in) == sorted(EXPECTED)  # not alice's lab 02
    assert not started(json.loads(untouched.read_text()), json.loads(untouched.read_text()))
    assert started(LAB01, _submission("01", {"coalescing/vector_add": 1.0}))


@pytest.mark.parametrize("text", ["labs", "1,2", "01;02", ""])
def test_labs_refuses_anything_but_lab_numbers_or_changed(text, tmp_path, capsys):
    if text == "":
        assert grade.parse_labs(text) is None
        return
    assert main(["grade", str(tmp_path), "--out", str(tmp_path / "o"), "--course", str(ROOT),
                 "--labs", text]) == 2
    assert "--labs is lab numbers" in capsys.readouterr().err


def test_shards_merged_from_their_manifests_equal_one_run_and_a_missing_shard_fails(
        tmp_path, stand_in):
    paths = _hand_in(tmp_path / "handed")
    assert _grade(tmp_path, paths=paths, out="whole") == 0
    read = []
    for i in (1, 2, 3):
        stand_in.clear()
        assert _grade(tmp_path, "--shard", f"{i}/3", paths=paths, out=f"shard-{i}") == 0
        read.append({learner for learner, _ in stand_in})
        manifest = json.loads((tmp_path / f"shard-{i}" / "manifest.json").read_text())
        assert manifest["learners"] == sorted(read[-1])  # each shard reads only its own
    assert sorted(learner for share in read for learner in share) == sorted(CLASS)
    folders = [tmp_path / f"shard-{i}" for i in (1, 2, 3)]
    assert main(["grade", "--merge", *map(str, folders), "--out", str(tmp_path / "merged"),
                 "--roster", str(tmp_path / "roster.csv")]) == 0

    def comparable(folder: str) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("started", "finished", "seconds")}
                for r in gradebook.load_results(tmp_path / folder)]

    assert comparable("merged") == comparable("whole")
    for name in ("grades-canvas.csv", "grades-moodle.csv"):
        assert (tmp_path / "merged" / name).read_text().count("\n") == 2 + 4 - (name ==
                                                                                "grades-moodle.csv")
    with pytest.raises(ValueError, match="shard 2/3 missing"):
        gradebook.merge([folders[0], folders[2]], tmp_path / "partial")
    with pytest.raises(ValueError, match="there twice"):
        gradebook.merge([folders[0], folders[0], folders[2]], tmp_path / "partial")
    # A shard cut off before its end (it wrote its manifest as it started) is named.
    manifest = json.loads((folders[1] / "manifest.json").read_text())
    (folders[1] / "manifest.json").write_text(json.dumps({**manifest, "finished": False}))
    with pytest.raises(ValueError, match="shard 2/3 .* did not finish"):
        gradebook.merge(folders, tmp_path / "partial")


def test_a_shard_takes_its_learners_from_the_command_line_alone(tmp_path):
    paths = [tmp_path / "zoe.zip", tmp_path / "amy", tmp_path / "bo.ipynb", tmp_path / "amy.zip"]
    parts = [shards.share(paths, f"{i}/2") for i in (1, 2)]
    # The learners, sorted: amy (a folder and a zip, one learner), bo, zoe.
    assert set(parts[0]) == {tmp_path / "amy", tmp_path / "amy.zip", tmp_path / "zoe.zip"}
    assert parts[1] == [tmp_path / "bo.ipynb"]
    with pytest.raises(ValueError):
        shards.parse("3/2")


# --- scoring, piece by piece ----------------------------------------------------------------

def _pass(exercise: str = "coalescing/transpose", **performance) -> dict:
    return {"exercise": exercise, "verdict": "PASS", "performance": performance}


WORTH = points.Points(points=4, speed=2, levels=(0.2, 0.6))


@pytest.mark.parametrize("fraction,speed", [(0.1, 0), (0.2, 0), (0.4, 1), (0.6, 2), (0.9, 2)])
def test_speed_points_scale_between_the_two_levels_on_a_gpu(fraction, speed):
    earned = scoring.exercise_points(_pass(roofline_fraction=fraction), WORTH, True,
                                     scoring.Policy())
    assert earned["speed_basis"] == "measured"
    assert (earned["correctness"], earned["speed"]) == pytest.approx((2, speed))


def test_on_a_cpu_speed_is_the_instructors_choice():
    grade_ = _pass(predicted_traffic_fraction=0.4, predicted_roofline_fraction=0.001)
    none = scoring.exercise_points(grade_, WORTH, False, scoring.Policy())
    assert none["earned"] == 4 and "speed not graded" in none["why"]
    predicted = scoring.exercise_points(grade_, WORTH, False, scoring.Policy("predicted"))
    assert predicted["earned"] == 3 and predicted["speed_basis"] == "predicted"
    untimed = scoring.exercise_points(_pass(), WORTH, True, scoring.Policy())
    assert untimed["earned"] == 2 and "no roofline fraction" in untimed["why"]


def test_a_verdict_other_than_pass_earns_nothing_and_says_why():
    for verdict, why in (("FAIL", "not passed"), ("NEEDS A GPU", "needs a GPU")):
        earned = scoring.exercise_points({"exercise": "x/y", "verdict": verdict}, WORTH,
                                         False, scoring.Policy())
        assert earned["earned"] == 0 and why in earned["why"]


@pytest.mark.parametrize("late_s,per_day,cap,expected", [
    (-1, 0.1, None, 10), (1, 0.1, None, 9), (DAY + 1, 0.1, None, 8), (11 * DAY, 0.1, None, 0),
    (1, 0.0, 0.5, 5), (3 * DAY, 0.1, 0.5, 5), (3 * DAY, 0.3, 0.5, 1)])
def test_late_work_loses_a_share_a_day_started_and_earns_at_most_the_cap(late_s, per_day,
                                                                         cap, expected):
    deadline = scoring.parse_time(DEADLINE)
    result = {"lab": "01_coalescing", "submitted": deadline + late_s,
              "grades": [_pass("x/y") for _ in range(10)]}
    policy = scoring.Policy(deadlines={"01": deadline}, late_per_day=per_day, late_cap=cap)
    assert scoring.score(result, {}, policy)["points"]["earned"] == pytest.approx(expected)
    other = dict(result, lab="02_matmul", grades=[_pass("x/y")])  # no deadline for lab 02
    assert scoring.score(other, {}, policy)["points"]["late_days"] == 0


def test_a_manifest_of_submission_times_reads_both_layouts_and_names_a_bad_row(tmp_path):
    manifest = tmp_path / "times.csv"
    manifest.write_text("learner,lab,time\nalice,01,2026-12-01T10:00:00Z\n")
    assert scoring.read_submitted(manifest) == {("alice", "01"): scoring.parse_time(
        "2026-12-01T10:00:00+00:00")}
    manifest.write_text("bob,2026-12-02T10:00+01:00\nbob,yesterday\n")
    with pytest.raises(ValueError, match="row 2"):
        scoring.read_submitted(manifest)


@pytest.mark.parametrize("args,words", [
    (["--deadline", "next friday"], "--deadline is an ISO date"),
    (["--late-penalty", "10%"], "need a --deadline"),
    (["--deadline", DEADLINE, "--late-cap", "150%"], "between 0% and 100%"),
])
def test_bad_lateness_options_are_refused_before_grading(args, words, tmp_path, capsys):
    assert main(["grade", str(tmp_path), "--out", str(tmp_path / "o"), "--course", str(ROOT),
                 *args]) == 2
    assert words in capsys.readouterr().err


def test_require_pass_counts_needs_a_gpu_as_neither_pass_nor_failure(tmp_path, capsys):
    result = {"learner": "octocat", "lab": "02_matmul", "notebook": "", "seconds": 1.0,
              "problems": [], "changed": [],
              "grades": [{"exercise": "matmul/naive", "verdict": "PASS", "message": "",
                          "seconds": 0.1},
                         {"exercise": "matmul/cuda_coalesced", "verdict": "NEEDS A GPU",
                          "message": "compiled; runs on a GPU", "seconds": 0.1}]}
    gradebook.write_atomic(gradebook.result_path(tmp_path / "s", "octocat", "02_matmul"),
                           json.dumps(result))
    assert main(["grade", "--merge", str(tmp_path / "s"), "--out", str(tmp_path / "all"),
                 "--require-pass"]) == 0
    assert "needs a GPU (not counted here): octocat matmul/cuda_coalesced" in \
        capsys.readouterr().out


# --- the points a master gives ------------------------------------------------------------------

def test_every_masters_points_name_a_graded_exercise_of_its_lab():
    from rooflab.autograder import problems

    found = 0
    for master in masters(ROOT):
        table = points.parse(front_matter(master.read_text()), master.name)
        lab = json.loads((ROOT / "labs" / master.with_suffix(".ipynb").name).read_text())
        graded = {e.problem_id for e in exercises(lab)}
        assert points.of_lab(lab) == table  # the build carried it into the notebook
        for problem_id, worth in table.items():
            found += 1
            assert problem_id in graded, (master.name, problem_id)
            if worth.speed:  # speed points only where a time or a traffic can be had
                assert problems.get(problem_id).timed, problem_id
    assert found >= 5


@pytest.mark.parametrize("entry,words", [
    ({"x/y": {"points": 1, "speed": 2}}, "part of the points"),
    ({"x/y": {"points": -1}}, "≥ 0"),
    ({"x/y": {"points": 2, "speed": 1, "levels": [0.8, 0.3]}}, "LOW < HIGH"),
    ({"x/y": {"pionts": 2}}, "a number of points"),
])
def test_a_mistyped_grading_table_is_refused_naming_the_entry(entry, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        points.parse({"grading": entry}, "01_demo.md")


# --- what a hostile or careless class hands in ----------------------------------------------

def test_a_link_in_a_submission_is_not_graded_and_a_broken_zip_stops_no_one(tmp_path):
    from rooflab.autograder.grading.grade import find_tasks

    alice = tmp_path / "alice"
    alice.mkdir()
    (alice / "00_roofline.ipynb").symlink_to(ROOT / "solutions" / "00_roofline.ipynb")
    (alice / "work").symlink_to(ROOT / "solutions", target_is_directory=True)
    bob = tmp_path / "bob"
    bob.mkdir()
    (bob / "01_lab.ipynb").write_text(json.dumps(_submission("01", {})))
    (tmp_path / "carol.zip").write_bytes(b"not a zip")
    tasks, problems = find_tasks([alice, bob, tmp_path / "carol.zip"], ROOT / "labs",
                                 tmp_path / "unpacked")
    assert [(t.learner, t.lab_name) for t in tasks] == [("bob", "01_coalescing")]
    assert any("00_roofline.ipynb: a link" in line for line in problems)
    assert any("carol.zip: not graded, the zip cannot be read" in line for line in problems)


def test_resume_grades_again_a_result_from_another_kind_of_device(tmp_path, stand_in):
    paths = _hand_in(tmp_path / "handed")
    assert _grade(tmp_path, paths=paths) == 0
    path = gradebook.result_path(tmp_path / "out", "alice", "01_coalescing")
    path.write_text(json.dumps({**json.loads(path.read_text()), "measured": True}))
    stand_in.clear()
    assert _grade(tmp_path, "--resume", paths=paths) == 0
    assert stand_in == [("alice", "01_coalescing")]  # a GPU's result, resumed on a CPU


def test_needs_a_gpu_keeps_its_worth_and_is_named_pending():
    result = {"lab": "02_matmul", "grades": [_pass("x/y"), {"exercise": "matmul/cuda_coalesced",
                                                            "verdict": "NEEDS A GPU"}]}
    points_ = scoring.score(result, {}, scoring.Policy())["points"]
    assert (points_["earned"], points_["possible"]) == (1, 2)
    assert points_["pending"] == ["matmul/cuda_coalesced"]


def test_merge_refuses_a_stray_result_other_settings_an_old_gradebook_and_scoring_options(
        tmp_path, stand_in, capsys):
    paths = _hand_in(tmp_path / "handed")
    for i in (1, 2):
        assert _grade(tmp_path, "--shard", f"{i}/2", paths=paths, out=f"s{i}") == 0
    folders = [tmp_path / "s1", tmp_path / "s2"]
    stray = gradebook.result_path(tmp_path / "s1", "alice", "01_coalescing")
    copy_ = gradebook.result_path(tmp_path / "s2", "zed", "01_coalescing")
    copy_.write_text(stray.read_text())
    with pytest.raises(ValueError, match="not a learner of that shard"):
        gradebook.merge(folders, tmp_path / "m")
    copy_.unlink()
    gradebook.write_atomic(gradebook.result_path(tmp_path / "old", "zed", "01_x"), "{}")
    with pytest.raises(ValueError, match="already holds results"):
        gradebook.merge(folders, tmp_path / "old")
    assert _grade(tmp_path, "--shard", "2/2", "--labs", "01", paths=paths, out="s2") == 0
    with pytest.raises(ValueError, match="different settings"):
        gradebook.merge(folders, tmp_path / "m")
    assert main(["grade", "--merge", *map(str, folders), "--out", str(tmp_path / "m"),
                 "--deadline", DEADLINE]) == 2
    assert "give --deadline to each shard" in capsys.readouterr().err
    gradebook.write_atomic(gradebook.result_path(tmp_path / "bare", "amy", "01_x"),
                           json.dumps({"learner": "amy", "lab": "01_x", "notebook": "",
                                       "seconds": 0.0, "grades": []}))
    assert main(["grade", "--merge", str(tmp_path / "bare"), "--out", str(tmp_path / "m2")]) == 0
    assert "no shard manifest" in capsys.readouterr().err


def test_a_roster_header_may_name_the_platforms_columns_without_learner(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("Student,SIS Login ID,Section\nann,a123,s1\nben,b456,s1\n")
    names, details = gradebook.load_roster(roster)
    assert names == ["ann", "ben"] and details["ann"]["SIS Login ID"] == "a123"


def test_a_release_from_anywhere_but_the_course_is_refused(tmp_path, capsys):
    assert main(["release", str(tmp_path / "out"), "--root", str(tmp_path)]) == 2
    assert "is not the course's repository" in capsys.readouterr().err
