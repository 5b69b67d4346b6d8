"""Which world are we in: a CUDA GPU, or the CPU with Triton's interpreter.

Importing this module (which ``import rooflab.autograder`` does) decides the mode once.
Without a CUDA GPU it sets ``TRITON_INTERPRET=1`` so that every ``@triton.jit`` kernel
defined afterwards runs in Triton's interpreter on the CPU. The variable is read when a
kernel is *decorated*, so a kernel defined before this import stays a GPU kernel and
fails at launch with "0 active drivers"; we look for such kernels and say so plainly.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import sys
import warnings
from dataclasses import dataclass

import torch

INTERPRET_VAR = "TRITON_INTERPRET"


@dataclass(frozen=True)
class Device:
    """The device that kernels run on, as the autograder sees it."""

    kind: str  # "gpu" or "cpu"
    name: str  # "NVIDIA H100 80GB HBM3", or the CPU's description
    torch_device: str  # "cuda" or "cpu"
    driver: str = "none"
    sm_count: int = 0
    l2_bytes: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def mode(self) -> str:
        """One line that tells a learner what the numbers next to it mean."""
        if self.is_gpu and interpreter_enabled():
            return f"GPU: {self.name} with TRITON_INTERPRET=1 (interpreter): correctness only"
        if self.is_gpu:
            return f"GPU: {self.name}"
        return "CPU (Triton interpreter): correctness only"

    @property
    def can_measure(self) -> bool:
        """Kernels run on the GPU itself, so their time means something."""
        return self.is_gpu and not interpreter_enabled()


def _cuda_driver_version() -> str:
    """The CUDA driver version ("12.8"), read from libcuda; "unknown" if it cannot be read."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    return "unknown"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "CPU"


@functools.cache
def current() -> Device:
    """The device of this process. Cached: a process does not change worlds."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return Device(
            kind="gpu",
            name=props.name,
            torch_device="cuda",
            driver=_cuda_driver_version(),
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", 0),
        )
    return Device(kind="cpu", name=_cpu_name(), torch_device="cpu")


def interpreter_enabled() -> bool:
    return os.environ.get(INTERPRET_VAR, "0").lower() in ("1", "true", "on", "yes")


def _kernels_defined_for_gpu() -> list[str]:
    """Names of @triton.jit kernels that were decorated before the interpreter was switched
    on. Only looks if triton is already imported (otherwise none can exist)."""
    if "triton" not in sys.modules:
        return []
    from triton.runtime.jit import JITFunction

    names = []
    for obj in gc.get_objects():
        # type(), not isinstance(): some objects (deprecated torch aliases) warn when
        # their __class__ is read.
        if issubclass(type(obj), JITFunction):
            module = getattr(obj.fn, "__module__", "") or ""
            if not module.startswith("triton."):  # Triton's own library is fine
                names.append(getattr(obj, "__name__", repr(obj)))
    return sorted(set(names))


class KernelDefinedTooEarly(RuntimeError):
    """A Triton kernel was compiled for a GPU that this machine does not have."""


def too_early_message(names: list[str]) -> str:
    listed = ", ".join(names)
    return (
        f"Triton kernel(s) {listed} were defined before rooflab switched on Triton's "
        "interpreter, so they were built for a GPU this machine does not have and cannot "
        "launch. Put `import rooflab.autograder` (or `from rooflab.autograder import check`) "
        "above the cell or module that defines them, then restart the kernel and run again."
    )


def enable_interpreter_if_no_gpu() -> None:
    """Switch Triton to its interpreter when there is no CUDA GPU; warn about kernels that
    were defined too early to be affected."""
    if current().is_gpu:
        return
    if not interpreter_enabled():
        os.environ[INTERPRET_VAR] = "1"
        early = _kernels_defined_for_gpu()
        if early:
            warnings.warn(too_early_message(early), RuntimeWarning, stacklevel=3)


def explain_launch_error(error: BaseException) -> str | None:
    """If ``error`` is Triton's obscure failure for a GPU kernel launched without a GPU,
    return a message that says what happened and how to fix it."""
    text = str(error)
    if "active drivers" in text or "0 active driver" in text:
        names = _kernels_defined_for_gpu() or ["(unknown)"]
        return too_early_message(names)
    return None
