"""Lab 02's later steps: tensor-core tiles, autotuning, the fused epilogue, CUDA C."""

import shutil

import pytest
import torch
import triton

from rooflab.autograder import check
from rooflab.autograder.course.build import definition_source, solution, stub
from rooflab.autograder.device import cuda
from rooflab.autograder.model import autotune, matrix_units
from rooflab.autograder.model.trace import tracing
from rooflab.kernels import matmul as mm
from rooflab.kernels.matmul_cuda import CudaMatmul, matmul_cuda_coalesced

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _grade(problem_id, fn):
    """The verdict on correctness and structure, in either world; speed is graded in
    test_solutions_on_gpu.py."""
    return check(problem_id, fn, show=False, raise_on_failure=False, measure=False)


def _fp16(m, k, n):
    return (torch.randn(m, k, device=DEVICE).half(), torch.randn(k, n, device=DEVICE).half())


def _upcasting_matmul(a, b):
    """Step 3's kernel with every tile upcast to fp32 before tl.dot: right, but slow."""
    c, args, constants = mm._launch_arguments(a, b, None, "none", "tf32")
    grid = (triton.cdiv(a.shape[0], 128) * triton.cdiv(b.shape[1], 128),)
    mm.matmul_kernel[grid](*args, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                           num_warps=8, num_stages=3, **{**constants, "UPCAST": True})
    return c


# --- what the trace sees of tl.dot ---------------------------------------------------

@pytest.mark.cpu("traces the interpreter")
def test_trace_records_each_dot_and_the_launch_options():
    a, b = _fp16(70, 40, 33)
    with tracing() as tracer:
        mm.matmul(a, b, block_m=32, block_n=64, block_k=16, num_warps=2, num_stages=5)
    launch = tracer.launches[0]
    dot = matrix_units.main_dot(launch)
    assert (dot.m, dot.n, dot.k, dot.operand, dot.accumulator) == (32, 64, 16, "fp16", "fp32")
    # 3 row blocks × 1 column block, 3 K steps each.
    assert len(launch.dots) == 3 * 1 * 3
    assert launch.options["num_warps"] == 2 and launch.options["num_stages"] == 5
    assert launch.options["BLOCK_M"] == 32 and launch.options["K"] == 40


@pytest.mark.cpu("traces the interpreter")
def test_nested_tracing_restores_the_outer_tracer():
    a, b = _fp16(40, 40, 40)
    with tracing() as outer:
        with tracing() as inner:
            mm.matmul(a, b)
        mm.matmul(a, b)
    assert len(inner.launches) == 1 and inner.launches[0].accesses
    assert len(outer.launches) == 1 and outer.launches[0].accesses  # its own launch only


# --- step 5: tensor cores ------------------------------------------------------------

@pytest.mark.cpu("graded from the interpreter's trace")
@pytest.mark.parametrize("candidate, words", [
    (mm.matmul, "a 64×64 tile does 32 FLOPs per byte"),
    (_upcasting_matmul, "multiplies fp32 tiles: the fp16 inputs were upcast"),
    (lambda a, b: mm.matmul(a, b, block_m=256, block_n=256, block_k=64, num_warps=8,
                            num_stages=4), "needs 256 KiB of shared memory"),
    (lambda a, b: mm.matmul(a, b, block_m=128, block_n=256, block_k=32, num_warps=4),
     "holds 256 fp32 accumulator values per thread"),
])
def test_tensor_core_names_what_starves_the_matrix_units(candidate, words):
    result = _grade("matmul/tensor_core", candidate)
    assert not result.passed
    assert all(case.ok for case in result.cases)  # right answers, wrong shape for the units
    assert any(words in cause for cause in result.causes), result.causes


# --- step 6: autotuning --------------------------------------------------------------

@pytest.mark.cpu("the CPU stand-in for do_bench")
def test_predicted_bench_prefers_narrow_tiles_for_skinny_problems_and_rejects_misfits():
    a, b = _fp16(16, 256, 1024)

    def run(**config):
        return lambda: mm.matmul(a, b, **config)

    big = autotune.predicted_bench(run(block_m=128, block_n=256, block_k=64, num_warps=8))
    narrow = autotune.predicted_bench(run(block_m=32, block_n=64, block_k=64))
    assert narrow < big  # 16 programs on 16 SMs beat 4 programs with 87% padding
    assert autotune.predicted_bench(run(block_m=256, block_n=256, block_k=128,
                                      num_warps=8)) == float("inf")
    assert autotune.predicted_bench(run(block_m=32, block_n=64, block_k=64),
                                  quantiles=(0.5, 0.2, 0.8)) == [narrow] * 3


def test_every_autotune_config_fits_a_hopper_sm():
    for config in mm.matmul_configs():
        kw = config.kwargs
        shared = config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * 2
        assert shared <= matrix_units.HOPPER.shared_memory, config
        per_thread = kw["BLOCK_M"] * kw["BLOCK_N"] // (config.num_warps * 32)
        assert per_thread <= matrix_units.HOPPER.accumulator_per_thread, config


