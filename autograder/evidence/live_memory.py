"""How much memory this process holds: every tensor storage and byte buffer alive in it.

A bound on what a candidate may keep ("O(k) memory", "one shard per rank") cannot be
checked by following the candidate's object: memory can hide in a module-level dict, a
``collections.deque``, a closure, pickled bytes, numpy, or a tensor that only autograd's
graph still holds. So the grader counts the whole process instead, before and after, and
the difference is what the candidate kept.

Found are: every live tensor (the garbage collector tracks them all), the tensors saved
in the autograd graph of any of them, bare storages, in-memory byte streams
(``io.BytesIO``), and the numpy arrays, ``bytes`` and ``bytearray`` objects held by any
container (those are not tracked themselves, so they are found as what a tracked object
refers to). A file on disk is no memory: on ranks, one written and read back during a
check is evidence of its own (``ranks/record.py``). Memory is counted by address range,
so views of one storage, and numpy arrays sharing a tensor's memory, count once.
"""

from __future__ import annotations

import gc
import io
import sys
import sysconfig
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# Storages kept bare, without a tensor over them (``tensor.untyped_storage()``).
STORAGES = (torch.UntypedStorage, torch.TypedStorage)

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch 2.4 keeps it private
    from torch.distributed._tensor import DTensor


@dataclass(frozen=True)
class Held:
    """Bytes held on one device, in how many separate buffers, and how many objects were
    frozen out of the garbage collector's sight (``gc.freeze``), which nothing here can
    count: a measure whose ``frozen`` grew is no measure of what was kept."""

    bytes: int
    buffers: int
    frozen: int = 0

    def __sub__(self, other: Held) -> Held:
        return Held(self.bytes - other.bytes, self.buffers - other.buffers,
                    self.frozen - other.frozen)


