"""Watch a candidate run: which torch ops it called, which Triton kernels it launched.

Two things happen while a candidate runs inside ``Recorder``:

* every tensor it allocates with ``torch.empty`` (and friends) is filled with poison
  (``poison.py``), so elements it forgets to write cannot hold the right answer by luck,
  and sits between poisoned margins (``guard.py``), so writes past its end are seen;
* the aten ops it dispatches and the Triton kernels it launches are counted, so that a
  "kernel" that just calls ``torch.mm`` is reported as doing so.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import guard, poison

_ALLOCATING = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class _AtenRecorder(TorchDispatchMode):
    def __init__(self, allocations: list[guard.Guarded]) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.allocations = allocations
        self.launch_depth = 0  # >0 while a Triton launch runs: its own copies are not the
        # candidate's (the interpreter moves arguments with copy_ and set_)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        if self.launch_depth:
            return out
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if (name in _ALLOCATING and isinstance(out, torch.Tensor)
                and out.layout == torch.strided and poison.supports(out.dtype)):
            shape = tuple(out.shape)
            guarded = guard.empty(shape, out.dtype, out.device, tuple(out.stride()),
                                  name=f"a tensor it allocated, shape {shape}")
            self.allocations.append(guarded)
            return guarded.view
        return out


def _launch_classes() -> list[type]:
    """The Triton classes whose ``run`` method every launch goes through."""
    classes: list[type] = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # triton absent or reorganised: record nothing rather than fail
        pass
    return classes


class Recording:
    """What a candidate did: aten op counts, Triton and CUDA C kernel launch counts."""

    def __init__(self) -> None:
        self.aten_ops: Counter[str] = Counter()
        self.triton_launches: Counter[str] = Counter()
        self.cuda_launches: Counter[str] = Counter()
        self.allocations: list[guard.Guarded] = []  # fresh tensors, inside guard bands

    def library_calls(self, library_ops: frozenset[str]) -> list[str]:
        return sorted(op for op in self.aten_ops if op in library_ops)


_active: list[Recording] = []


def note_launch(name: str) -> None:
    """Count a CUDA C kernel launch (see cuda.CudaKernel) in the active recording."""
    if _active:
        _active[-1].cuda_launches[name] += 1


@contextlib.contextmanager
def recorder(recording: Recording | None = None) -> Iterator[Recording]:
    """Record (and poison allocations) for the duration of the ``with`` block, adding to
    ``recording`` if one is given."""
    recording = recording if recording is not None else Recording()
    originals = {cls: cls.run for cls in _launch_classes()}
    mode = _AtenRecorder(recording.allocations)

    def make_counting_run(original):
        def run(self, *args, **kwargs):
            if not mode.launch_depth:  # count a launch once, not each layer it passes
                name = getattr(self, "__name__", None) or getattr(self.fn, "__name__", "kernel")
                recording.triton_launches[name] += 1
            mode.launch_depth += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                mode.launch_depth -= 1

        return run

    for cls, original in originals.items():
        cls.run = make_counting_run(original)
    _active.append(recording)
    try:
        with mode:
            yield recording
    finally:
        _active.pop()
        for cls, original in originals.items():
            cls.run = original
        recording.aten_ops.update(mode.ops)
