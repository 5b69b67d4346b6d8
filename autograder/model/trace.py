"""Record every memory access a Triton kernel makes in the interpreter.

Triton's interpreter funnels all global memory traffic through a handful of methods on one
builder object: masked loads and stores (plain pointers, block pointers and tensor
descriptors all end there), atomic read-modify-writes and compare-and-swaps. While
``tracing()`` is active those methods are wrapped to note, for each access, which program
made it, the absolute addresses of its lanes, which lanes were active, and the element
size; lanes that point outside every tensor argument are recorded but not performed.
Each ``tl.dot`` is recorded too, and the lanes of sorting networks' compare-and-swaps:
``tl.minimum`` and ``tl.maximum`` of the two halves of one ``tl.split``, as a network
written with them compares, and each layer of ``tl.sort``, ``tl.topk`` and
``tl.bitonic_merge`` (Triton's own compare-and-swap, a device function).
A long trace need not keep its lanes: ``tracing(keep_lanes=False)`` reduces each access, as
it happens, to the sectors and byte counts the traffic model needs (``footprint.py``),
a few bytes per sector touched instead of nine per lane.
The builder is private to Triton and its method signatures differ between versions (3.6
passes an eviction policy that 3.9 does not), so only the leading arguments, which all
supported versions share, are read. When tracing is off nothing is wrapped: it costs
nothing.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import numpy as np

from .footprint import footprint
from .trace_data import Access, Dot, Launch, TensorArg


def _tensor_args(names: list[str], args: tuple, kwargs: dict) -> list[TensorArg]:
    tensors = []
    for name, value in [*zip(names, args, strict=False), *kwargs.items()]:
        value = getattr(value, "base", value) if type(value).__name__ == "TensorDescriptor" \
            else value
        if not hasattr(value, "data_ptr") or not hasattr(value, "stride"):
            continue
        size = value.element_size()
        span = 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride(), strict=True)) \
            if value.numel() else 0
        tensors.append(TensorArg(name, value.data_ptr(), span * size, size, tuple(value.shape),
                                 tuple(value.stride())))
    return tensors


def _int_args(names: list[str], args: tuple, kwargs: dict) -> dict[str, int]:
    pairs = [*zip(names, args, strict=False), *kwargs.items()]
    return {name: int(v) for name, v in pairs if isinstance(v, int) and not isinstance(v, bool)}


def _dtype_name(handle) -> str:
    return str(handle.get_element_ty()) if hasattr(handle, "get_element_ty") else "?"


def _grid(grid, names: list[str], args: tuple, kwargs: dict) -> tuple[int, int, int]:
    if callable(grid):
        grid = grid({**dict(zip(names, args, strict=False)), **kwargs})
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    return grid[0], grid[1], grid[2]


class Tracer:
    """Collects launches while active. Not thread-safe: the interpreter is single-threaded.
    With ``keep_lanes=False`` each access is reduced to its footprint as it is made, and
    ``Launch.accesses`` stays empty."""

    def __init__(self, keep_lanes: bool = True) -> None:
        self.launches: list[Launch] = []
        self.keep_lanes = keep_lanes
        self._current: Launch | None = None

    def _inside(self, ptrs):
        """Which lanes point inside some tensor argument of the current launch."""
        addresses = np.asarray(ptrs.data, dtype=np.uint64)
        inside = np.zeros(addresses.shape, dtype=bool)
        for tensor in self._current.tensors:
            inside |= tensor.contains(addresses)
        return inside

    def _contain(self, ptrs, mask):
        """The mask with lanes outside every tensor argument switched off. The access is
        still recorded as it was asked for (and reported); it just does not happen: an
        out-of-bounds store in the interpreter would overwrite the Python process's own
        memory and kill it (in Jupyter, the kernel) with no message."""
        if self._current is None or mask is None:
            return mask
        from triton.runtime.interpreter import TensorHandle

        inside = self._inside(ptrs)
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), inside.shape)
        if (active & ~inside).any():
            return TensorHandle(active & inside, mask.dtype)
        return mask

    @staticmethod
    def _program() -> int:
        """The linear id of the program running now, x fastest."""
        from triton.runtime.interpreter import interpreter_builder as builder

        x, y, z = builder.grid_idx
        nx, ny, _ = builder.grid_dim
        return x + nx * (y + ny * z)

    def _note_write(self, ptrs, value, mask) -> None:
        """Which addresses inside the tensor arguments a store (or, ``value`` None, an
        atomic) wrote, and the bits it stored at each: two programs storing the same
        value to one address do not race, two storing different values do."""
        if self._current is None:
            return
        addresses = np.asarray(ptrs.data, dtype=np.uint64)
        active = np.ones(addresses.shape, dtype=bool) if mask is None else \
            np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        written = active & self._inside(ptrs)
        bits = None
        if value is not None:
            data = np.ascontiguousarray(np.broadcast_to(np.asarray(value.data),
                                                        addresses.shape))
            bits = data.view(f"u{data.dtype.itemsize}")[written].astype(np.uint64)
        self._current.writes.append((self._program(), addresses[written], bits))

    def _note(self, kind: str, ptrs, active) -> None:
        if self._current is None:
            return
        # Kept lanes are copied, to outlive the interpreter's arrays; a footprint is taken
        # at once, so it reads them in place.
        addresses = (np.array(ptrs.data, dtype=np.uint64, copy=True) if self.keep_lanes
                     else np.asarray(ptrs.data, dtype=np.uint64))
        if active is None:
            active_lanes = np.ones(addresses.shape, dtype=bool)
        else:
            active_lanes = np.broadcast_to(np.asarray(active.data, dtype=bool),
                                           addresses.shape)
            if self.keep_lanes:
                active_lanes = active_lanes.copy()
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        access = Access(kind, self._program(), addresses, active_lanes, size)
        if self.keep_lanes:
            self._current.accesses.append(access)
        else:
            self._current.footprints.append(footprint(access, self._current.tensors))


# The last tl.split outputs a launch keeps, to tell a network's comparisons: each layer
# compares the halves of the split just before it.
SPLITS_KEPT = 8

# Active tracers, innermost last: a tracing() nested in another (an autotuner predicting
# each config inside a check) records its launches alone, the outer one none of them.
_tracers: list[Tracer] = []


@contextlib.contextmanager
def tracing(keep_lanes: bool = True) -> Iterator[Tracer]:
    """Record the memory accesses of every interpreted launch inside the ``with`` block:
    every lane (``keep_lanes``, for pictures and checks that read addresses), or only each
    access's footprint (bounded memory, for large traces that only need the model)."""
    tracer = Tracer(keep_lanes)
    if _tracers:  # the hooks are in place: just become the innermost tracer
        _tracers.append(tracer)
        try:
            yield tracer
        finally:
            _tracers.pop()
        return
    with _hooks():
        _tracers.append(tracer)
        try:
            yield tracer
        finally:
            _tracers.pop()


