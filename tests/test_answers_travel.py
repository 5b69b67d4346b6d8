"""Every answer the check accepts in the candidate's process reaches the grader's process
with its value: numpy's numbers, fractions, named tuples (``torch.topk``'s own answer)."""

import fractions

import numpy as np
import pytest
import torch

from rooflab.autograder import problems
from rooflab.autograder.checking import answers, isolated
from rooflab.autograder.checking.time_limit import default_s


def _round_trip(answer, tmp_path):
    answers.save({0: answer}, tmp_path / "outputs.pt")
    return answers.load(tmp_path / "outputs.pt")[0]


@pytest.mark.parametrize("answer, expected", [
    (np.float64(2.5e-6), 2.5e-6),
    (np.float32(0.1), float(np.float32(0.1))),
    (np.int64(42_000_000_000), 42_000_000_000),
    (np.bool_(True), True),
    (fractions.Fraction(84_000_000_000, 2), 42_000_000_000),
    (fractions.Fraction(1, 3), 1 / 3),
    (np.str_("memory"), "memory"),
    ((np.float64(1.5), np.str_("compute")), (1.5, "compute")),
])
def test_numbers_of_any_kind_arrive_as_their_values(answer, expected, tmp_path):
    arrived = _round_trip(answer, tmp_path)
    assert arrived == expected
    assert type(arrived) is type(expected)


def test_a_named_tuple_of_tensors_arrives_as_its_fields(tmp_path):
    x = torch.randn(4, 9)
    arrived = _round_trip(torch.topk(x, 3), tmp_path)
    assert isinstance(arrived, tuple) and len(arrived) == 2
    assert torch.equal(arrived[0], torch.topk(x, 3).values)
    assert torch.equal(arrived[1], torch.topk(x, 3).indices)


def test_numpy_answers_pass_rooflab_check_as_they_pass_in_process(tmp_path):
    candidate = tmp_path / "floor.py"
    candidate.write_text(
        "import numpy as np\n"
        "def time_floor(flops, nbytes, peak_flops, bandwidth):\n"
        "    compute, memory = np.float64(flops) / peak_flops, np.float64(nbytes) / bandwidth\n"
        "    return max(compute, memory), np.str_('compute' if compute >= memory else 'memory')\n")
    verdict = isolated.check_in_child("roofline/time_floor", f"{candidate}:time_floor", seed=3)
    assert verdict.text.startswith("PASS"), verdict.text


def test_rooflab_check_keeps_each_problems_own_time_limit(monkeypatch):
    monkeypatch.delenv("ROOFLAB_TIME_LIMIT", raising=False)
    ring = problems.get("collectives/ring_allreduce")
    assert isolated._limit_of(ring, None) == ring.time_limit_s < default_s()
    assert isolated._limit_of(ring, 7.0) == 7.0
    assert isolated._limit_of(problems.get("coalescing/vector_add"), None) == default_s()

