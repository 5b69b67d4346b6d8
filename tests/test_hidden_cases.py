"""Hidden cases: sizes drawn from the grader's secret seed, run only when a notebook is
graded. The learner's own check runs the public cases; ``rooflab grade`` runs both, and
checks both again in its own process."""

from __future__ import annotations

import dataclasses
import importlib
import json
import random

import broken_kernels as bk
import pytest
import torch

from rooflab.autograder import Case, check, get_problem
from rooflab.autograder.checking import answers, handin
from rooflab.autograder.checking.isolated import recheck
from rooflab.autograder.checking.result import html
from rooflab.autograder.grading.cells import Exercise
from rooflab.autograder.grading.verdicts import grade_exercises
from rooflab.autograder.problem import (
    Draw,
    Hidden,
    Span,
    graded_cases,
    hidden_cases,
    registered,
)

ON_GPU = torch.cuda.is_available()
SEED = 20240611
WITH_HIDDEN = ["coalescing/vector_add", "softmax/fused", "matmul/naive", "matmul/tiled",
               "topk/rows"]


def solution(problem_id: str):
    module, function = get_problem(problem_id).solution.split(":")
    return getattr(importlib.import_module(module), function)


def run_check(problem, candidate):
    """Correctness only: speed is graded elsewhere, and the same on every case list."""
    return check(problem, candidate, show=False, raise_on_failure=False, measure=False)


@pytest.fixture
def grading(tmp_path, monkeypatch):
    """Inside a notebook ``rooflab grade`` runs: its folder and seed in the environment."""
    def graded(problem, candidate):
        with monkeypatch.context() as notebook:
            notebook.setenv(handin.INTO_ENV, str(tmp_path))
            notebook.setenv(handin.SEED_ENV, str(SEED))
            notebook.setattr(handin, "_count", 0)
            notebook.setattr(handin, "_cell", "hidden-check")
            result = run_check(problem, candidate)
        record = json.loads((tmp_path / "001.json").read_text())
        return result, record, tmp_path / "001-outputs.pt"
    return graded


def hidden_labels(result) -> list[str]:
    return [c.case.label for c in result.cases if c.case.hidden and not c.again]


# --- the draw ---------------------------------------------------------------------------

@pytest.mark.parametrize("problem_id", WITH_HIDDEN)
def test_hidden_sizes_come_from_the_seed_alone_and_keep_their_rules(problem_id):
    problem = get_problem(problem_id)
    draw = problem.hidden.draw(ON_GPU)
    torch_rng = torch.random.get_rng_state()
    drawn = {seed: hidden_cases(problem, seed, ON_GPU) for seed in range(20)}
    assert torch.equal(torch.random.get_rng_state(), torch_rng)  # its own generator
    for seed, cases in drawn.items():
        assert cases == hidden_cases(problem, seed, ON_GPU)  # the grader's draw is the same
        assert len(cases) == draw.count
        for case in cases:
            assert case.hidden and case.label.startswith("hidden case ")
            assert (case.dtype, case.scale) == (draw.dtype, draw.scale)
            assert all(span.allows(case.sizes[name]) for name, span in draw.sizes.items())
    assert len({str(cases) for cases in drawn.values()}) >= 15  # seeds draw other sizes


def test_a_span_draws_every_size_its_rule_allows_and_no_other():
    span = Span(10, 100, multiple_of=3, odd=True)
    rng = random.Random(0)
    drawn = {span.draw(rng) for _ in range(2000)}
    assert drawn == {n for n in range(10, 101) if n % 3 == 0 and n % 2}
    for empty in (lambda: Span(4, 4, odd=True), lambda: Span(1, 9, multiple_of=2, odd=True),
                  lambda: Span(13, 15, multiple_of=4)):
        with pytest.raises(ValueError):
            empty()


def test_graded_cases_are_the_public_ones_then_the_hidden_ones():
    problem = get_problem("coalescing/vector_add")
    public = list(problem.cases(ON_GPU))
    assert graded_cases(problem, ON_GPU, SEED, grading=False) == public
    assert graded_cases(problem, ON_GPU, SEED, grading=True) == \
        public + hidden_cases(problem, SEED, ON_GPU)


def test_a_problem_on_ranks_refuses_hidden_cases():
    on_ranks = next(p for p in registered().values() if p.kernel == "ranks")
    hidden = Hidden(cpu=Draw({"n": Span(3, 9)}))
    with pytest.raises(ValueError, match="ranks cannot have hidden cases"):
        dataclasses.replace(on_ranks, hidden=hidden)