@contextlib.contextmanager
def _hooks() -> Iterator[None]:
    """Route the interpreter's loads, stores, atomics, dots and launches through the
    innermost active tracer, and put the interpreter back as it was on exit."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.interpreter import interpreter_builder as builder

    # tl.minimum and tl.maximum, by operand type and NaN rule (those this version has).
    comparisons = tuple(name for name in (
        "create_minsi", "create_minui", "create_minimumf", "create_minnumf",
        "create_maxsi", "create_maxui", "create_maximumf", "create_maxnumf")
        if hasattr(builder, name))
    names = ("create_masked_load", "create_masked_store", "create_atomic_rmw",
             "create_atomic_cas", "create_dot", "create_split", *comparisons)
    originals = {name: getattr(builder, name) for name in names}
    original_run = InterpretedFunction.run
    original_call = InterpretedFunction.__call__

    def load(ptrs, mask, *rest, **kw):
        tracer = _tracers[-1]
        tracer._note("load", ptrs, mask)
        return originals["create_masked_load"](ptrs, tracer._contain(ptrs, mask), *rest, **kw)

    def store(ptrs, value, mask, *rest, **kw):
        tracer = _tracers[-1]
        tracer._note("store", ptrs, mask)
        tracer._note_write(ptrs, value, mask)
        return originals["create_masked_store"](ptrs, value, tracer._contain(ptrs, mask),
                                                *rest, **kw)

    def rmw(op, ptr, val, mask, *rest, **kw):
        tracer = _tracers[-1]
        tracer._note("atomic", ptr, mask)
        tracer._note_write(ptr, None, mask)
        return originals["create_atomic_rmw"](op, ptr, val, tracer._contain(ptr, mask),
                                              *rest, **kw)

    def cas(ptr, cmp, val, *rest, **kw):
        _tracers[-1]._note("atomic", ptr, None)
        _tracers[-1]._note_write(ptr, None, None)
        return originals["create_atomic_cas"](ptr, cmp, val, *rest, **kw)

    def dot(a, b, d, input_precision, *rest, **kw):
        current = _tracers[-1]._current
        if current is not None:
            m, k = a.data.shape[-2:]
            current.dots.append(Dot(int(m), int(b.data.shape[-1]), int(k), _dtype_name(a),
                                    _dtype_name(d),
                                    str(input_precision).rsplit(".", 1)[-1].lower(),
                                    bool(np.ptp(a.data) == 0 or np.ptp(b.data) == 0)))
        return originals["create_dot"](a, b, d, input_precision, *rest, **kw)

    def split(value):
        halves = originals["create_split"](value)
        current = _tracers[-1]._current
        if current is not None:
            recent = current.split_halves
            recent[id(halves[0])] = halves  # kept alive, so the id stays theirs
            if len(recent) > SPLITS_KEPT:
                del recent[next(iter(recent))]
        return halves

    def compared(name):
        """A step of a sorting network compares the two halves of one tl.split: the
        larger of each pair one way, the smaller the other. A clamp, a running maximum or
        a minimum of two unrelated tensors is no such step."""
        def wrapper(lhs, rhs):
            out = originals[name](lhs, rhs)
            current = _tracers[-1]._current
            if current is not None:
                halves = (current.split_halves.get(id(lhs))
                          or current.split_halves.get(id(rhs)) or ())
                if len(halves) == 2 and {id(h) for h in halves} == {id(lhs), id(rhs)}:
                    current.compare_lanes += int(np.size(out.data))
            return out
        return wrapper

    # Triton's own networks (tl.sort, tl.topk, tl.bitonic_merge) compare with tl.where, one
    # layer per call of this device function: each element once, as a step above counts.
    from triton.language import standard

    swap = getattr(getattr(standard, "_compare_and_swap", None), "fn", None)

    def device_call(self, *args, **kwargs):
        current = _tracers[-1]._current
        if swap is not None and self.fn is swap and current is not None:
            current.compare_lanes += int(np.size(args[0].handle.data))
        return original_call(self, *args, **kwargs)

    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        tracer = _tracers[-1]
        names = list(inspect.signature(self.fn).parameters)
        outer, tracer._current = tracer._current, Launch(
            self.fn.__name__, _grid(grid, names, args, kwargs),
            _tensor_args(names, args, kwargs), options=_int_args(names, args, kwargs))
        try:
            return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            tracer._current.split_halves.clear()  # nothing held past the launch
            tracer.launches.append(tracer._current)
            tracer._current = outer

    # An autotuner timing its configurations (a do_bench that runs each one, as Triton's
    # does on a GPU) launches configurations it will not choose: those launches go to a
    # tracer of their own, and only the chosen one's launch is the traced case's.
    from triton.runtime.autotuner import Autotuner

    original_bench = Autotuner.__dict__.get("_bench")

    def bench(self, *args, **kwargs):
        _tracers.append(Tracer(keep_lanes=False))
        try:
            return original_bench(self, *args, **kwargs)
        finally:
            _tracers.pop()

    for name, wrapper in (("create_masked_load", load), ("create_masked_store", store),
                          ("create_atomic_rmw", rmw), ("create_atomic_cas", cas),
                          ("create_dot", dot), ("create_split", split),
                          *((name, compared(name)) for name in comparisons)):
        setattr(builder, name, wrapper)
    InterpretedFunction.run = run
    InterpretedFunction.__call__ = device_call
    if original_bench is not None:
        Autotuner._bench = bench
    try:
        yield
    finally:
        InterpretedFunction.run = original_run
        InterpretedFunction.__call__ = original_call
        if original_bench is not None:
            Autotuner._bench = original_bench
        for name in originals:
            delattr(builder, name)  # back to the class's methods