def _tensor_range(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    try:
        storage = tensor.untyped_storage()
        size = storage.nbytes()
        if size == 0 or tensor.device.type == "meta":
            return None
        # A storage torch has already invalidated (a tensor of a finished graph's
        # internals) refuses its data pointer: it holds nothing.
        return str(tensor.device), storage.data_ptr(), size
    except (RuntimeError, NotImplementedError):  # sparse, or a wrapper without storage
        return None


def _array_range(array: np.ndarray) -> tuple[str, int, int] | None:
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.nbytes == 0:
        return None
    return "cpu", root.__array_interface__["data"][0], root.nbytes


def _storage_range(storage: object) -> tuple[str, int, int] | None:
    """A bare storage's memory (one kept without a tensor over it)."""
    try:
        size = storage.nbytes()
        if size == 0 or storage.device.type == "meta":
            return None
        return str(storage.device), storage.data_ptr(), size
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _buffer_range(item: object) -> tuple[str, int, int] | None:
    if isinstance(item, torch.Tensor):
        return _tensor_range(item)
    if isinstance(item, np.ndarray):
        return _array_range(item)
    if isinstance(item, STORAGES):
        return _storage_range(item)
    return ("cpu", id(item), sys.getsizeof(item))  # bytes, bytearray, a byte stream


def _saved_by_autograd(tensor: torch.Tensor, seen: set[int]) -> list[object]:
    """The tensors saved for backward in the graph behind ``tensor`` (and the arrays and
    byte strings saved-tensor hooks packed them into): they live in C++, out of the
    garbage collector's sight, as long as the graph does."""
    found, todo = [], [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if name.startswith("_saved_"):
                packed = _packed(node, name)
                try:
                    value = getattr(node, name) if packed is None else packed
                except RuntimeError:  # freed by a backward that did not retain the graph
                    continue
                found += [v for v in (value if isinstance(value, (tuple, list)) else [value])
                          if isinstance(v, (torch.Tensor, np.ndarray, bytes, bytearray))]
        todo += [next_node for next_node, _ in getattr(node, "next_functions", ())]
    return found


def _packed(node: object, name: str) -> list | None:
    """What a saved tensor packed by hooks holds (``saved_tensors_hooks``, a checkpoint, an
    offload to the host), as the tensors in it; None for one saved as it is. Reading the
    saved tensor itself would run its unpack hook: a checkpoint's recomputes the forward."""
    raw = getattr(node, "_raw" + name, None)
    if getattr(raw, "unpack_hook", None) is None:  # plain, or a torch that cannot tell
        return None
    found, seen, todo = [], set(), [getattr(raw, "data", None)]
    while todo:  # what the packed object holds, through containers and attributes
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, (torch.Tensor, np.ndarray, bytes, bytearray)):
            found.append(item)
        elif not isinstance(item, (type, types.ModuleType, types.FunctionType)):
            todo += gc.get_referents(item)
    return found


def _ranges() -> list[tuple[str, int, int]]:
    ranges = []
    nodes_seen: set[int] = set()

    def add(item: object) -> None:
        kind = type(item)  # not isinstance: some deprecated objects warn when asked
        if issubclass(kind, torch.Tensor):
            found = _tensor_range(item)
            if found:
                ranges.append(found)
            if item.grad_fn is not None:
                for saved in _saved_by_autograd(item, nodes_seen):
                    found = _buffer_range(saved)
                    if found:
                        ranges.append(found)
        elif issubclass(kind, np.ndarray):
            found = _array_range(item)
            if found:
                ranges.append(found)
        elif issubclass(kind, (bytes, bytearray)) and len(item) >= 64:
            ranges.append(("cpu", id(item), sys.getsizeof(item)))
        elif issubclass(kind, STORAGES):
            found = _storage_range(item)
            if found:
                ranges.append(found)
        elif issubclass(kind, io.BytesIO):  # its buffer, which sizeof counts
            try:
                ranges.append(("cpu", id(item), sys.getsizeof(item)))
            except ValueError:  # closed: it holds nothing
                pass

    # Untracked objects are reached through what refers to them; that includes untracked
    # containers (a dict or tuple holding only atomic values is not tracked either).
    untracked_seen: set[int] = set()
    for obj in gc.get_objects():
        add(obj)
        todo = [r for r in gc.get_referents(obj) if not gc.is_tracked(r)]
        while todo:
            referent = todo.pop()
            if id(referent) in untracked_seen:
                continue
            untracked_seen.add(id(referent))
            add(referent)
            if type(referent) in (dict, tuple, list):
                todo += [r for r in gc.get_referents(referent) if not gc.is_tracked(r)]
    return ranges


def live(device: str | torch.device = "cpu") -> Held:
    """The bytes held by live tensors and buffers on ``device`` ("cpu", "cuda:0", ...),
    after a garbage collection."""
    gc.collect()
    wanted = str(torch.device(device))
    spans = sorted((start, start + size) for where, start, size in _ranges()
                   if where == wanted or where == wanted.removesuffix(":0") and wanted != "cpu")
    total, buffers, end = 0, 0, -1
    for start, stop in spans:  # merge overlapping ranges: a view counts once
        if start >= end:
            total += stop - start
            buffers += 1
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return Held(total, buffers, gc.get_freeze_count())


# --- what a candidate made, found from the grader's side ---------------------------------------

def freeze() -> list:
    """Hand every object alive now to the garbage collector's permanent generation, which
    ``live`` does not walk: torch, the harness and the inputs are the grader's, and a
    walk of the objects made since costs milliseconds where one of a whole rank (torch
    and its compiler loaded: 300,000 objects) costs most of a second. (Freezing splices
    lists: it touches no object, so no page the rank shares with its launcher.)

    Returns a sentinel made just after: should the learner's code freeze objects too,
    hiding what it made from ``live``, the sentinel is frozen with them and is no longer
    among the objects the collector lists (``refrozen``). Thawing them instead
    shows the grader's objects to ``live`` as the learner's: its own loss."""
    gc.freeze()
    return []


def refrozen(sentinel: list) -> bool:
    """Whether objects were frozen since ``freeze`` made ``sentinel``."""
    return not any(obj is sentinel for obj in gc.get_objects())


_INSTALLED = tuple(str(Path(p).resolve()) for key in ("stdlib", "platstdlib", "purelib",
                                                       "platlib")
                   if (p := sysconfig.get_paths().get(key)))


def _library(obj: object) -> bool:
    """A module, class or function of an installed package or of the grader: none of the
    learner's memory is in there."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        name = getattr(obj, "__module__", None) or "builtins"
    else:
        return False
    if name.startswith("rooflab.autograder"):
        return True
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    return module is not None and (file is None or str(Path(file).resolve()).startswith(
        _INSTALLED))


def reachable_buffers(*roots: object) -> list[object]:
    """The tensors (aliased), arrays and byte strings reachable from ``roots`` (the
    learner's function, a module it changed) through anything but installed libraries:
    a function's globals, closure, defaults, module, and the classes, instances and
    containers in them. Those made before
    ``freeze`` (its globals travel to the ranks with it, and are made there before the
    grader's loop begins) are counted only through these: a list made now that holds
    them is what ``live`` walks. (No limit on the walk: a learner who makes it long
    spends the case's own time.) Not seen: an array or byte string made since and held
    only by an object made before that the function does not reach (a dict of torch's)."""
    found, seen, todo = [], set(), list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or _library(obj):
            continue
        seen.add(id(obj))
        kind = type(obj)
        if issubclass(kind, torch.Tensor):
            found.append(obj.detach())
        elif issubclass(kind, (np.ndarray, bytes, bytearray)):
            found.append(obj)
        else:
            todo += gc.get_referents(obj)
    return found


def local_part(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A DTensor's shard on this rank (FSDP2's and tensor parallelism's parameters are
    DTensors), by its class: a ``to_local`` attribute a tensor claims is no evidence.
    Any other tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def storage_bytes(items: list[object]) -> int:
    """The bytes of the distinct storages behind ``items``, each once however many views
    (a DTensor's local shard; arrays and byte strings by their size)."""
    seen: dict[int, int] = {}
    for item in items:
        if isinstance(item, torch.Tensor):
            try:
                storage = local_part(item).untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            seen[storage.data_ptr() or id(storage)] = storage.nbytes()
        else:
            seen[id(item)] = getattr(item, "nbytes", None) or len(item)
    return sum(seen.values())