# --- the check, the learner's and the grader's ----------------------------------------------

def test_the_learner_runs_the_public_cases_and_the_grader_the_hidden_ones_too(grading):
    problem = get_problem("coalescing/vector_add")
    add = solution(problem.id)
    learner = run_check(problem.id, add)
    assert learner.passed, learner.message()
    assert not hidden_labels(learner) and "hidden case n=" not in learner.message()
    count = problem.hidden.draw(ON_GPU).count
    # The card says how many more grading runs, in a row of its table of cases.
    assert f"skip {count} hidden cases: sizes drawn from the grader's seed" in learner.message()
    assert f"<td>{count} hidden cases</td>" in html(learner)

    graded, record, outputs = grading(problem.id, add)
    assert graded.passed, graded.message()
    assert hidden_labels(graded) == [c.label for c in hidden_cases(problem, SEED, ON_GPU)]
    assert not any("hidden" in reason for reason in graded.skipped)
    assert record["seed"] == SEED and record["verdict"] == "PASS"
    assert recheck(problem, outputs, SEED) == ""


def test_the_course_solutions_pass_their_hidden_cases(grading):
    for problem_id in WITH_HIDDEN[1:]:  # vector_add: the test above
        problem = get_problem(problem_id)
        # The public cases are the solution tests' own; run the hidden ones alone (the
        # same ones: they are drawn from the problem's id and the seed).
        alone = dataclasses.replace(problem, **{"gpu_cases" if ON_GPU else "cpu_cases": []})
        result, _, outputs = grading(alone, solution(problem_id))
        assert result.passed, result.message()
        assert hidden_labels(result) == [c.label for c in hidden_cases(problem, SEED, ON_GPU)]
        assert recheck(alone, outputs, SEED) == ""


def test_a_kernel_fitted_to_the_public_sizes_fails_only_when_graded(grading, tmp_path):
    # Public lengths are whole blocks of 128; a kernel that launches n // 128 programs is
    # right on all of them, and never writes an odd length's tail.
    problem = dataclasses.replace(
        get_problem("coalescing/vector_add"), id="tests/whole_blocks",
        cpu_cases=[Case({"n": 1024}), Case({"n": 2048}, torch.float16)],
        gpu_cases=[Case({"n": 1 << 20}), Case({"n": 1 << 22}, torch.float16)])
    assert run_check(problem, bk.skips_tail).passed

    graded, record, outputs = grading(problem, bk.skips_tail)
    assert record["verdict"] == "FAIL"
    assert graded.causes[0].startswith("wrong on hidden case n="), graded.causes
    assert "never written" in graded.causes[0]
    # The grader, from the seed, rechecks the same list: the public answers are right,
    # the hidden ones are not.
    assert recheck(problem, outputs, SEED, graded=False) == ""
    assert recheck(problem, outputs, SEED).startswith("wrong on hidden case n=")


def test_the_grader_fails_a_tampered_or_missing_hidden_answer(grading, tmp_path):
    problem = get_problem("coalescing/vector_add")
    _, record, outputs = grading(problem.id, solution(problem.id))
    hidden = len(problem.cases(ON_GPU))  # the first hidden case's index
    kept = answers.load(outputs)
    kept[hidden] = kept[hidden].clone()
    kept[hidden][-1] += 1.0
    answers.save(kept, tmp_path / "tampered.pt")
    [grade] = grade_exercises([Exercise(record["cell"], problem.id)],
                              {"cells": [{"id": record["cell"], "index": 0, "error": ""}]},
                              [(record, tmp_path / "tampered.pt")], SEED)
    assert grade.verdict == "FAIL" and "wrong on hidden case n=" in grade.message, grade.message
    # A notebook that ran the public cases alone has no answers for the hidden ones.
    del kept[hidden]
    answers.save(kept, tmp_path / "public_only.pt")
    assert recheck(problem, tmp_path / "public_only.pt", SEED) == \
        f"no answer for {hidden_cases(problem, SEED, ON_GPU)[0].label} reached the grader"


def test_only_a_hidden_case_s_label_says_hidden():
    # "wrong on hidden=4096 ..." read as a case kept from the learner (tp/plan's size h).
    visible = [case.label for spec in registered().values() for world in (False, True)
               for case in spec.cases(world)]
    assert len(visible) > 100
    assert [label for label in visible if "hidden" in label] == []
    drawn = hidden_cases(get_problem("softmax/fused"), SEED, on_gpu=False)
    assert drawn and all(case.label.startswith("hidden case ") for case in drawn)
