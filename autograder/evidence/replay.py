"""Did the candidate's kernels compute its answer? Run them again on new inputs.

A right answer proves little about *how* it was computed: torch under a disabled dispatch
mode, numpy, or a worker thread can compute it beside a kernel launched for show, out of
the recorder's sight. So after a case passes, the grader writes new random inputs into
the same input buffers, poisons every tensor the candidate created, and runs again the
steps the recorder logged, in order: its kernel launches and the fills and copies around
them (``recording.Step``). If the kernels did the work, the output follows the new inputs;
if anything else did, it still holds the old answer, or poison.

This holds on a GPU as on a CPU, needs no trace, and costs one more run of one case.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import guard, poison
from .recording import Step


def refill_inputs(inputs: Sequence[object], fresh: Sequence[object]) -> None:
    """Copy the values of ``fresh`` into the tensors of ``inputs`` (same shapes), leaving
    the tensor objects, their memory and their strides as the recorded steps know them."""
    for old, new in zip(inputs, fresh, strict=True):
        if isinstance(old, torch.Tensor):
            old.copy_(new)


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
