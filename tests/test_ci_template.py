"""The CI template a course copies (ci/templates/): its workflow runs grade.sh, and
grade.sh, run here as a job would run it on a release, passes a solved notebook and fails
an unsolved one, writing the gradebook either way."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rooflab.autograder.confine import why_unavailable
from rooflab.autograder.grading.release import release

pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "ci" / "templates"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    out = tmp_path_factory.mktemp("ci") / "course"
    release(ROOT, out)
    return out


def _job(course: Path, notebooks: dict[str, Path], tmp_path: Path, labs: str
         ) -> tuple[subprocess.CompletedProcess, dict]:
    if why_unavailable():  # grading runs each notebook in bubblewrap
        pytest.skip(f"no sandbox here: {why_unavailable()}")
    submission = tmp_path / "submission"
    submission.mkdir()
    for name, notebook in notebooks.items():
        (submission / name).write_text(notebook.read_text())
    env = dict(os.environ, SKIP_INSTALL="1", COURSE=str(course), SUBMISSION=str(submission),
               LEARNER="octocat", OUT=str(tmp_path / "gradebook"), LABS=labs,
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    job = subprocess.run(["bash", str(course / "ci" / "templates" / "grade.sh")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    book = tmp_path / "gradebook" / "gradebook.json"
    return job, json.loads(book.read_text()) if book.exists() else {}


def test_a_learner_who_solved_labs_00_and_01_passes_the_job_the_rest_untouched(course, tmp_path):
    # Their repository holds every lab, as the release handed it out; 00 and 01 solved.
    notebooks = {path.name: path for path in sorted((course / "labs").glob("*.ipynb"))}
    for name in ("00_roofline.ipynb", "01_coalescing.ipynb"):
        notebooks[name] = ROOT / "solutions" / name
    job, book = _job(course, notebooks, tmp_path, labs="00,01")
    assert job.returncode == 0, job.stdout + job.stderr
    assert sorted(r["lab"] for r in book["results"]) == ["00_roofline", "01_coalescing"]
    for result in book["results"]:
        assert result["learner"] == "octocat"
        assert result["confined"] is True  # graded in the sandbox
        assert all(g["verdict"] == "PASS" for g in result["grades"])
        assert result["points"]["earned"] == result["points"]["possible"] > 0
    for name in ("gradebook.html", "grades-canvas.csv", "feedback/octocat/index.html",
                 "feedback/octocat/01_coalescing.ipynb"):
        assert (tmp_path / "gradebook" / name).exists(), name


def test_an_unsolved_notebook_fails_the_job_and_still_writes_the_gradebook(course, tmp_path):
    job, book = _job(course, {"00_roofline.ipynb": ROOT / "labs" / "00_roofline.ipynb"},
                     tmp_path, labs="00")
    assert job.returncode == 1
    assert "not passed: octocat roofline/cost_vector_add: NOT IMPLEMENTED" in job.stdout
    assert (tmp_path / "gradebook" / "junit.xml").exists()
    assert book["results"][0]["learner"] == "octocat"


def test_the_workflow_runs_grade_sh_in_its_own_environment_and_uploads_the_gradebook():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((TEMPLATES / "grade.yml").read_text())
    for name, job in workflow["jobs"].items():
        steps = job["steps"]
        runs = [step["run"] for step in steps if "run" in step]
        assert runs[-1] == "bash course/ci/templates/grade.sh", name
        grading = next(step for step in steps if step.get("run") == runs[-1])
        assert grading["env"]["LABS"] == "changed"  # the labs begun, not all ten
        # The job's limit is above the notebook's, so rooflab ends a slow notebook first.
        limit = re.search(r"--notebook-timeout (\d+)", grading["env"]["GRADE_ARGS"])
        assert limit and int(limit.group(1)) < job["timeout-minutes"] * 60, name
        uploads = [step for step in steps if "upload-artifact" in step.get("uses", "")]
        assert uploads and uploads[0]["with"]["path"] == "gradebook/"
        assert uploads[0]["if"] == "always()"  # the gradebook of a failing job too
        paths = [step["with"]["path"] for step in steps if "checkout" in step.get("uses", "")]
        assert paths == ["submission", "course"]
    cpu, gpu = workflow["jobs"]["cpu"], workflow["jobs"]["gpu"]
    cache = next(step for step in cpu["steps"] if "actions/cache" in step.get("uses", ""))
    assert cache["with"]["path"] == ".venv-grade"  # grade.sh's VENV
    assert "constraints.txt" in cache["with"]["key"]
    # The GPU job runs learners' code in a container of its own, not on the runner.
    assert gpu["container"]["image"] and "--gpus all" in gpu["container"]["options"]


def test_the_pinned_versions_are_ones_the_course_supports():
    pins = dict(line.split("==") for line in (TEMPLATES / "constraints.txt").read_text()
                .splitlines() if line and not line.startswith("#"))
    torch_version = tuple(int(x) for x in pins["torch"].split(".")[:2])
    triton_version = tuple(int(x) for x in pins["triton"].split(".")[:2])
    assert torch_version >= (2, 4) and (3, 6) <= triton_version <= (3, 9)
