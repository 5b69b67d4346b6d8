"""`rooflab release`: the course as a learner receives it, with no answer anywhere in it."""

import ast
from pathlib import Path

import pytest

from rooflab.autograder.cli import EXIT_PASS, EXIT_USAGE, main
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
    from rooflab.autograder import hints

    as_released = hints.definition_source
    monkeypatch.setattr(hints, "definition_source",
                        lambda module, names: without_answers(as_released(module, names)))
    assert "the answer is not in this copy of the course" in hints.text("softmax/online", 3)
    assert "Hint 1/3" in hints.text("softmax/online", 1)


def test_the_command_writes_a_release_and_refuses_a_folder_in_use(tmp_path, capsys):
    assert main(["release", str(tmp_path / "out"), "--root", str(ROOT)]) == EXIT_PASS
    assert "kernels/ with every answer replaced by its stub" in capsys.readouterr().out
    assert main(["release", str(tmp_path / "out"), "--root", str(ROOT)]) == EXIT_USAGE
