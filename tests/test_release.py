"""`rooflab release`: the course as a learner receives it, with no answer anywhere in it."""

import ast
import re
from pathlib import Path

import pytest

from rooflab.autograder.cli import EXIT_PASS, EXIT_USAGE, main
from rooflab.autograder.course.solutions import course_solution
from rooflab.autograder.grading.release import release, solution_lines, without_answers

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release") / "course"
    release(ROOT, out)
    return out


def test_a_release_holds_no_line_that_only_the_answers_have(released):
    answers = solution_lines(ROOT)
    assert len(answers) > 100  # the course's answers, to look for
    found = [(path.relative_to(released), line.strip())
             for path in released.rglob("*") if path.is_file() and path.suffix != ".png"
             for line in path.read_text(errors="ignore").splitlines()
             if line.strip() in answers]
    assert not found, found[:5]


def test_the_grep_finds_an_answer_planted_in_a_release(released, tmp_path):
    planted = tmp_path / "planted.py"
    line = next(iter(solution_lines(ROOT)))
    planted.write_text(f"x = 1\n{line}\n")
    assert line in {text.strip() for text in planted.read_text().splitlines()}


def test_a_release_is_the_learners_course(released):
    assert (released / "labs").is_dir() and not (released / "solutions").exists()
    assert not list(released.glob("book/*.md"))  # the masters hold the answers
    assert sorted(p.name for p in (released / "tests").glob("*.py")) == ["conftest.py",
                                                                          "test_labs.py"]
    for name in ("Makefile", "pyproject.toml", "README.md"):
        assert (released / name).is_file()
    for module in (released / "kernels").glob("*.py"):
        source = module.read_text()
        ast.parse(source)  # still Python
        assert "BEGIN SOLUTION" not in source
    assert "raise NotImplementedError()" in (released / "kernels" / "softmax.py").read_text()
    assert "// YOUR CODE HERE" in (released / "kernels" / "matmul_cuda.py").read_text()


def test_stubs_keep_what_a_learner_may_import():
    source = (ROOT / "kernels" / "matmul.py").read_text()
    stubbed = without_answers(source)
    assert "def matmul_autotuned(" in stubbed and "def _launch_arguments(" in stubbed
    assert stubbed.count("# YOUR CODE HERE") == source.count("### BEGIN SOLUTION")


def test_the_last_hint_says_the_answer_is_not_in_a_release(monkeypatch):
    from rooflab.autograder.checking import hints

    as_released = hints.definition_source
    monkeypatch.setattr(hints, "definition_source",
                        lambda module, names: without_answers(as_released(module, names)))
    assert "the answer is not in this copy of the course" in hints.text("softmax/online", 3)
    assert "Hint 1/3" in hints.text("softmax/online", 1)


def test_the_command_writes_a_release_and_refuses_a_folder_in_use(tmp_path, capsys):
    assert main(["release", str(tmp_path / "out"), "--root", str(ROOT)]) == EXIT_PASS
    assert "kernels/ with every answer replaced by its stub" in capsys.readouterr().out
    assert main(["release", str(tmp_path / "out"), "--root", str(ROOT)]) == EXIT_USAGE


def _course_solutions_the_labs_ask_for() -> set[tuple[str, str]]:
    """Every (module, name) a lab master passes to course_solution."""
    call = re.compile(r'course_solution\("(\w+)", "(\w+)"\)')
    return {found for master in sorted(ROOT.glob("book/0[1-6]_*.md"))
            for found in call.findall(master.read_text())}


def test_the_course_solution_is_there_in_the_course_and_none_in_a_release(tmp_path,
                                                                        monkeypatch):
    """The labs' charts fall back on the course's kernels until the learner's pass; in a
    release those are stubs, and course_solution says so without running them."""
    stubbed = tmp_path / "released_kernels"
    stubbed.mkdir()
    for module in (ROOT / "kernels").glob("*.py"):
        (stubbed / module.name).write_text(without_answers(module.read_text()))
    monkeypatch.syspath_prepend(str(tmp_path))
    asked = _course_solutions_the_labs_ask_for()
    assert len(asked) >= 15, asked  # the chooser cells of labs 01-06
    for module, name in sorted(asked):
        full = course_solution(module, name)
        assert callable(full) and full.__module__ == f"rooflab.kernels.{module}", name
        assert course_solution(f"released_kernels.{module}", name) is None, name
    # What holds no answer, and uses none, is the same in both.
    assert course_solution("released_kernels.transpose", "transpose_rows") is not None
    assert course_solution("released_kernels.softmax", "softmax_unstable") is not None


