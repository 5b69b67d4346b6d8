"""The correctness engine catches each classic kernel bug, and says which one it is."""

import re

import broken_kernels as bk
import pytest
import torch

from rooflab.autograder import Case, Cost, Problem, check, register
from rooflab.autograder.evidence import poison
from rooflab.autograder.evidence.recording import recorder


def grade(candidate, problem="coalescing/vector_add", **kwargs):
    """The verdict on correctness. Nothing is timed (``measure=False``): on a GPU these
    tests grade the same things, on that world's cases, and speed is tested elsewhere."""
    return check(problem, candidate, show=False, raise_on_failure=False,
                 **{"measure": False, **kwargs})


def ragged(result, block=128):
    """The cases whose length is not a multiple of ``block``, in either world's case list."""
    cases = [c for c in result.cases if c.case.sizes["n"] % block]
    assert cases, "no ragged case to look at"
    return cases


def test_correct_kernel_passes_every_case():
    result = grade(bk.correct)
    assert result.passed, result.message()
    assert all(case.ok for case in result.cases)
    assert len(result.cases) >= 4
    assert result.triton_launches == {"_add": len(result.cases)}


def test_check_returns_result_and_raises_assertion_with_the_cause():
    assert check("coalescing/vector_add", bk.correct, show=False, measure=False).passed
    with pytest.raises(AssertionError, match="never written"):
        check("coalescing/vector_add", bk.skips_tail, show=False, measure=False)


def test_skipped_ragged_tail_is_reported_as_unwritten():
    result = grade(bk.skips_tail)
    assert not result.passed
    for case in ragged(result):
        n = case.case.sizes["n"]
        assert not case.ok
        assert (f"{n % 128} of {n} elements were never written, first at index "
                f"({n - n % 128},)") in case.summary


def test_unwritten_outputs_are_counted_and_located():
    result = grade(bk.leaves_half_unwritten)
    longer = [c for c in result.cases if c.case.sizes["n"] > 1]
    assert longer
    for case in longer:
        n = case.case.sizes["n"]
        assert f"{n - n // 2} of {n} elements were never written" in case.summary
        assert f"first at index ({n // 2},)" in case.summary


def test_modified_input_is_named():
    result = grade(bk.modifies_input)
    assert not result.passed
    assert "modified its input (argument 0)" in result.causes[0]


def test_wrong_dtype_is_named():
    result = grade(bk.wrong_dtype)
    assert not result.passed
    fp16 = next(c for c in result.cases if c.case.dtype == torch.float16)
    assert "dtype fp32, expected fp16" in fp16.summary
    fp32 = next(c for c in result.cases if c.case.dtype == torch.float32)
    assert fp32.ok


def test_overflow_to_inf_on_large_inputs_is_caught():
    result = grade(bk.overflows)
    assert not result.passed
    large = next(c for c in result.cases if c.case.scale > 1)
    assert "NaN/inf values where the reference is finite" in large.summary
    # bf16 is left out: the interpreter's bf16 arithmetic is itself wrong.
    small = [c for c in result.cases if c.case.scale == 1 and c.case.dtype != torch.bfloat16]
    assert small and all(c.ok for c in small)


def test_library_call_is_reported_even_though_the_answer_is_right():
    result = grade(bk.calls_library)
    assert all(c.ok for c in result.cases)
    assert not result.passed
    assert result.library_calls == ["add"]
    assert "calls the library (aten.add)" in result.causes[0]


def test_matmul_that_calls_torch_mm_is_reported():
    result = grade(lambda a, b: a @ b, problem="matmul/tiled")
    assert "mm" in result.library_calls
    assert not result.passed


def test_no_kernel_at_all_is_reported():
    def plain_torch(x, y):  # no library add, but no kernel either
        exact = torch.addcmul(x.double(), y.double(), torch.ones_like(y.double()))
        return exact.to(x.dtype)

    result = grade(plain_torch)
    assert not result.passed
    assert any("launched no Triton kernel" in c for c in result.causes)


