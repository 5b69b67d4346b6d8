"""The CI template a course copies (ci/templates/): its workflow runs grade.sh, and
grade.sh, run here as a job would run it on a release, passes a solved notebook and fails
an unsolved one, writing the gradebook either way."""

import json
import os
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


def _job(course: Path, notebook: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    if why_unavailable():  # grading runs each notebook in bubblewrap
        pytest.skip(f"no sandbox here: {why_unavailable()}")
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "00_roofline.ipynb").write_text(notebook.read_text())
    env = dict(os.environ, SKIP_INSTALL="1", COURSE=str(course), SUBMISSION=str(submission),
               LEARNER="octocat", OUT=str(tmp_path / "gradebook"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    job = subprocess.run(["bash", str(course / "ci" / "templates" / "grade.sh")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    book = tmp_path / "gradebook" / "gradebook.json"
    return job, json.loads(book.read_text()) if book.exists() else {}


def test_a_solved_notebook_passes_the_job(course, tmp_path):
    job, book = _job(course, ROOT / "solutions" / "00_roofline.ipynb", tmp_path)
    assert job.returncode == 0, job.stdout + job.stderr
    [result] = book["results"]
    assert result["learner"] == "octocat"
    assert result["confined"] is True  # graded in the sandbox
    assert all(g["verdict"] == "PASS" for g in result["grades"])
    assert (tmp_path / "gradebook" / "gradebook.html").exists()


def test_an_unsolved_notebook_fails_the_job_and_still_writes_the_gradebook(course, tmp_path):
    job, book = _job(course, ROOT / "labs" / "00_roofline.ipynb", tmp_path)
    assert job.returncode == 1
    assert "not passed: octocat roofline/cost_vector_add: NOT IMPLEMENTED" in job.stdout
    assert (tmp_path / "gradebook" / "junit.xml").exists()
    assert book["results"][0]["learner"] == "octocat"


def test_the_workflow_runs_grade_sh_and_uploads_the_gradebook():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((TEMPLATES / "grade.yml").read_text())
    for name, job in workflow["jobs"].items():
        runs = [step["run"] for step in job["steps"] if "run" in step]
        assert runs == ["bash course/ci/templates/grade.sh"], name
        uploads = [step for step in job["steps"] if "upload-artifact" in step.get("uses", "")]
        assert uploads and uploads[0]["with"]["path"] == "gradebook/"
        assert uploads[0]["if"] == "always()"  # the gradebook of a failing job too
        paths = [step["with"]["path"] for step in job["steps"]
                 if "checkout" in step.get("uses", "")]
        assert paths == ["submission", "course"]
