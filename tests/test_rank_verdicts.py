"""Problems on N ranks: the verdict is the grader's, never the candidate's process's.

``rooflab check`` and ``rooflab grade`` judge a candidate in a process that imported its
module first, where code at its top can replace the problem's ``grade`` or what that calls.
What each rank returned and recorded comes back to the grader's process, which judges it
again with its own copy of the problem: a candidate that patched the grader in its own
process and calls ``dist.all_reduce``, or returns wrong answers, fails; the course's own
solutions pass, through the same path.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch.distributed as dist
from mutants import KERNELS

from rooflab.autograder import check, get_problem
from rooflab.autograder.checking import answers, handin
from rooflab.autograder.checking.isolated import recheck
from rooflab.autograder.checking.rank_check import case_inputs
from rooflab.autograder.cli import EXIT_FAIL, EXIT_PASS, main
from rooflab.autograder.evidence.compare import CaseResult, Comparison
from rooflab.autograder.grading.cells import Exercise
from rooflab.autograder.grading.verdicts import grade_exercises
from rooflab.autograder.problems.collectives import REMAINDER
from rooflab.kernels.collectives import ring_allreduce

RING, ZERO3 = "collectives/ring_allreduce", "fsdp/zero3"
OUTSIDE = "checked again outside the candidate's process"
LIBRARY_CALL = "rank 0 calls dist.all_reduce: the exercise is to build the all-reduce"

# At import, the grade in the candidate's own process says every case passes; the ring
# itself is the library's.
GRADE_REPLACED = '''\
import torch.distributed as dist
from rooflab.autograder import get_problem
from rooflab.autograder.evidence.compare import CaseResult, Comparison

get_problem("collectives/ring_allreduce").grade = \\
    lambda case, *rest: CaseResult(case, Comparison(True))

def ring_allreduce(x, average=False):
    dist.all_reduce(x)
    return x / dist.get_world_size() if average else x
'''
# The comparison the grade calls, patched where it is looked up, with the checks of the
# order, the messages and their contents that would see through zeros: every answer is
# zeros.
COMPARE_PATCHED = '''\
import torch
from rooflab.autograder.evidence import compare as evidence
from rooflab.autograder.problems import collectives as problem

def always_right(out, want, **options):
    return evidence.Comparison(True)

evidence.compare = problem.compare = always_right
problem.ring_order = lambda xs, out: ""
problem.message_causes = lambda case, logs: []
problem.content_causes = lambda case, xs, logs, average: []

def ring_allreduce(x, average=False):
    return torch.zeros_like(x)
'''
# The course's FSDP with its gradients all-reduced, not reduce-scattered; the grade in its
# own process replaced at the end of the module (after its __future__ import).
ALL_REDUCED = ("        dist.reduce_scatter_tensor(mine, flat)\n",
               "        dist.all_reduce(flat)\n"
               "        mine.copy_(flat.chunk(self.world)[dist.get_rank()])\n")
FSDP_GRADE_REPLACED = '''
from rooflab.autograder import get_problem as _get_problem
from rooflab.autograder.evidence.compare import CaseResult as _CaseResult
from rooflab.autograder.evidence.compare import Comparison as _Comparison

_get_problem("fsdp/zero3").grade = lambda case, *rest: _CaseResult(case, _Comparison(True))
'''


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def rooflab_check(capsys, problem: str, function: str) -> tuple[int, str]:
    return run(capsys, "check", problem, function, "--time-limit", "60", "--seed", "11")


def fsdp_all_reduced_source() -> str:
    source = (KERNELS / "fsdp.py").read_text()
    old, new = ALL_REDUCED
    assert source.count(old) == 1, "the course's FSDP changed: update ALL_REDUCED"
    return source.replace(old, new) + FSDP_GRADE_REPLACED


# --- rooflab check: the child's grade patched, the parent's verdict ------------------------------

def test_a_ring_that_replaced_the_grade_and_calls_all_reduce_fails(capsys, tmp_path):
    candidate = tmp_path / "grade_replaced.py"
    candidate.write_text(GRADE_REPLACED)
    code, out = rooflab_check(capsys, RING, f"{candidate}:ring_allreduce")
    assert code == EXIT_FAIL, out
    assert out.startswith(f"FAIL {RING}: wrong on ranks=2 n=4096 fp32"), out
    assert LIBRARY_CALL in out and OUTSIDE in out, out


def test_a_ring_that_patched_the_comparison_and_returns_zeros_fails(capsys, tmp_path):
    candidate = tmp_path / "compare_patched.py"
    candidate.write_text(COMPARE_PATCHED)
    code, out = rooflab_check(capsys, RING, f"{candidate}:ring_allreduce")
    assert code == EXIT_FAIL, out
    assert "wrong on ranks=2 n=4096 fp32: rank 0's answer: relative error 1.00e+00" in out, out
    assert OUTSIDE in out, out


def test_an_fsdp_that_replaced_the_grade_and_all_reduces_gradients_fails(capsys, tmp_path):
    candidate = tmp_path / "all_reduced.py"
    candidate.write_text(fsdp_all_reduced_source())
    code, out = rooflab_check(capsys, ZERO3, f"{candidate}:shard_layers")
    assert code == EXIT_FAIL, out
    assert "rank 0, step 0: backward all-reduced the gradients" in out, out
    assert OUTSIDE in out, out


@pytest.mark.parametrize("problem", [RING, ZERO3])
def test_the_course_solution_passes_through_the_same_path(capsys, problem):
    code, out = rooflab_check(capsys, problem, get_problem(problem).solution)
    assert code == EXIT_PASS, out
    assert out.startswith(f"PASS {problem}"), out


# --- recheck: the grader's verdict on what the ranks returned and recorded --------------------

SEEDS, FIRST_SEED = 20, 1000


def library_all_reduce(x, average=False):
    dist.all_reduce(x)
    return x / dist.get_world_size() if average else x


def one_case(case):
    return dataclasses.replace(get_problem(RING), cpu_cases=[case], gpu_cases=[case])


@pytest.fixture(scope="module")
def kept_runs():
    """The course's ring and the library's all-reduce, each on 20 copies of the N = 3 case
    whose size N does not divide: copy k has its inputs from seed FIRST_SEED + k. One
    launch of the ranks each (20 launches each would take minutes); each copy is then
    judged again on its own, with its own seed."""
    case = next(c for c in get_problem(RING).cpu_cases if c.sizes["ranks"] == 3
                and c.note == REMAINDER)
    copies = dataclasses.replace(get_problem(RING), cpu_cases=[case] * SEEDS,
                                 gpu_cases=[case] * SEEDS)
    kept = {}
    for name, function in (("ring", ring_allreduce), ("library", library_all_reduce)):
        result = check(copies, function, seed=FIRST_SEED, show=False, raise_on_failure=False,
                       keep_outputs=True)
        assert len(result.outputs) == SEEDS, result.message()
        kept[name] = result.outputs
    return case, kept


def recheck_one(tmp_path, case, answer: object, seed: int) -> str:
    path = tmp_path / f"{seed}.pt"
    answers.save({0: answer}, path)
    return recheck(one_case(case), path, seed)


def test_the_grader_s_verdict_is_the_same_for_20_seeds(tmp_path, kept_runs):
    case, kept = kept_runs
    for copy in range(SEEDS):
        seed = FIRST_SEED + copy
        assert recheck_one(tmp_path, case, kept["ring"][copy], seed) == "", seed
        wrong = recheck_one(tmp_path, case, kept["library"][copy], seed)
        assert wrong.startswith(f"wrong on {case.label}: ") and LIBRARY_CALL in wrong, \
            (seed, wrong)
    # The inputs are the grader's, made from the seed: another seed's answers are wrong.
    assert "rank 0's answer" in recheck_one(tmp_path, case, kept["ring"][0], FIRST_SEED + 1)


def test_answers_without_their_logs_never_pass(tmp_path):
    # Right sums, the same on every rank; the grader's inputs, from the seed.
    case = next(c for c in get_problem(RING).cpu_cases if c.sizes["ranks"] == 3)
    [inputs] = case_inputs(one_case(case), FIRST_SEED)[1]
    summed = inputs[0][0] + inputs[1][0] + inputs[2][0]
    outputs = [summed.clone() for _ in inputs]
    for broken in ({"outputs": outputs}, tuple(outputs), {"outputs": outputs, "logs": ["", ""]},
                   {"outputs": outputs, "logs": [1, 2, 3]}):
        assert recheck_one(tmp_path, case, broken, FIRST_SEED) == \
            f"no answer for {case.label} reached the grader"
    # A log is the lines its rank wrote: given empty ones, the grader sees silent ranks.
    silent = recheck_one(tmp_path, case, {"outputs": outputs, "logs": ["", "", ""]},
                         FIRST_SEED)
    assert "rank 0 sent and received nothing through torch.distributed" in silent, silent


# --- rooflab grade: a notebook's check, with the grade patched in its kernel --------------------

def test_rooflab_grade_fails_a_notebook_whose_patched_grade_passed_all_reduce(
        tmp_path, monkeypatch):
    seed = 7
    with monkeypatch.context() as notebook:  # the learner's kernel, its grader patched
        notebook.setenv(handin.INTO_ENV, str(tmp_path))
        notebook.setenv(handin.SEED_ENV, str(seed))
        notebook.setattr(get_problem(RING), "grade",
                         lambda case, *rest: CaseResult(case, Comparison(True)))
        notebook.setattr(handin, "_count", 0)
        notebook.setattr(handin, "_cell", "ring-check")
        assert check(RING, library_all_reduce, show=False, raise_on_failure=False).passed
    record = json.loads((tmp_path / "001.json").read_text())
    assert record["verdict"] == "PASS"
    [grade] = grade_exercises([Exercise(record["cell"], RING)],
                              {"cells": [{"id": record["cell"], "index": 0, "error": ""}]},
                              [(record, tmp_path / "001-outputs.pt")], seed)
    assert grade.verdict == "FAIL"
    assert LIBRARY_CALL in grade.message, grade.message
    assert "checked again outside the notebook's process" in grade.message