def test_not_implemented_stub_is_its_own_verdict():
    result = grade(bk.not_implemented)
    assert result.verdict == "NOT IMPLEMENTED"
    assert not result.passed
    with pytest.raises(AssertionError, match="not implemented yet"):
        check("coalescing/vector_add", bk.not_implemented, show=False)


def test_exception_in_candidate_names_type_and_place():
    def crashes(x, y):
        raise ValueError("bad block size")

    result = grade(crashes)
    assert "raised ValueError: bad block size" in result.cases[0].summary
    assert "test_engine.py" in result.cases[0].summary


def test_seed_repeats_the_inputs_and_fresh_runs_differ():
    seen = []

    def spy(x, y):
        seen.append(x.clone())
        return bk.correct(x, y)

    first = grade(spy)
    grade(spy, seed=first.seed)
    grade(spy)
    runs = len(first.cases)
    assert torch.equal(seen[0], seen[runs])
    assert not torch.equal(seen[0], seen[2 * runs])


def test_inputs_are_random_and_never_zero():
    captured = []
    grade(lambda x, y: captured.append((x, y)) or bk.correct(x, y))
    for x, y in captured:
        assert (x != 0).float().mean() > 0.99 and (y != 0).float().mean() > 0.99
        assert not torch.equal(x, y)


def test_fresh_allocations_are_poisoned_while_recording():
    with recorder():
        fresh = torch.empty(100)
        like = torch.empty_like(fresh)
        ints = torch.empty(5, dtype=torch.int32)
    assert poison.unwritten_mask(fresh).all()
    assert poison.unwritten_mask(like).all()
    assert poison.unwritten_mask(ints).all()
    assert torch.isnan(fresh).all()


def test_a_cuda_c_launch_is_counted_and_logged_for_the_replay(monkeypatch):
    """The recorder notes each call of a CudaKernel, as it notes each Triton launch: here
    the launch itself (CuPy's, GPU only) is replaced by one that adds on the CPU."""
    from rooflab.autograder.device.cuda import CudaKernel
    from rooflab.autograder.evidence.recording import Recording

    def launch(self, grid, block, args):
        x, out = args
        out.numpy()[:] = x.numpy() + 1  # not through torch: the recorder sees no op

    monkeypatch.setattr(CudaKernel, "__call__", launch)
    kernel = CudaKernel("extern \"C\" __global__ void add_one() {}", "add_one")
    x, out = torch.zeros(4), torch.zeros(4)
    recording = Recording()
    with recorder(recording), recorder():  # nested: noted once, in the innermost
        kernel((1,), (4,), (x, out))
    with recorder(recording):
        kernel((1,), (4,), (x, out))
    assert recording.cuda_launches == {"add_one": 1}
    assert [step.what for step in recording.steps] == ["add_one"]
    x.fill_(41)
    recording.steps[0].again()
    assert out.tolist() == [42.0] * 4
    assert CudaKernel.__call__ is launch  # the recorder leaves the class as it found it


def test_empty_reusing_the_references_memory_cannot_pass():
    """torch.empty can hand back a buffer that still holds the right answer."""

    def returns_fresh_memory(x, y):
        (x + y).sum()  # compute, free...
        return torch.empty_like(x)  # ...and hope the allocator returns the same bytes

    result = grade(returns_fresh_memory)
    assert not any(c.ok for c in result.cases)


# A problem in the "grader passes the output buffer" convention.
def _out_inputs(case, gen, device):
    n = case.sizes["n"]
    return (torch.randn(n, generator=gen, device=device).to(case.dtype),)


OUT_PROBLEM = register(Problem(
    id="test/negate_into",
    title="negate into a given buffer",
    signature="(x: Tensor[n], out: Tensor[n]) -> None",
    make_inputs=_out_inputs,
    reference=lambda x: -x,
    cost=lambda case: Cost(case.sizes["n"], 8 * case.sizes["n"]),
    cpu_cases=[Case({"n": 10}), Case({"n": 1000})],
    gpu_cases=[Case({"n": 10}), Case({"n": 1000})],
    output_arg=True,
    out_shape=lambda case: (case.sizes["n"],),
    kernel=None,
))