@pytest.mark.parametrize("m, n, k", [(37, 70, 50), (1, 33, 129)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_autotuned_playground_matmul_with_bias_and_activation(m, n, k, dtype):
    a = torch.randn(k, m, device=DEVICE).to(dtype).T  # strided a
    b = torch.randn(k, n, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    exact = a.double() @ b.double() + bias.double()
    tol = 2e-2 if (dtype != torch.float32 or DEVICE == "cuda") else 1e-4  # fp16 or TF32
    for activation, expected in [("none", exact), ("relu", exact.relu()),
                                 ("gelu", torch.nn.functional.gelu(exact, approximate="tanh"))]:
        got = mm.matmul_autotuned(a, b, bias=bias, activation=activation)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


def test_gelu_is_finite_for_large_inputs():
    a = torch.full((16, 16), 30.0, device=DEVICE)
    b = torch.eye(16, device=DEVICE)
    b[0, 0] = -1.0
    got = mm.matmul(a, b, activation="gelu", precision="ieee")
    assert torch.isfinite(got).all()
    assert got[0, 0] == 0.0 and got[0, 1] == 30.0


# --- the fused epilogue ----------------------------------------------------------------

@pytest.mark.parametrize("candidate, words", [
    (lambda a, b, bias: torch.relu(mm.matmul(a, b) + bias), "calls the library (aten.add"),
    (lambda a, b, bias: mm.matmul(a, b, bias=bias), "wrong on"),  # forgot the relu
])
def test_epilogue_failures(candidate, words):
    result = _grade("matmul/epilogue", candidate)
    assert not result.passed
    assert words in result.causes[0]


# --- step 2: CUDA C ----------------------------------------------------------------------

needs_nvrtc = pytest.mark.skipif(not cuda._nvrtc_candidates(), reason="no NVRTC library")


@needs_nvrtc
def test_nvrtc_compiles_without_a_gpu_and_reports_errors_with_lines():
    assert matmul_cuda_coalesced.kernel.compile_errors() == []
    broken = CudaMatmul("    long long row = i / N;\n", "broken")
    errors = broken.kernel.compile_errors()
    assert errors and 'broken.cu(11): error: identifier "col" is undefined' in errors[0]


@needs_nvrtc
@pytest.mark.cpu("what a CPU can say about CUDA C")
def test_cuda_c_on_a_cpu_is_compile_checked_and_never_passed():
    result = _grade("matmul/cuda_coalesced", matmul_cuda_coalesced)
    assert result.verdict == "NEEDS A GPU"
    assert not result.passed and not result.failed
    assert "compiles (NVRTC" in result.line
    check("matmul/cuda_coalesced", matmul_cuda_coalesced, show=False)  # does not raise
    from rooflab.autograder import passed

    assert not passed("matmul/cuda_coalesced")


@needs_nvrtc
@pytest.mark.cpu("what a CPU can say about CUDA C")
@pytest.mark.parametrize("candidate, verdict, words", [
    (CudaMatmul("    // YOUR CODE HERE\n"), "NOT IMPLEMENTED", "replace `// YOUR CODE HERE`"),
    (CudaMatmul("    long long row = i / N, col = i % N\n", "typo"), "FAIL",
     "typo does not compile: typo.cu(9): error: expected a \";\""),
    (lambda a, b: a @ b, "FAIL", "no CUDA C found"),
])
def test_cuda_c_failures_on_a_cpu(candidate, verdict, words):
    result = _grade("matmul/cuda_coalesced", candidate)
    assert result.verdict == verdict
    assert words in result.causes[0]
    with pytest.raises(AssertionError):
        check("matmul/cuda_coalesced", candidate, show=False)


def test_cuda_source_markers_become_a_cuda_stub():
    source = definition_source("rooflab.kernels.matmul_cuda", ["ALONG_THE_ROWS"])
    assert source.startswith("# Consecutive threads take consecutive columns")
    assert "    // YOUR CODE HERE\n" in stub(source) and "i / N" not in stub(source)
    assert "BEGIN SOLUTION" not in solution(source) and "i / N" in solution(source)


# --- on a GPU ----------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_playground_matmul_on_gpu_at_size(dtype):
    for m, n, k in [(4096, 4096, 4096), (16, 8192, 8192), (8192, 8192, 128), (1000, 1001, 999)]:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        expected = torch.relu(a.double() @ b.double() + bias.double())
        got = mm.matmul_autotuned(a, b, bias=bias, activation="relu").double()
        error = (got - expected).norm() / expected.norm()
        assert error < {torch.float32: 1e-3, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]


@pytest.mark.gpu
def test_tf32_and_ieee_precision_on_gpu():
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    exact = a.double() @ b.double()

    def error(precision):
        got = mm.matmul(a, b, precision=precision).double()
        return float((got - exact).norm() / exact.norm())

    assert 1e-5 < error("tf32") < 1e-3  # a 10-bit mantissa: TF32 is not fp32
    assert error("ieee") < 1e-6 and error("tf32x3") < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs the CUDA driver")
def test_cuda_c_pair_on_gpu():
    pytest.importorskip("cupy")
    from rooflab.kernels.matmul_cuda import matmul_cuda_uncoalesced

    a = torch.randn(300, 200, device="cuda")
    b = torch.randn(500, 200, device="cuda").T  # strided b
    for kernel in (matmul_cuda_coalesced, matmul_cuda_uncoalesced):
        torch.testing.assert_close(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert check("matmul/cuda_coalesced", matmul_cuda_coalesced, show=False,
                 measure=False).passed


@needs_nvrtc
def test_a_warning_is_not_a_compile_error():
    source = 'extern "C" __global__ void k(float* x) { float error = 1.0f; x[0] = 2.0f; }'
    assert cuda.compile_errors(source) == []


@needs_nvrtc
def test_cuda_c_on_a_gpu_without_cupy_is_compiled_and_says_what_is_missing(monkeypatch):
    from rooflab.autograder.checking import engine
    from rooflab.autograder.device import Device

    gpu = Device(kind="gpu", name="Stand-in H100", torch_device="cpu", driver="0.0")
    monkeypatch.setattr(engine.device_layer, "current", lambda: gpu)
    monkeypatch.setattr(engine.device_layer, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(cuda, "cupy_missing", lambda: True)
    result = _grade("matmul/cuda_coalesced", matmul_cuda_coalesced)
    assert result.verdict == "NEEDS A GPU" and "CuPy is not installed" in result.line


def test_the_timed_case_is_the_marked_one():
    from rooflab.autograder import problems as problem
    from rooflab.autograder.checking import engine

    spec = problem.get("matmul/autotuned")
    assert engine.timed_case(spec.gpu_cases, spec).sizes == {"m": 4096, "n": 4096, "k": 4096}
    unmarked = problem.get("matmul/tiled")
    assert engine.timed_case(unmarked.gpu_cases, unmarked).sizes["m"] == 4096


def test_tile_rules_follow_the_target_card():
    from rooflab.autograder.device import datasheet

    assert matrix_units.rules_for(datasheet.get("H100 SXM")).shared_memory == 227 << 10
    assert matrix_units.rules_for(datasheet.get("L4")).shared_memory == 99 << 10
    assert matrix_units.rules_for(None) == matrix_units.HOPPER


@pytest.mark.cpu("the CPU stand-in for do_bench")
def test_a_tile_that_fits_a_hopper_sm_may_not_fit_an_ada_one(monkeypatch):
    a, b = _fp16(128, 128, 128)

    def config():
        mm.matmul(a, b, block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)

    assert autotune.predicted_bench(config) < float("inf")  # 128 KiB of 227
    monkeypatch.setenv("ROOFLAB_TARGET", "L4")
    assert autotune.predicted_bench(config) == float("inf")  # 128 KiB of 99


def test_grouped_order_that_ignores_the_short_last_group_fails(tmp_path):
    import importlib.util
    from pathlib import Path

    source = Path(mm.__file__).read_text()
    line = "group_size = min(tiles_m - first_m, GROUP_M)"
    assert source.count(line) == 1
    path = tmp_path / "mutant_matmul.py"
    path.write_text(source.replace(line, "group_size = GROUP_M"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mutant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutant)
    result = _grade("matmul/grouped", mutant.matmul_grouped)
    assert not result.passed and "a short last group" in result.causes[0]


@pytest.mark.cpu("graded from the interpreter's trace")
def test_every_traced_dtype_must_fit_and_short_k_is_named():
    wide = _grade("matmul/tensor_core", lambda a, b: mm.matmul(
        a, b, block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3))
    # Fits in fp16 (144 KiB); the fp32 case needs 288 KiB.
    assert [c for c in wide.causes if "288 KiB" in c and "fp32" in c], wide.causes
    short_k = _grade("matmul/tensor_core", lambda a, b: mm.matmul(
        a, b, block_m=128, block_n=128, block_k=16, num_warps=8))
    assert len(short_k.causes) == 1 and "BLOCK_K = 16" in short_k.causes[0]
    assert "and 2 more" in short_k.causes[0]  # one finding, three cases


# --- the accumulator type, whatever the seed -------------------------------------------------

@pytest.mark.cpu("the CPU's long-K case")
def test_accumulating_in_fp16_fails_and_fp32_passes_for_every_seed():
    import dataclasses

    import broken_kernels as bk

    from rooflab.autograder import get_problem

    naive = get_problem("matmul/naive")
    long_k = dataclasses.replace(naive, cpu_cases=[c for c in naive.cpu_cases
                                                   if c.note == "long K"])
    assert len(long_k.cpu_cases) == 1
    for seed in range(20):
        wrong = check(long_k, bk.matmul_rows_accumulating_in_fp16, show=False,
                      raise_on_failure=False, seed=seed)
        assert not wrong.passed and "relative error" in wrong.causes[0], seed
        right = check(long_k, mm.matmul_rows, show=False, raise_on_failure=False, seed=seed)
        assert right.passed, (seed, right.message())
