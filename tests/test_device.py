"""The device layer: which world we are in, and what happens to kernels defined too early."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rooflab.autograder import device

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")


@CPU_ONLY
def test_cpu_mode_says_correctness_only():
    dev = device.current()
    assert not dev.is_gpu
    assert dev.mode == "CPU (Triton interpreter): correctness only"


@CPU_ONLY
def test_importing_the_autograder_switches_on_the_interpreter():
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert device.interpreter_enabled()


@pytest.mark.gpu
def test_gpu_mode_names_the_card():
    dev = device.current()
    assert dev.mode == f"GPU: {torch.cuda.get_device_name(0)}"
    assert dev.sm_count > 0


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    """Run ``code`` as a fresh script (Triton needs kernels to live in a file)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120)


@CPU_ONLY
def test_import_alone_is_enough_for_a_kernel_defined_afterwards(tmp_path):
    done = _python("""
        import torch, triton, triton.language as tl
        import rooflab.autograder

        @triton.jit
        def double(x_ptr, BLOCK: tl.constexpr):
            i = tl.arange(0, BLOCK)
            tl.store(x_ptr + i, tl.load(x_ptr + i) * 2)

        x = torch.arange(8.0)
        double[(1,)](x, BLOCK=8)
        print(x.tolist())
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[0.0, 2.0, 4.0" in done.stdout


@CPU_ONLY
def test_kernel_defined_too_early_is_named_with_the_fix(tmp_path):
    done = _python("""
        import torch, triton, triton.language as tl

        @triton.jit
        def early_bird(x_ptr):
            pass

        from rooflab.autograder import check
        result = check("coalescing/vector_add", lambda x, y: early_bird[(1,)](x) or x,
                       show=False, raise_on_failure=False)
        print(result.cases[0].summary)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    # Warned at import...
    assert "early_bird were defined before rooflab switched on" in done.stderr
    # ...and explained at launch, instead of "0 active drivers".
    assert "early_bird" in done.stdout and "import rooflab.autograder" in done.stdout
    assert "active drivers" not in done.stdout


def test_explain_launch_error_ignores_other_errors():
    assert device.explain_launch_error(ValueError("shape mismatch")) is None


def test_gpu_with_the_interpreter_forced_measures_nothing(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gpu = device.Device(kind="gpu", name="NVIDIA H100 80GB HBM3", torch_device="cuda")
    assert not gpu.can_measure
    assert gpu.mode.endswith("correctness only")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert gpu.can_measure
    assert gpu.mode == "GPU: NVIDIA H100 80GB HBM3"