def test_output_buffer_passed_by_the_grader_is_poisoned():
    def writes_all(x, out):
        out.copy_(-x)

    def writes_first_half(x, out):
        out[: len(out) // 2] = -x[: len(x) // 2]

    assert grade(writes_all, problem=OUT_PROBLEM).passed
    result = grade(writes_first_half, problem=OUT_PROBLEM)
    assert "500 of 1000 elements were never written" in result.cases[1].summary


def test_unknown_problem_lists_the_known_ones():
    with pytest.raises(KeyError, match="coalescing/vector_add"):
        check("nope/nothing", bk.correct, show=False)


@pytest.mark.cpu("what a CPU says instead of a time")
def test_cpu_result_shows_no_timing_as_gpu_performance():
    result = grade(bk.correct, measure=True)
    assert result.performance is not None and not result.performance.measured
    assert result.performance.seconds is None and result.performance.fraction is None
    assert "nothing measured" in result.line
    assert "CPU (Triton interpreter): nothing timed, performance predicted" in result.line


@pytest.mark.gpu
def test_gpu_check_measures_and_rechecks_after_timing():
    from rooflab.kernels.vector_add import vector_add

    result = grade(vector_add, measure=True)
    perf = result.performance
    assert perf is not None and perf.measured
    assert perf.seconds > 0 and 0 < perf.fraction <= 1.2
    assert perf.floor.bound == "memory"
    assert result.mode.startswith("GPU: ")


def test_write_past_the_end_is_reported_not_a_crash():
    result = grade(bk.writes_out_of_bounds)
    for tail in ragged(result):
        n = tail.case.sizes["n"]
        if torch.cuda.is_available():  # no trace on a GPU: the guard bands catch it
            assert (f"wrote {-n % 128} elements outside a tensor it allocated, shape ({n},)"
                    in tail.summary)
        else:  # the interpreter's trace names the program and the offset
            elements = "element" if n == 1 else "elements"
            assert (f"program ({n // 128}, 0, 0) stores out_ptr[{n}], past its end (out_ptr "
                    f"has {n} {elements})") in tail.summary


def test_a_block_written_past_the_end_is_reported_and_the_process_survives():
    for _ in range(3):  # heap corruption, if the stores went through, shows up by now
        result = grade(bk.writes_a_whole_block_out_of_bounds)
        assert not result.passed
        assert "past its end" in result.causes[0] or "outside" in result.causes[0]


def test_guard_bands_catch_a_write_past_the_end_without_the_trace(monkeypatch):
    """As on a GPU, where nothing is traced: the poisoned margins see the write."""
    import contextlib

    from rooflab.autograder.checking import engine

    monkeypatch.setattr(engine, "_maybe_tracing", lambda: contextlib.nullcontext())
    result = grade(bk.writes_out_of_bounds)
    for tail in ragged(result):
        n = tail.case.sizes["n"]
        assert (f"wrote {-n % 128} elements outside a tensor it allocated, shape ({n},)"
                in tail.summary)


def test_tutorial_style_kernel_passes_and_bf16_is_left_to_the_gpu():
    result = grade(bk.tutorial_add)
    assert result.passed, result.message()
    if not torch.cuda.is_available():
        assert any("bf16 is graded on a GPU only" in reason for reason in result.skipped)
        assert all(c.case.dtype != torch.bfloat16 for c in result.cases)
        assert "skip" in result.message()


@pytest.mark.parametrize("candidate, words", [
    (bk.transpose_as_view, "not contiguous"),
    (bk.transpose_returns_input, "returned (a view of) argument 0"),
    (bk.transpose_with_copy_, "calls the library (aten.copy_)"),
])
def test_transpose_shortcuts_fail(candidate, words):
    result = grade(candidate, problem="coalescing/transpose")
    assert not result.passed
    assert words in result.causes[0]


def test_transpose_reads_strided_input():
    from rooflab.kernels.transpose import transpose

    result = grade(transpose, problem="coalescing/transpose")
    assert result.passed, result.message()
    assert any(c.case.transposed == ("x",) for c in result.cases)


def test_matmul_accumulating_in_fp16_fails_on_long_k():
    result = grade(bk.matmul_accumulating_in_fp16, problem="matmul/tiled")
    long_k = next(c for c in result.cases if c.case.sizes["k"] >= 1000)
    assert not long_k.ok and "relative error" in long_k.summary


def test_exception_points_at_the_learners_line_not_tritons():
    import triton

    def bad_block(x, y):
        out = torch.empty_like(x)
        bk._add[(triton.cdiv(x.numel(), 100),)](x, y, out, x.numel(), BLOCK=100, MASKED=True)
        return out

    result = grade(bad_block)
    summary = result.cases[0].summary
    assert "test_engine.py" in summary and "bk._add" in summary
    assert "triton/" not in summary


@pytest.mark.cpu("two programs storing one element is read from the trace")
def test_a_transpose_that_forgets_to_swap_is_told_so_not_called_a_race():
    result = grade(bk.transpose_forgets_to_swap, problem="coalescing/transpose")
    assert not result.passed
    message = result.message()
    assert "both store to out_ptr[" in message and "rows and columns the wrong way" in message
    assert not re.search(r"\brace\b", message)
    assert re.search(r"programs \(\d+, \d+, 0\) and \(\d+, \d+, 0\)", message)


def test_an_error_inside_a_library_is_placed_on_the_learners_line():
    import json

    from rooflab.autograder import check

    def parses_on_the_way(x, y):
        return json.loads("{not json")  # the learner's line, whatever json does inside

    result = check("coalescing/vector_add", parses_on_the_way, show=False,
                   raise_on_failure=False, seed=1)
    assert "JSONDecodeError" in result.causes[0]
    assert "(at test_engine.py:" in result.causes[0], result.causes[0]
    assert "decoder.py" not in result.message()


def test_a_gpu_shared_with_other_work_grades_correctness_and_times_nothing(monkeypatch,
                                                                          tmp_path):
    """Declared shared when the autograder was imported (ROOFLAB_SHARED_GPU=1: a suite on
    several workers, one GPU), a check on a GPU that could time says it timed nothing and
    why. Setting the variable later (a learner's cell) changes nothing, and under
    `rooflab grade` the declaration is ignored: a record must carry its timing."""
    from dataclasses import dataclass

    from rooflab.autograder import device, get_problem
    from rooflab.autograder.checking import engine, handin
    from rooflab.autograder.checking.result import CheckResult

    @dataclass(frozen=True)
    class Measuring(device.Device):
        can_measure = True  # as on a GPU without the interpreter

    card = Measuring("gpu", "a shared card", "cpu")
    spec = get_problem("coalescing/vector_add")

    def performance():
        return engine._performance(spec, None, card, 0, True, CheckResult(spec.id, card.mode, 0))

    # Not declared: it goes on to measure the card's ceilings and time (a CPU refuses).
    monkeypatch.setenv("ROOFLAB_SHARED_GPU", "1")  # too late: read at import
    with pytest.raises(RuntimeError, match="ceilings can only be measured on a GPU"):
        performance()
    monkeypatch.setattr(device, "SHARED_GPU", True)  # as if set before the import
    perf = performance()
    assert not perf.measured
    assert "the GPU is shared with other work now: ROOFLAB_SHARED_GPU=1" in perf.line
    monkeypatch.setenv(handin.INTO_ENV, str(tmp_path))  # a notebook run by rooflab grade
    with pytest.raises(RuntimeError, match="ceilings can only be measured on a GPU"):
        performance()
