"""CUDA C kernels: run by CuPy on a GPU, compile-checked by NVRTC on a CPU.

Triton hides which thread touches which element; CUDA C shows it. A ``CudaKernel`` holds
the source of one ``extern "C" __global__`` function. On a GPU, calling it compiles the
source with CuPy (once) and launches it on torch's current stream with torch tensors as
arguments, so outputs are allocated by torch (and poisoned by the grader like any other).
Without a GPU nothing can run, but NVRTC — the CUDA runtime compiler, shipped as a pip
wheel and usable with no GPU or driver — still compiles the source and reports its errors
with line numbers. The grader says "needs a GPU" then, never "passed".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

# Compile for a target every CUDA 12 and 13 NVRTC knows (virtual architecture: PTX only).
NVRTC_ARCH = "compute_80"
STUB_MARK = "YOUR CODE HERE"


class NvrtcMissing(RuntimeError):
    """No NVRTC library here: CUDA C can be neither compiled nor checked."""


def _nvrtc_candidates() -> list[str]:
    found = []
    for root in sys.path:  # the pip wheels: nvidia/cu13/lib, nvidia/cuda_nvrtc/lib
        found += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so*")))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    system = ctypes.util.find_library("nvrtc")
    if system:
        found.append(system)
    return [path for path in found if "builtins" not in Path(path).name]


@functools.cache
def nvrtc() -> ctypes.CDLL:
    """The NVRTC library; raises NvrtcMissing if there is none."""
    for path in _nvrtc_candidates():
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise NvrtcMissing("NVRTC not found: `pip install nvidia-cuda-nvrtc` (CUDA 13) or "
                       "`nvidia-cuda-nvrtc-cu12` to compile-check CUDA C without a GPU")


def nvrtc_version() -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def compile_errors(source: str, name: str = "kernel.cu") -> list[str]:
    """NVRTC's error lines for ``source`` ("kernel.cu(7): error: ..."); empty if it compiles.
    Warnings are left out."""
    lib = nvrtc()
    program = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0,
                                    None, None)
    if status != 0:
        raise RuntimeError(f"nvrtcCreateProgram failed with status {status}")
    try:
        options = (ctypes.c_char_p * 2)(f"--gpu-architecture={NVRTC_ARCH}".encode(), b"-std=c++17")
        status = lib.nvrtcCompileProgram(program, 2, options)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
    if status == 0:  # compiled; the log holds warnings at most
        return []
    log_lines = log.value.decode(errors="replace").splitlines()
    return [line for line in log_lines if "error" in line] or [
        f"NVRTC failed with status {status}"]


class CudaKernel:
    """One ``extern "C" __global__`` function, ``name``, in CUDA C ``source``."""

    def __init__(self, source: str, name: str) -> None:
        self.source = source
        self.name = name

    @property
    def is_stub(self) -> bool:
        return STUB_MARK in self.source

    def compile_errors(self) -> list[str]:
        return compile_errors(self.source, f"{self.name}.cu")

    @functools.cached_property
    def _compiled(self):
        import cupy  # on a GPU only: CuPy cannot even allocate without one

        return cupy.RawKernel(self.source, self.name)

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence) -> None:
        """Launch on torch's current stream. Tensors are passed as device pointers, Python
        ints as 32-bit ``int``, floats as ``float``, numpy scalars as their own type (use
        ``np.int64`` for a ``long long`` parameter: CuPy packs arguments by their size)."""
        import cupy

        # Convert inside the stream context: DLPack hands tensors over on the current
        # stream, and outside it CuPy's would be the default one, which would make torch
        # synchronise its stream with the default stream (and break CUDA-graph capture).
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        index = device.index if device is not None and device.index is not None else \
            torch.cuda.current_device()
        with cupy.cuda.Device(index), _cupy_stream(torch.cuda.current_stream(index)):
            converted = []
            for arg in args:
                if isinstance(arg, torch.Tensor):
                    converted.append(cupy.from_dlpack(arg.detach()))
                elif isinstance(arg, np.generic):
                    converted.append(arg)
                elif isinstance(arg, int):
                    converted.append(np.int32(arg))
                else:
                    converted.append(np.float32(arg))
            self._compiled(tuple(grid), tuple(block), tuple(converted))


def _cupy_stream(stream: torch.cuda.Stream):
    """CuPy's handle on torch's ``stream``: CuPy 14 takes it through the CUDA stream
    protocol (``__cuda_stream__``) and deprecates ``ExternalStream``, which older CuPy
    has alone."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None and hasattr(stream, "__cuda_stream__"):
        return from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream)


def cupy_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("cupy") is None


def kernels_of(candidate: object) -> list[CudaKernel]:
    """The CUDA kernels a candidate launches: itself, or its ``cuda_kernels`` attribute."""
    if isinstance(candidate, CudaKernel):
        return [candidate]
    return list(getattr(candidate, "cuda_kernels", ()))
