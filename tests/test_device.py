"""The device layer: which world we are in, and what happens to kernels defined too early."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rooflab.autograder import device

CPU_ONLY = pytest.mark.cpu("CPU behaviour")


@CPU_ONLY
def test_cpu_mode_says_correctness_only():
    dev = device.current()
    assert not dev.is_gpu
    assert dev.mode == "CPU (Triton interpreter): nothing timed, performance predicted"


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
def test_kernel_defined_before_the_import_still_runs_and_is_named(tmp_path):
    """`import triton` and a kernel first, rooflab after: the kernel (and Triton's own
    tl.cdiv, used inside it) still runs in the interpreter, and a warning says why."""
    done = _python("""
        import torch, triton, triton.language as tl

        @triton.jit
        def early_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            blocks = tl.cdiv(n, BLOCK)  # a library @jit function, also defined too early
            x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
            y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
            out = x + y + 0 * blocks
            tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)

        def add(x, y):
            out = torch.empty_like(x)
            early_add[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
            return out

        from rooflab.autograder import check
        print(check("coalescing/vector_add", add, show=False).line)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("PASS coalescing/vector_add")
    assert "early_add were defined before rooflab switched on" in done.stderr
    assert "early_add" in done.stderr and "import rooflab.autograder" in done.stderr


def test_explain_launch_error_turns_tritons_messages_into_a_fix():
    assert device.explain_launch_error(ValueError("shape mismatch")) is None
    message = device.explain_launch_error(RuntimeError("0 active drivers ([])."))
    assert message is not None and "import rooflab.autograder before triton" in message


def test_gpu_with_the_interpreter_forced_measures_nothing(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gpu = device.Device(kind="gpu", name="NVIDIA H100 80GB HBM3", torch_device="cuda")
    assert not gpu.can_measure
    assert gpu.mode.endswith("(interpreter): nothing timed")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert gpu.can_measure
    assert gpu.mode == "GPU: NVIDIA H100 80GB HBM3"