def test_a_stub_counts_wherever_the_definition_reaches_it(tmp_path, monkeypatch):
    package = tmp_path / "toy_kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text(
        "def scale():\n    # YOUR CODE HERE\n    raise NotImplementedError()\n\n\n"
        "def shift():\n    return 1\n")
    (package / "ops.py").write_text(
        "from .helpers import scale, shift\n\n\ndef _inner():\n    return scale()\n\n\n"
        "def outer():\n    return _inner()\n\n\ndef plain():\n    return shift()\n\n\n"
        'SOURCE = """\n// YOUR CODE HERE\n"""\n\n\ndef compiled():\n    return SOURCE\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("outer", "compiled"):  # through the module, another module, CUDA C source
        assert course_solution("toy_kernels.ops", name) is None
    assert course_solution("toy_kernels.ops", "plain")() == 1


@pytest.mark.slow
def test_a_released_lab_runs_on_the_releases_own_kernels_and_fails_only_at_checks(
        released, tmp_path, monkeypatch):
    """Lab 01, run on the release's kernels/ (stubs) and autograder, not the repository's:
    its charts wait for the learner's kernels instead of failing."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    package = tmp_path / "path" / "rooflab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for part in ("autograder", "kernels"):
        (package / part).symlink_to(released / part, target_is_directory=True)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "path"))  # the notebook's kernel's too
    lab = released / "labs" / "01_coalescing.ipynb"
    notebook = nbformat.read(lab, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(
        "import rooflab.kernels.transpose\nprint(rooflab.kernels.transpose.__file__)"))
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(lab.parent)}}).execute()
    where = notebook.cells[-1].outputs[0].text.strip()
    assert where == str(package / "kernels" / "transpose.py"), where
    checks, unexpected, waiting = 0, [], 0
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        errors = [out for out in cell.outputs if out.output_type == "error"]
        text = "".join(out.get("text", "") for out in cell.outputs)
        is_check = "check" in cell.metadata.get("tags", [])
        from_scratch = is_check and "scratch=True" in cell.source
        checks += is_check and not from_scratch
        waiting += "to see" in text and text.lstrip().startswith("Solve exercise")
        if from_scratch and errors:  # unwritten, it says so and stops nothing
            unexpected.append(f"cell {index}: an unwritten from-scratch check stopped the run")
        elif from_scratch:
            continue
        elif is_check and (not errors or errors[0].ename != "CheckFailed"):
            unexpected.append(f"cell {index}: check {errors[0].ename if errors else 'passed'}")
        elif not is_check and errors:
            unexpected.append(f"cell {index}: {errors[0].ename}: {errors[0].evalue[:200]}")
    assert checks == 3 and not unexpected, "\n".join(unexpected)
    assert waiting >= 2  # the charts of the strided copy and of the transpose say so


@pytest.mark.slow
def test_a_release_ships_no_answer_every_problem_fails_what_its_kernels_hold(
        released, tmp_path):
    """Every problem's named solution is a stub in the release, and no other callable of
    its module that takes the same arguments passes it (PyTorch's tensor-parallel plan,
    shown in lab 10, once passed tp/block and tp/sequence)."""
    import json
    import os
    import subprocess
    import sys

    package = tmp_path / "path" / "rooflab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for part in ("autograder", "kernels"):
        (package / part).symlink_to(released / part, target_is_directory=True)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "release_answers.py")],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path / "path")))
    assert done.returncode == 0, done.stderr[-3000:]
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    # The course's problems, from a fresh process: tests register problems of their own.
    course = subprocess.run(
        [sys.executable, "-c", "from rooflab.autograder import all_problems\n"
         "print('\\n'.join(spec.id for spec in all_problems()))"],
        capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert len(course) >= 40, course
    assert {row["problem"] for row in found} == set(course)
    assert [row["problem"] for row in found if not row["stubbed"]] == []
    tried = {(row["problem"], other): verdict for row in found
             for other, verdict in row["others"].items()}
    assert ("softmax/fused", "softmax_naive") in tried and len(tried) >= 10, tried  # it looked
    assert [pair for pair, verdict in tried.items() if verdict == "PASS"] == [], tried


CALLS_THE_COURSE = """
import torch
from rooflab.autograder import check
from rooflab.kernels import collectives, softmax

def mine(x):  # a learner's answer that hands the work to the course's kernel
    return softmax.softmax_fused(x)

def my_ring(x, average=False):
    return collectives.ring_allreduce(x, average)

def my_stub(x):
    raise NotImplementedError()

for problem, fn in (("softmax/fused", mine), ("collectives/ring_allreduce", my_ring),
                    ("softmax/fused", my_stub)):
    result = check(problem, fn, show=False, raise_on_failure=False, measure=False)
    print(result.verdict, "|", result.line)
"""


def test_code_that_calls_the_course_s_stubs_is_told_so_not_that_it_is_unwritten(
        released, tmp_path):
    import os
    import subprocess
    import sys

    package = tmp_path / "path" / "rooflab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for part in ("autograder", "kernels"):
        (package / part).symlink_to(released / part, target_is_directory=True)
    script = tmp_path / "learner.py"  # a real file: its own stub is the learner's
    script.write_text(CALLS_THE_COURSE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path / "path")))
    assert done.returncode == 0, done.stderr[-3000:]
    fused, ring, stub = done.stdout.splitlines()[-3:]
    for line, name in ((fused, "rooflab.kernels.softmax.softmax_fused"),
                       (ring, "rooflab.kernels.collectives.ring_allreduce")):
        assert line.startswith("FAIL |"), line
        assert f"your code called {name}" in line and "ships as a stub" in line, line
    assert stub.startswith("NOT IMPLEMENTED |") and "not implemented yet" in stub, stub
