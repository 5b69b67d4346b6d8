"""Did the candidate's kernels compute its answer? Run them again on new inputs.

A right answer proves little about *how* it was computed: torch under a disabled dispatch
mode, numpy, a worker thread, or a copy of an answer kept from an earlier call can put it
there beside a kernel launched for show, out of the recorder's sight. So after each case
passes, the grader writes new random inputs into the same input buffers (the tensors of
the arguments, and those inside the objects they hold), poisons every tensor the
candidate created, and runs again the steps the recorder logged, in order: its kernel
launches and the fills and copies around them (``recording.Step``). If the kernels did
the work, every tensor of the answer (one tensor, a tuple of them, or state updated in
place) follows the new inputs; if anything else did, it still holds the old answer, or
poison.

This holds on a GPU as on a CPU, needs no trace, and costs one more run of the launches
of each case.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from . import guard, poison
from .recording import Step

_DEPTH = 6  # how deep into the arguments' objects to look for the tensors they hold


def tensors_in(value: object, depth: int = _DEPTH) -> Iterator[torch.Tensor]:
    """The tensors held by ``value``: itself, the items of its tuples, lists and dicts,
    and the attributes of its objects, in a fixed order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth <= 0 or isinstance(value, (str, bytes, int, float, complex, bool, type(None))):
        return
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item, depth - 1)
    elif isinstance(value, dict):
        for key in sorted(value, key=repr):
            yield from tensors_in(value[key], depth - 1)
    elif hasattr(value, "__dict__") and not callable(value):
        yield from tensors_in(vars(value), depth - 1)


def refill_inputs(inputs: Sequence[object], fresh: Sequence[object]) -> None:
    """Copy the values of ``fresh`` into the tensors of ``inputs`` (the same structure),
    leaving the tensor objects, their memory and their strides as the recorded steps
    know them."""
    old, new = list(tensors_in(tuple(inputs))), list(tensors_in(tuple(fresh)))
    assert len(old) == len(new), "fresh inputs must have the structure of the first"
    done: set[int] = set()  # a tensor reached twice (a view in a dict) is copied once
    for before, after in zip(old, new, strict=True):
        if id(before) not in done:
            done.add(id(before))
            before.copy_(after)


def run_again(steps: Sequence[Step], created: Sequence[guard.Guarded],
              extra: Sequence[torch.Tensor] = ()) -> None:
    """Poison what the candidate created (its allocations, the tensors its trivial ops
    made, and ``extra``), then redo every step in order."""
    for guarded in created:
        poison.fill(guarded.buffer)
    for tensor in [*(step.out for step in steps if step.out is not None), *extra]:
        poison.fill(tensor)
    for step in steps:
        step.again()
