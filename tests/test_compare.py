"""Comparing an output with the float64 reference: each way of being wrong is named."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rooflab.autograder.evidence import poison
from rooflab.autograder.evidence.compare import compare, unwritten_cause
from rooflab.autograder.problem import DEFAULT_TOLERANCES

CPU = torch.device("cpu")


def judge(out, ref, dtype=torch.float32):
    return compare(out, ref, dtype=dtype, device=CPU,
                   tolerance=DEFAULT_TOLERANCES[{torch.float32: "fp32", torch.float16: "fp16",
                                                 torch.bfloat16: "bf16"}[dtype]])


def test_exact_answer_passes():
    ref = torch.randn(100, dtype=torch.float64)
    assert judge(ref.float(), ref).ok


@pytest.mark.parametrize("out, words", [
    (None, "returned NoneType, expected a torch.Tensor"),
    (torch.zeros(3, 4), "shape (3, 4), expected (4, 3)"),
    (torch.zeros(4, 3, dtype=torch.float64), "dtype fp64, expected fp32"),
])
def test_type_shape_and_dtype_are_named(out, words):
    result = judge(out, torch.ones(4, 3, dtype=torch.float64))
    assert not result.ok and words in result.cause


def test_one_wrong_element_cannot_hide_in_the_norm():
    """A single element off by 10% in a million: the norm barely moves, the element check
    catches it (KernelBench's zeros passed on an absolute tolerance)."""
    ref = torch.randn(1_000_000, dtype=torch.float64)
    out = ref.float().clone()
    out[123_456] *= 1.1
    result = judge(out, ref)
    assert result.rel_error < 1e-3
    assert not result.ok and result.worst_index == (123_456,)


def test_all_zeros_fail():
    ref = torch.randn(64, 64, dtype=torch.float64)
    assert not judge(torch.zeros(64, 64), ref).ok


def test_poisoned_elements_are_reported_as_unwritten():
    ref = torch.randn(10, dtype=torch.float64)
    out = ref.float().clone()
    poison.fill(out[7:])
    result = judge(out, ref)
    assert "3 of 10 elements were never written, first at index (7,)" in result.cause


def test_nan_where_reference_is_finite_fails():
    ref = torch.randn(5, dtype=torch.float64)
    out = ref.float().clone()
    out[2] = float("nan")
    assert "NaN/inf values where the reference is finite" in judge(out, ref).cause


def test_inf_is_right_where_the_exact_answer_overflows_the_dtype():
    ref = torch.tensor([1.0, 70_000.0, -1e6], dtype=torch.float64)
    good = torch.tensor([1.0, float("inf"), float("-inf")], dtype=torch.float16)
    assert judge(good, ref, torch.float16).ok
    wrong_sign = torch.tensor([1.0, float("-inf"), float("-inf")], dtype=torch.float16)
    assert "overflows fp16" in judge(wrong_sign, ref, torch.float16).cause


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_rounded_reference_passes_and_any_one_element_off_by_the_data_scale_fails(
    shape, dtype, scale, seed
):
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + scale
    assert judge(ref.to(dtype), ref, dtype).ok
    # Error as large as the element plus the typical magnitude: a clear bug at any index.
    flat = ref.reshape(-1)
    i = seed % flat.numel()
    rms = flat.square().mean().sqrt()
    wrong = flat.clone()
    wrong[i] += flat[i].abs() + rms
    result = judge(wrong.to(dtype).reshape(ref.shape), ref, dtype)
    assert not result.ok
    where = torch.unravel_index(torch.tensor(i), ref.shape)
    assert result.worst_index == tuple(int(j) for j in where)


def test_one_block_written_at_the_start_asks_whether_each_program_has_its_own_offset():
    out = poison.empty((4097,), torch.float32, "cpu")
    out[:1024] = 1.0  # every program stored the first block
    assert "start at its own offset, pid * BLOCK?" in unwritten_cause(out)
    out[2048:3072] = 1.0  # two blocks, not together: no such guess
    assert "own offset" not in unwritten_cause(out) and "missing tail" in unwritten_cause(out)
    out[:4096] = 1.0  # a skipped tail: all but the last element
    assert "own offset" not in unwritten_cause(out) and "missing tail" in unwritten_cause(out)
