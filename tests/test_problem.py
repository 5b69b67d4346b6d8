"""Problem specs: the registry, labels, levels, and which tolerance applies where."""

import pytest
import torch

from rooflab.autograder import Case, Levels, all_problems, get_problem, register
from rooflab.autograder.device import roofline
from rooflab.autograder.problem import Problem


def test_builtin_problems_are_registered_with_cases_for_both_worlds():
    ids = {p.id for p in all_problems()}
    assert {"coalescing/vector_add", "coalescing/transpose", "matmul/tiled"} <= ids
    for problem in all_problems():
        if problem.id.startswith("test/"):
            continue
        assert problem.cpu_cases and problem.gpu_cases, problem.id
        if not problem.timed:
            continue
        # GPU cases keep an H100 busy for a measurable time; CPU cases stay small enough
        # for the interpreter.
        h100 = roofline.from_datasheet("H100 SXM")
        gpu_floor = max(roofline.time_floor(problem.cost(c), h100).seconds
                        for c in problem.gpu_cases)
        assert gpu_floor > 50e-6, problem.id
        assert max(problem.cost(c).bytes for c in problem.cpu_cases) < 1e7, problem.id


def test_cases_include_sizes_that_are_not_powers_of_two():
    for problem_id in ("coalescing/vector_add", "coalescing/transpose", "matmul/tiled"):
        problem = get_problem(problem_id)
        sizes = [v for case in problem.cpu_cases for v in case.sizes.values()]
        assert any(v & (v - 1) for v in sizes), problem_id


def test_id_must_name_lab_and_exercise():
    with pytest.raises(ValueError, match="<lab>/<exercise>"):
        register(Problem(id="vector_add", title="", signature="", make_inputs=None,
                         reference=None, cost=None, cpu_cases=[], gpu_cases=[]))


def test_case_label_names_sizes_dtype_scale_and_note():
    case = Case({"m": 3, "n": 5}, torch.float16, scale=1e4, note="ragged")
    assert case.label == "m=3 n=5 fp16 scale=10000 (ragged)"


@pytest.mark.parametrize("fraction, level", [
    (0.95, "excellent"), (0.75, "good"), (0.35, "pass"), (0.1, "below target"),
])
def test_levels(fraction, level):
    assert Levels(passing=0.3, good=0.6, excellent=0.9).grade(fraction) == level


def test_fp32_matmul_is_graded_as_tf32_on_gpu_only():
    matmul = get_problem("matmul/tiled")
    assert matmul.tolerance(torch.float32, on_gpu=True) == matmul.tolerances["tf32"]
    assert matmul.tolerance(torch.float32, on_gpu=False) == matmul.tolerances["fp32"]
    add = get_problem("coalescing/vector_add")
    assert add.tolerance(torch.float32, on_gpu=True) == add.tolerances["fp32"]
