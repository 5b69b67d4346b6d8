"""Watch a candidate run: which torch ops it called, which kernels it launched, and in
what order everything that wrote values happened.

Three things happen while a candidate runs inside ``recorder()``:

* every tensor it allocates with ``torch.empty`` (and friends) is filled with poison
  (``poison.py``), so elements it forgets to write cannot hold the right answer by luck,
  and sits between poisoned margins (``guard.py``), so writes past its end are seen;
* the aten ops it dispatches and the Triton and CUDA C kernels it launches are counted.
  The rule is positive: host code may allocate, view, fill, copy and cast
  (``TRIVIAL_OPS``); any other op does work the exercise asks a kernel to do, and is
  reported as a library call;
* every launch, and every trivial op that writes values, is logged in order, so that
  ``replay.py`` can run the same sequence again on new inputs: an answer that did not
  come from those steps (numpy, another thread, an op hidden from the recorder) does not
  follow the new inputs.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..device.cuda import CudaKernel
from . import grader_calls, guard, poison

_ALLOCATING = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# Ops that create a tensor holding values (a constant, a copy, a cast of another).
_CREATING = {"zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros",
             "new_ones", "new_full", "scalar_tensor", "clone", "_to_copy", "to",
             "lift_fresh_copy"}
# Ops that write values into an existing tensor.
_FILLING = {"fill_", "zero_", "copy_"}
_VIEWING = {"view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute",
            "expand", "expand_as", "slice", "select", "unsqueeze", "squeeze", "unbind",
            "split", "split_with_sizes", "chunk", "narrow", "detach", "alias", "lift_fresh",
            "view_as", "flatten", "unflatten", "movedim", "diagonal", "_reshape_alias",
            "resolve_conj", "resolve_neg", "_has_compatible_shallow_copy_type"}
# What host code around a kernel may do without doing the exercise's work. A problem can
# still forbid some of these (the transpose forbids copies: a copy *is* its work).
TRIVIAL_OPS = frozenset(_ALLOCATING | _CREATING | _FILLING | _VIEWING)


@dataclass
class Step:
    """One thing that wrote values, to be done again on new inputs: a kernel launch, or a
    trivial aten op (``out`` is the tensor it created, None when it wrote in place)."""

    again: Callable[[], object]
    out: torch.Tensor | None = None
    what: str = ""
    launch: bool = False  # a kernel launch (rather than a fill or a copy)
    written: tuple[int, tuple[int, ...]] = (0, ())  # by host code: bytes, and the shape


def _bytes_of(tensor: object) -> tuple[int, tuple[int, ...]]:
    if not isinstance(tensor, torch.Tensor):
        return 0, ()
    return tensor.numel() * tensor.element_size(), tuple(tensor.shape)


def host_writes(steps: list[Step]) -> list[tuple[str, int, tuple[int, ...]]]:
    """What host code wrote in ``steps`` (fills, copies, casts: the materialising a kernel
    is often asked to avoid), as (aten op, bytes, shape)."""
    return [(step.what, *step.written) for step in steps if not step.launch]


class _AtenRecorder(TorchDispatchMode):
    def __init__(self, recording: Recording) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.recording = recording
        self.launch_depth = 0  # >0 while a Triton launch runs: its own copies are not the
        # candidate's (the interpreter moves arguments with copy_ and set_)
        self.paused = 0  # >0 while the grader itself works inside the candidate's call
        self.launch_frames: list[FrameType] = []  # the launches running, innermost last

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused or self.launch_depth and not _made_by_learner(self.launch_frames[-1]):
            return out
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if (name in _ALLOCATING and isinstance(out, torch.Tensor)
                and out.layout == torch.strided and poison.supports(out.dtype)):
            shape = tuple(out.shape)
            guarded = guard.empty(shape, out.dtype, out.device, tuple(out.stride()),
                                  name=f"a tensor it allocated, shape {shape}")
            self.recording.allocations.append(guarded)
            return guarded.view
        if name in _CREATING and isinstance(out, torch.Tensor):
            self.recording.steps.append(Step(lambda: out.copy_(func(*args, **kwargs)), out,
                                             name, written=_bytes_of(out)))
        elif name in _FILLING:
            self.recording.steps.append(Step(lambda: func(*args, **kwargs), None, name,
                                             written=_bytes_of(args[0] if args else None)))
        return out


@contextlib.contextmanager
def new_threads_watched() -> Iterator[None]:
    """Every ``threading`` thread started meanwhile runs, for its whole life, under the
    dispatch modes of the thread that started it. A dispatch mode belongs to one thread:
    without this, torch work handed to a new thread would go unseen by the recorder and
    by any watch of a problem's own. (Threads started earlier are named instead, by
    ``grader_calls.threads_of_its_own``.)"""
    start, bootstrap = threading.Thread.start, threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def started(thread: threading.Thread) -> None:
        # torch has no public way to read the stack of modes (this one is in 2.0 and later).
        modes = torch.utils._python_dispatch._get_current_dispatch_mode_stack()
        thread._rooflab_modes = list(modes)  # type: ignore[attr-defined]
        start(thread)

    def bootstrapped(thread: threading.Thread) -> None:
        with contextlib.ExitStack() as modes:
            for mode in getattr(thread, "_rooflab_modes", ()):
                modes.enter_context(mode)
            bootstrap(thread)

    threading.Thread.start = started  # type: ignore[method-assign]
    threading.Thread._bootstrap_inner = bootstrapped  # type: ignore[attr-defined]
    try:
        yield
    finally:
        threading.Thread.start = start  # type: ignore[method-assign]
        threading.Thread._bootstrap_inner = bootstrap  # type: ignore[attr-defined]


def _made_by_learner(launch: FrameType) -> bool:
    """Whether an op dispatched during a launch came from the learner's code run inside
    it (a pre-run hook, a Python call in an interpreted kernel's body) rather than from
    Triton moving the arguments: a learner's frame between the op and the launch."""
    frame = sys._getframe(2)
    while frame is not None and frame is not launch:
        if grader_calls.side_of(frame.f_code) == grader_calls.LEARNER:
            return True
        frame = frame.f_back
    return False


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


def _autotuner_class() -> type | None:
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # pragma: no cover
        return None
    return Autotuner


@dataclass
class Recording:
    """What a candidate did: aten op counts, kernel launch counts, fresh allocations, and
    the ordered steps that wrote values."""

    aten_ops: Counter[str] = field(default_factory=Counter)
    triton_launches: Counter[str] = field(default_factory=Counter)
    autotuned: Counter[str] = field(default_factory=Counter)  # calls of an Autotuner
    cuda_launches: Counter[str] = field(default_factory=Counter)
    allocations: list[guard.Guarded] = field(default_factory=list)  # inside guard bands
    steps: list[Step] = field(default_factory=list)
    grader_calls: list[str] = field(default_factory=list)  # the recorder's switches it used

    def library_calls(self, forbidden: frozenset[str] = frozenset()) -> list[str]:
        """The ops that did the exercise's work: any op that is not trivial, and the
        trivial ones this problem forbids."""
        return sorted(op for op in self.aten_ops if op not in TRIVIAL_OPS or op in forbidden)


_active: list[tuple[Recording, _AtenRecorder]] = []


def note_launch(name: str, again: Callable[[], object] | None = None) -> None:
    """Count a CUDA C kernel launch (a ``CudaKernel`` called) in the active recording,
    with a way to launch it again for the replay."""
    if _active and not _active[-1][1].paused:
        recording = _active[-1][0]
        recording.cuda_launches[name] += 1
        if again is not None:
            recording.steps.append(Step(lambda: _unrecorded(again), None, name, launch=True))


def _unrecorded(launch: Callable[[], object]) -> object:
    with paused():
        return launch()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Work the grader does inside the candidate's call (stacking gradients, say): not the
    candidate's, so neither counted nor logged. Asked for by the candidate (to hide its
    library calls), it pauses nothing, and the recording notes the call."""
    if not _active:
        yield
        return
    caller = sys._getframe(2).f_code  # past contextlib's __enter__
    grader_calls.refresh()
    if grader_calls.side_of(caller) != grader_calls.GRADER:
        noted = _active[-1][0].grader_calls
        if f"{__name__}.paused" not in noted:
            noted.append(f"{__name__}.paused")
        yield
        return
    mode = _active[-1][1]
    mode.paused += 1
    try:
        yield
    finally:
        mode.paused -= 1


@contextlib.contextmanager
def _cuda_launches_noted() -> Iterator[None]:
    """Note each CUDA C launch (``CudaKernel.__call__``) in the innermost recording, as
    each Triton launch is noted through its ``run``. Installed once, by the outermost
    recorder."""
    original = CudaKernel.__call__
    if getattr(original, "_rooflab_noted", False):
        yield
        return

    def call(self: CudaKernel, grid, block, args) -> None:
        original(self, grid, block, args)
        note_launch(self.name, again=lambda: original(self, grid, block, args))

    call._rooflab_noted = True  # type: ignore[attr-defined]
    CudaKernel.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        CudaKernel.__call__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def recorder(recording: Recording | None = None) -> Iterator[Recording]:
    """Record (and poison allocations) for the duration of the ``with`` block, adding to
    ``recording`` if one is given."""
    recording = recording if recording is not None else Recording()
    grader_calls.refresh()  # the grader's own code, known before any frame is judged
    originals = {cls: cls.run for cls in _launch_classes()}
    mode = _AtenRecorder(recording)

    def make_counting_run(original):
        def run(self, *args, **kwargs):
            if mode.paused:
                return original(self, *args, **kwargs)
            top = not mode.launch_depth  # count a launch once, not each layer it passes
            if top:
                name = getattr(self, "__name__", None) or getattr(self.fn, "__name__", "kernel")
                recording.triton_launches[name] += 1
                if not kwargs.get("warmup"):
                    recording.steps.append(Step(
                        lambda: original(self, *args, **kwargs), None, name, launch=True))
            mode.launch_depth += 1
            mode.launch_frames.append(sys._getframe())
            try:
                with grader_calls.inside_a_launch() if top else contextlib.nullcontext():
                    return original(self, *args, **kwargs)
            finally:
                mode.launch_depth -= 1
                mode.launch_frames.pop()

        return run

    for cls, original in originals.items():
        cls.run = make_counting_run(original)
    autotuner = _autotuner_class()
    if autotuner is not None:
        original_tune = autotuner.run
        original_bench = autotuner.__dict__.get("_bench")

        def tune(self, *args, **kwargs):
            if not mode.paused:
                recording.autotuned[getattr(self.fn, "__name__", "kernel")] += 1
            return original_tune(self, *args, **kwargs)

        def bench(self, *args, **kwargs):
            # Timing one configuration is not the candidate's answer: on a GPU it launches
            # every configuration hundreds of times, between zeroed L2-flush buffers. Only
            # the launch with the configuration chosen is the candidate's step.
            mode.paused += 1
            try:
                return original_bench(self, *args, **kwargs)
            finally:
                mode.paused -= 1

        autotuner.run = tune
        if original_bench is not None:
            autotuner._bench = bench
    _active.append((recording, mode))
    try:
        with mode, _cuda_launches_noted(), new_threads_watched():
            yield recording
    finally:
        _active.pop()
        for cls, original in originals.items():
            cls.run = original
        if autotuner is not None:
            autotuner.run = original_tune
            if original_bench is not None:
                autotuner._bench = original_bench
        recording.aten_ops.update(mode.ops)
