"""Right answers computed the wrong way, and hostile code: every verdict is a failure that
says why, whatever the seed, in either world."""

import time

import cheats
import pytest
import torch

from rooflab.autograder import check


def grade(candidate, problem="coalescing/vector_add", **kwargs):
    return check(problem, candidate, show=False, raise_on_failure=False,
                 **{"measure": False, **kwargs})


# --- the work done outside the kernels ----------------------------------------------------

@pytest.mark.parametrize("candidate", [cheats.add_in_numpy, cheats.add_in_a_thread,
                                       cheats.add_out_of_sight],
                         ids=lambda c: c.__name__)
def test_work_hidden_from_the_recorder_is_caught_by_running_the_kernels_again(candidate):
    for seed in range(20):
        result = grade(candidate, seed=seed)
        assert not result.passed, seed
        message = result.message()
        assert "calls the library" in message or "not computed by its kernels" in message, \
            message


def test_work_done_by_an_op_no_denylist_names_is_a_library_call():
    result = grade(cheats.add_by_mul_and_sum)
    assert not result.passed
    assert "calls the library (aten.mul, aten.stack, aten.sum)" in result.causes[0]


@pytest.mark.parametrize("candidate", cheats.MATMUL_CHEATS, ids=lambda c: c.__name__)
def test_a_matmul_by_any_other_op_is_a_library_call(candidate):
    result = grade(candidate, problem="matmul/tiled")
    assert all(case.ok for case in result.cases)  # the answers are right...
    assert not result.passed  # ...and computed by the library
    assert "calls the library (aten." in result.causes[0]


@pytest.mark.parametrize("candidate", [cheats.strided_copy_by_indexing,
                                       cheats.strided_copy_by_take],
                         ids=lambda c: c.__name__)
def test_a_strided_copy_by_indexing_is_a_library_call(candidate):
    result = grade(candidate, problem="coalescing/strided_copy")
    assert not result.passed and "calls the library (aten." in result.causes[0]


def test_a_backward_computed_by_torch_autograd_is_a_library_call():
    from rooflab.kernels.attention import attention_reference

    def forward_for_show(q, k, v, causal, sm_scale):
        cheats._copy_into(torch.empty_like(q), q.detach().contiguous())  # a kernel, for show
        return attention_reference(q, k, v, causal, sm_scale)

    result = grade(forward_for_show, problem="attention/flash_bwd")
    assert not result.passed
    assert "calls the library (aten." in result.causes[0]


def test_the_course_kernels_host_code_is_trivial_and_replays():
    from rooflab.kernels.softmax import softmax_online
    from rooflab.kernels.vector_add import vector_add

    for problem, solution in [("coalescing/vector_add", vector_add),
                              ("softmax/online", softmax_online)]:
        for seed in range(3):
            result = grade(solution, problem=problem, seed=seed)
            assert result.passed, result.message()
            assert result.library_calls == []


# --- a stub is only the stub ----------------------------------------------------------------

def test_not_implemented_with_a_message_is_a_real_error_not_a_stub():
    def unsupported(x, y):
        raise NotImplementedError("inline_asm not supported in interpreter mode")

    result = grade(unsupported)
    assert result.verdict == "FAIL"
    assert "raised NotImplementedError: inline_asm not supported" in result.message()


def test_a_library_error_that_mentions_not_implemented_is_shown_as_it_is():
    def calls_a_removed_api(x, y):
        raise RuntimeError("NotImplementedError: Block pointers have been removed in favor "
                           "of the tensor descriptor API")

    result = grade(calls_a_removed_api)
    assert result.verdict == "FAIL" and "Block pointers have been removed" in result.message()


def test_the_stubs_own_raise_is_not_implemented_even_inside_a_kernel():
    import broken_kernels as bk

    assert grade(bk.not_implemented).verdict == "NOT IMPLEMENTED"
    assert grade(bk.not_implemented_in_a_kernel).verdict == "NOT IMPLEMENTED"


def test_the_compilers_quote_of_the_stub_is_recognised():
    from rooflab.autograder.checking.engine import _compiler_points_at_stub

    quoted = ("at 5:4:\ndef kernel(x_ptr):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
              "\n    ^\nunsupported AST node type: Raise")
    assert _compiler_points_at_stub(quoted)
    elsewhere = ("at 6:4:\n    raise NotImplementedError()\n    x = tl.make_block_ptr(x_ptr)\n"
                 "    ^\nBlock pointers have been removed")
    assert not _compiler_points_at_stub(elsewhere)


# --- endless loops ----------------------------------------------------------------------------

@pytest.mark.parametrize("candidate", [cheats.loops_in_host_code,
                                       cheats.swallows_every_exception,
                                       pytest.param(cheats.loops_in_the_kernel,
                                                    marks=pytest.mark.cpu(
                                                        "a GPU kernel that never ends "
                                                        "cannot be stopped from the host"))],
                         ids=lambda c: c.__name__)
