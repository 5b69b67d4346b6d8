"""collectives/add_into, a ring step's reduction as a Triton kernel: the course's kernel
passes, in place too; one written another way (a fixed grid looping over blocks) passes;
a missing mask, a store into the wrong tensor, a torch call instead of a kernel, and an
extra copy each fail with their cause named. On a GPU: at least 85% of the copy roof."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from rooflab.autograder import check, get_problem
from rooflab.kernels.collectives import add_into

PROBLEM = "collectives/add_into"


def grade(fn, **options):
    return check(PROBLEM, fn, show=False, raise_on_failure=False, **options)


# --- learners' versions ----------------------------------------------------------------------

@triton.jit
def _looping_kernel(a_ptr, b_ptr, out_ptr, n, PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    """A fixed grid, each program striding over the blocks: another right answer."""
    for start in range(tl.program_id(0) * BLOCK, n, PROGRAMS * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n
        total = tl.load(a_ptr + offsets, mask=mask).to(tl.float32) \
            + tl.load(b_ptr + offsets, mask=mask).to(tl.float32)
        tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=mask)


def looping(chunk, incoming, out):
    _looping_kernel[(4,)](chunk, incoming, out, out.numel(), PROGRAMS=4, BLOCK=256)
    return out


@triton.jit
def _unmasked_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    total = tl.load(a_ptr + offsets).to(tl.float32) + tl.load(b_ptr + offsets).to(tl.float32)
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty))


def unmasked(chunk, incoming, out):
    _unmasked_kernel[(triton.cdiv(out.numel(), 128),)](chunk, incoming, out, out.numel(),
                                                       BLOCK=128)
    return out


@triton.jit
def _add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    total = tl.load(a_ptr + offsets, mask=mask).to(tl.float32) \
        + tl.load(b_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(a, b, out):
    _add_kernel[(triton.cdiv(out.numel(), 256),)](a, b, out, out.numel(), BLOCK=256)


def into_chunk(chunk, incoming, out):
    """The ring's in-place habit, ignoring the out it is given."""
    _launch(chunk, incoming, chunk)
    return out


def into_incoming(chunk, incoming, out):
    _launch(chunk, incoming, incoming)
    return out


def torch_add(chunk, incoming, out):
    return torch.add(chunk, incoming, out=out)


def copy_then_add(chunk, incoming, out):
    """Right, with the bytes of a copy too: out read and written once more."""
    out.copy_(chunk)
    _launch(out, incoming, out)
    return out


# --- the tests ------------------------------------------------------------------------------

def test_the_course_kernel_passes_and_works_in_place():
    result = grade(add_into)
    assert result.passed, result.message()
    chunk, incoming = torch.randn(3001), torch.randn(3001)
    want = chunk + incoming
    assert add_into(chunk, incoming) is chunk  # out defaults to chunk: the ring's step
    assert torch.equal(chunk, want)
    empty = torch.empty(0)
    assert add_into(empty, torch.empty(0)).numel() == 0  # an empty chunk launches nothing


def test_a_kernel_written_another_way_passes():
    result = grade(looping)
    assert result.passed, result.message()


def test_a_missing_mask_fails_on_the_ragged_tail():
    result = grade(unmasked)
    assert not result.passed
    ragged = [case for case in result.cases if case.case.note == "ragged tail"]
    assert ragged and not any(case.ok for case in ragged)
    if torch.cuda.is_available():  # no trace on a GPU: the guard bands see the stores
        assert "outside" in ragged[0].summary, ragged[0].summary
    else:  # the interpreter names the program and the offset past the end
        assert "out-of-bounds access in _unmasked_kernel" in ragged[0].summary, \
            ragged[0].summary
        assert "past its end" in ragged[0].summary


@pytest.mark.parametrize("wrong, argument", [(into_chunk, 0), (into_incoming, 1)])
def test_a_store_into_the_wrong_tensor_fails_naming_it(wrong, argument):
    result = grade(wrong)
    assert not result.passed
    assert f"modified its input (argument {argument}); inputs must be read-only" \
        in result.message()


def test_a_torch_call_instead_of_a_kernel_fails():
    result = grade(torch_add)
    assert not result.passed
    assert "calls the library (aten.add), and launched no Triton kernel" in result.message()


def test_a_copy_before_the_kernel_fails_for_its_extra_bytes():
    result = grade(copy_then_add)
    assert not result.passed
    assert "calls the library (aten.copy_)" in result.message()


def test_the_problem_counts_two_reads_and_one_write():
    spec = get_problem(PROBLEM)
    case = next(c for c in spec.gpu_cases if c.note == "fills the chip")
    cost = spec.cost(case)
    assert cost.bytes == 3 * 4 * (1 << 26) and cost.flops == 1 << 26
    assert spec.levels.passing == 0.85 and spec.output_arg


@pytest.mark.gpu
def test_the_course_kernel_reaches_85_percent_of_the_copy_roof():
    result = grade(add_into)
    assert result.passed, result.message()
    perf = result.performance
    assert perf is not None and perf.measured and perf.floor.bound == "memory"
    assert perf.fraction >= 0.85, perf.line


@triton.jit
def _tutorial_add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """Triton's vector-add tutorial, as written there (fp32 in, fp32 out)."""
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, x + y, mask=mask)


def tutorial(chunk, incoming, out):
    n_elements = out.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)  # noqa: E731
    _tutorial_add_kernel[grid](chunk, incoming, out, n_elements, BLOCK_SIZE=1024)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_the_verdicts_hold_for_20_seeds(seed):
    for right in (add_into, tutorial, looping):
        result = grade(right, seed=seed)
        assert result.passed, (right.__name__, result.message())
    assert not grade(unmasked, seed=seed).passed
