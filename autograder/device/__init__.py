"""The device layer: the machine kernels run on, and what it can do.

This package's own module says which world a process is in (below); its modules say the
rest:

* ``datasheet.py``: vendor figures for common cards;
* ``roofline.py``: the ceilings measured on this card beside its datasheet, the time
  floor of a piece of work, the roofline fraction;
* ``timing.py``: honest timing on a GPU, and a labelled stand-in on a CPU;
* ``versions.py``: what rooflab stands on, and the combinations known to break;
* ``cuda.py``: CUDA C, run by CuPy on a GPU and compile-checked by NVRTC on a CPU.

The layers above stand on it (all but ``course/``, its sibling). It imports nothing of
rooflab's but ``problem`` (the ``Cost`` of a piece of work, to place it on the roofline).

Which world are we in: a CUDA GPU, or the CPU with Triton's interpreter.

Importing ``rooflab.autograder`` decides the mode once. Without a CUDA GPU it sets
``TRITON_INTERPRET=1`` so that every ``@triton.jit`` kernel defined afterwards runs in
Triton's interpreter on the CPU. The variable is read when a kernel is *decorated*: a
kernel defined earlier (and Triton's own ``tl.sum``, ``tl.cdiv``... if ``triton`` was
imported first) is built for a GPU, and would fail with "0 active drivers" or "Cannot
call @triton.jit'd outside of the scope of a kernel". So when Triton was imported first,
launches and calls of such kernels are routed through the interpreter too, and the
learner's kernels among them are named in a warning.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

INTERPRET_VAR = "TRITON_INTERPRET"
# Set to 1 where the GPU runs other work at the same time (a test suite on several
# workers): a timing there would measure the others' kernels too, so checks grade
# correctness only and say why nothing was timed.
SHARED_GPU_VAR = "ROOFLAB_SHARED_GPU"


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
            return f"GPU: {self.name} with TRITON_INTERPRET=1 (interpreter): nothing timed"
        if self.is_gpu:
            return f"GPU: {self.name}"
        return "CPU (Triton interpreter): nothing timed, performance predicted"

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


def cpu_name() -> str:
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
    return Device(kind="cpu", name=cpu_name(), torch_device="cpu")


def interpreter_enabled() -> bool:
    return os.environ.get(INTERPRET_VAR, "0").lower() in ("1", "true", "on", "yes")


# Read once, when the autograder is imported (a lab's first cell, a graded child's start),
# before any learner code runs: setting the variable later changes nothing.
SHARED_GPU = os.environ.get(SHARED_GPU_VAR) == "1"


def gpu_shared() -> bool:
    """Whether this GPU was declared shared with other work (``ROOFLAB_SHARED_GPU=1`` when
    the autograder was imported)."""
    return SHARED_GPU


def _kernels_defined_for_gpu() -> list[str]:
    """Names of @triton.jit kernels, in any loaded module but Triton's own (a notebook's
    are in ``__main__``), that were decorated before the interpreter was switched on."""
    if "triton" not in sys.modules:
        return []
    from triton.runtime.jit import JITFunction

    names = set()
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.split(".")[0] in ("triton", "torch"):
            continue
        for value in list(getattr(module, "__dict__", {}).values()):
            # type(), not isinstance(): some module attributes warn when their class is read.
            if issubclass(type(value), JITFunction):
                names.add(getattr(value, "__name__", repr(value)))
    return sorted(names)


def too_early_message(names: list[str]) -> str:
    listed = ", ".join(names)
    return (
        f"Triton kernel(s) {listed} were defined before rooflab switched on Triton's "
        "interpreter (this machine has no GPU); rooflab runs them in the interpreter anyway. "
        "To avoid this, put `import rooflab.autograder` (or `from rooflab.autograder import "
        "check`) above the cell or module that defines them."
    )


def _interpret_kernels_built_for_gpu() -> None:
    """Route launches (``kernel[grid](...)``) and device-function calls of kernels that
    were decorated before the interpreter was on through an interpreted twin."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if getattr(JITFunction, "_rooflab_interpreted", False):
        return

    def twin(kernel: JITFunction) -> InterpretedFunction:
        interpreted = kernel.__dict__.get("_rooflab_twin")
        if interpreted is None:
            interpreted = kernel.__dict__["_rooflab_twin"] = InterpretedFunction(kernel.fn)
        return interpreted

    def run(self, *args, **kwargs):
        return twin(self).run(*args, **kwargs)

    def call(self, *args, **kwargs):
        return twin(self)(*args, **kwargs)

    JITFunction.run = run
    JITFunction.__call__ = call
    JITFunction._rooflab_interpreted = True


def enable_interpreter_if_no_gpu() -> None:
    """Switch Triton to its interpreter when there is no CUDA GPU. Kernels defined before
    that (if triton was imported first) are run in the interpreter too, with a warning.
    (``model.autotune.rank_by_prediction`` then gives autotuners without a timer of their
    own the traffic model's prediction to rank configurations by.)"""
    if current().is_gpu:
        return
    triton_came_first = "triton" in sys.modules
    if not interpreter_enabled():
        os.environ[INTERPRET_VAR] = "1"
    _wrap_integers_as_compiled_kernels_do()
    if triton_came_first:
        _interpret_kernels_built_for_gpu()
        early = _kernels_defined_for_gpu()
        if early and not _warned:
            _warned.update(early)
            warnings.warn(too_early_message(early), RuntimeWarning, stacklevel=3)


_warned: set[str] = set()


def _wrap_integers_as_compiled_kernels_do() -> None:
    """Turn off the interpreter's check of every integer add, subtract and multiply for
    overflow. A kernel compiled for a GPU has no such check (outside Triton's debug mode):
    an offset that overflows int32 wraps there, and now here too. The check also took
    about a fifth of the interpreter's time on kernels heavy in index arithmetic."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover (triton absent)
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and getattr(options, "sanitize_overflow", False):
        import dataclasses

        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def explain_launch_error(error: BaseException | str) -> str | None:
    """If ``error`` (or its text) is Triton's obscure failure for a GPU kernel launched
    without a GPU, return a message that says what happened and how to fix it."""
    text = error if isinstance(error, str) else str(error)
    if "active drivers" in text or "outside of the scope of a kernel" in text:
        names = ", ".join(_kernels_defined_for_gpu()) or "some kernels"
        return (f"{names} were built for a GPU, which this machine does not have: "
                "import rooflab.autograder before triton and before defining kernels, "
                "then restart and run again")
    return None


@contextlib.contextmanager
def one_cpu_thread() -> Iterator[None]:
    """Run torch on one CPU thread for a while: on tiny tensors (a grader's reference, a
    toy model) its thread pool costs more than it saves, many times more on a machine
    whose cores are busy. Each rank of a multi-process check runs so already."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