def test_an_endless_loop_fails_at_the_time_limit_naming_the_case(candidate):
    start = time.perf_counter()
    result = grade(candidate, time_limit=1.5)
    assert time.perf_counter() - start < 30
    assert not result.passed and len(result.cases) == 1  # stops at the first
    assert "ran past the time limit of 1.5 s" in result.causes[0]
    assert result.cases[0].case.label in result.causes[0]


def test_the_time_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ROOFLAB_TIME_LIMIT", "1")
    result = grade(cheats.loops_in_host_code)
    assert "ran past the time limit of 1 s" in result.causes[0]


# --- the structure each step teaches, whatever the tile or the decoy ----------------------------

def _matmul(**config):
    from rooflab.kernels import matmul as mm

    return lambda a, b: mm.matmul(a, b, **config)


@pytest.mark.cpu("the order is read from the interpreter's trace")
@pytest.mark.parametrize("config, words", [
    ({}, "row-major order"),
    ({"block_m": 128, "block_n": 128, "num_warps": 8}, "row-major order"),
    ({"block_m": 256, "block_n": 128, "num_warps": 8}, "row-major order"),
    ({"group_m": 1 << 20}, "walk down whole columns"),
], ids=["64x64", "128x128", "256x128", "column-major"])
def test_an_order_that_is_not_grouped_fails_whatever_the_tiles(config, words):
    result = grade(_matmul(**config), problem="matmul/grouped")
    assert all(case.ok for case in result.cases if "order" not in case.summary)
    assert not result.passed
    assert any(words in cause for cause in result.causes), result.causes


@pytest.mark.cpu("the order is read from the interpreter's trace")
@pytest.mark.parametrize("config", [{"group_m": 8}, {"group_m": 4},
                                    {"group_m": 8, "block_m": 128, "block_n": 128,
                                     "num_warps": 8},
                                    {"group_m": 8, "block_m": 256, "block_n": 64,
                                     "num_warps": 8}],
                         ids=["tutorial GROUP_M=8", "4", "8, 128x128", "8, 256x64"])
def test_grouped_order_passes_with_the_tutorials_group_and_any_tile(config):
    result = grade(_matmul(**config), problem="matmul/grouped")
    assert result.passed, result.message()


@pytest.mark.cpu("stores are counted from the interpreter's trace")
def test_an_epilogue_in_a_second_kernel_fails():
    result = grade(cheats.epilogue_in_a_second_kernel, problem="matmul/epilogue")
    assert not result.passed
    assert any("stores 2.00× the bytes of C" in cause for cause in result.causes), \
        result.causes


@pytest.mark.cpu("the dots are read from the interpreter's trace")
@pytest.mark.parametrize("candidate, words", [
    (_matmul(block_m=128, block_n=128, block_k=32, group_m=8, num_warps=8,
             precision="ieee"), 'input_precision="ieee"'),
    (cheats.matmul_with_a_decoy_dot, "its tl.dot calls do 0% of the"),
], ids=["ieee fp32", "decoy dot"])
def test_tensor_cores_must_do_the_multiplication(candidate, words):
    result = grade(candidate, problem="matmul/tensor_core")
    assert not result.passed
    assert any(words in cause for cause in result.causes), result.causes


def test_an_autotuned_exercise_without_the_autotuner_fails():
    result = grade(_matmul(block_m=32, block_n=64, block_k=32), problem="matmul/autotuned")
    assert all(case.ok for case in result.cases)
    assert not result.passed
    assert "one fixed configuration" in result.causes[0]


def _autotuned_matmul(tuned):
    """The course's matmul wrapper around an autotuned ``matmul_kernel``."""
    import triton

    from rooflab.kernels import matmul as mm

    def matmul(a, b):
        c, args, constants = mm._launch_arguments(a, b, None, "none", "tf32")
        M, N = c.shape
        tuned[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)](
            *args, **constants)
        return c

    return matmul


def test_the_tutorials_autotune_without_do_bench_passes():
    """As Triton's tutorial writes it: no do_bench=, so on a CPU there is no GPU timer to
    ask; the configurations are ranked by the traffic model instead."""
    import triton

    from rooflab.kernels import matmul as mm

    tuned = triton.autotune(
        configs=[triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8},
                               num_warps=4, num_stages=3),
                 triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8},
                               num_warps=4, num_stages=4)],
        key=["M", "N", "K"])(mm.matmul_kernel)

    matmul = _autotuned_matmul(tuned)

    result = grade(matmul, problem="matmul/autotuned")
    assert result.passed, result.message()


def test_an_autotuner_that_runs_every_configuration_is_graded_on_the_one_it_chose():
    """On a GPU, Triton's do_bench runs each configuration hundreds of times (zeroing an
    L2-flush buffer between runs) before the autotuner launches the one it chose. Those
    runs are not the candidate's answer: neither its recorded steps nor its trace. Here a
    do_bench that runs each configuration as Triton's does, and prefers the second, a tile
    that fits an SM, while the first (256 × 128 × 64, 3 stages, 288 KiB in fp32) does not:
    the check sees only the launch chosen."""
    import itertools

    import triton

    from rooflab.kernels import matmul as mm

    calls = itertools.count()

    def gpu_like_bench(kernel_call, quantiles=None, **_):
        flush = torch.empty(1 << 12, dtype=torch.int32)
        for _ in range(3):
            flush.zero_()
            kernel_call()
        ms = 2.0 if next(calls) % 2 == 0 else 1.0  # the first configuration is slower
        return [ms, ms, ms] if quantiles else ms

    def config(bm, bn, bk, stages):
        return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                             num_warps=4, num_stages=stages)

    tuned = triton.autotune(configs=[config(256, 128, 64, 3), config(64, 64, 32, 3)],
                            key=["M", "N", "K", "stride_ak", "stride_bn", "INPUT_PRECISION"],
                            do_bench=gpu_like_bench)(mm.matmul_kernel)

    matmul = _autotuned_matmul(tuned)

    result = grade(matmul, problem="matmul/autotuned")
    assert next(calls) > 2  # every configuration was run, for each shape
    assert result.passed, result.message()
    # A new shape: the autotuner runs both configurations three times, then the chosen one
    # once; the recording keeps that one launch as the candidate's step, and no flush.
    from rooflab.autograder.evidence.recording import recorder

    with recorder() as recording:
        matmul(torch.randn(40, 48), torch.randn(48, 72))
    assert recording.triton_launches == {"matmul_kernel": 1}, recording.triton_launches
    assert [step.what for step in recording.steps] == ["matmul_kernel"]
    assert recording.autotuned == {"matmul_kernel": 1}


def test_library_work_hidden_in_the_autotuners_timing_runs_fails():
    """The recording pauses while the autotuner times a configuration, so a do_bench is a
    place to hide work: here it writes torch's product into C, and the configurations
    it times store nothing. Each check's replay runs the recorded steps (the chosen
    launch) on new inputs, and C no longer follows them."""
    import triton
    import triton.language as tl

    @triton.jit
    def stores_nothing(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                       stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr):
        pass

    hidden = {}

    def hiding_bench(kernel_call, quantiles=None, **_):
        a, b, c = hidden["abc"]
        c.copy_(torch.matmul(a, b))
        kernel_call()
        return [1.0, 1.0, 1.0] if quantiles else 1.0

    configs = [triton.Config({"BLOCK_M": 16}), triton.Config({"BLOCK_M": 32})]
    tuned = triton.autotune(configs=configs, key=["M", "N", "K"],
                            do_bench=hiding_bench)(stores_nothing)

    def matmul(a, b):
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        hidden["abc"] = (a, b, c)
        M, K = a.shape
        N = b.shape[1]
        tuned[(1,)](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
        return c

    result = grade(matmul, problem="matmul/autotuned")
    assert not result.passed
    first_calls = [case for case in result.cases if "again" not in case.label]
    assert first_calls and all("not computed by its kernels" in case.explained
                               for case in first_calls)


@pytest.mark.cpu("the passes over x are counted from the interpreter's trace")
@pytest.mark.parametrize("candidate, words", [
    (cheats.softmax_in_three_loops, "reads x 3.0 times"),
    ("softmax_naive", "an intermediate kept in memory"),
    ("softmax_fused", "loads a whole row"),
], ids=["three loops", "three kernels", "one block a row"])
def test_online_softmax_is_graded_on_its_one_pass_structure(candidate, words):
    from rooflab.kernels import softmax

    candidate = getattr(softmax, candidate) if isinstance(candidate, str) else candidate
    result = grade(candidate, problem="softmax/online")
    assert not result.passed
    assert any(words in cause for cause in result.causes), result.causes


@pytest.mark.parametrize("problem, config", [
    ("matmul/tiled", {"block_m": 64, "block_n": 64, "block_k": 32, "num_warps": 4}),
    ("matmul/grouped", {"block_m": 64, "block_n": 64, "block_k": 32, "num_warps": 4}),
    ("matmul/grouped", {}),
    ("matmul/tensor_core", {}),
])
def test_the_triton_tutorials_matmul_passes(problem, config):
    """bf16 in the interpreter is the one exception: the tutorial's kernel multiplies bf16
    tiles as they are, which the interpreter gets wrong (graded on a GPU only)."""
    import broken_kernels as bk

    def tutorial(a, b):
        block_k = config.get("block_k", 64 if a.element_size() == 2 else 32)
        return bk.tutorial_matmul(a, b, **{**config, "block_k": block_k})

    result = grade(tutorial, problem=problem)
    assert result.passed, result.message()


@pytest.mark.parametrize("candidate", [cheats.add_in_a_pre_run_hook,
                                       pytest.param(cheats.add_in_the_kernels_body,
                                                    marks=pytest.mark.cpu("the interpreter "
                                                                          "runs the body"))],
                         ids=lambda c: c.__name__)
def test_torch_work_inside_a_launch_is_a_library_call(candidate):
    for seed in range(3):
        result = grade(candidate, seed=seed)
        assert result.failed and "aten.add" in " ".join(result.causes), result.message()
