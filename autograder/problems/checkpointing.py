"""Activation checkpointing: a learner's ``checkpoint_blocks(model)``, graded on the
gradients it gives and the activations it keeps.

``fsdp/checkpoint`` calls the learner's function on lab 09's model, then the grader's
harness (``run``) runs one forward and backward of a regression loss, in a process of its
own (a group of one rank, as every problem whose candidate builds a model runs: the
learner's code runs confined there, never in the grader). Graded:

* the gradients: every parameter's, against one process running the model as it was
  (its input is data, which needs no gradient), to 1e-6 of the largest value
  (recomputing runs the same operations again: in practice they are equal to the last
  bit);
* the recomputation: each block's first layer runs again in backward (a hook counts);
* the activations: the bytes alive after forward beyond those before (every storage,
  autograd's saved tensors included, and what saved-tensor hooks packed:
  ``evidence/live_memory.py``), at most what keeping each block's input and the model's
  output takes, L + 1 tensors of b × s × h, with a random generator's state a block and
  half a tensor of slack. Without checkpointing a block keeps some 16 of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import one_cpu_thread
from ..evidence.compare import CaseResult, Comparison
from ..evidence.live_memory import freeze, live, refrozen
from ..problem import Case, Cost, register
from ..ranks import RanksProblem, record
from ..ranks.report import forged_marks
from .fsdp import make_model

BATCH, LENGTH = 2, 16
RELATIVE = 1e-6


def _case(dim: int, layers: int, heads: int = 4) -> Case:
    return Case({"ranks": 1, "dim": dim, "layers": layers, "heads": heads}, torch.float32)


CASES = [_case(dim=32, layers=3), _case(dim=48, layers=4)]


def _inputs(case: Case, generator: torch.Generator, device: torch.device) -> list[tuple]:
    dim = case.sizes["dim"]
    setup = (dim, case.sizes["heads"], case.sizes["layers"],
             int(torch.randint(0, 2**31, (1,), generator=generator)))
    x = torch.randn(BATCH, LENGTH, dim, generator=generator)
    y = torch.randn(BATCH, LENGTH, dim, generator=generator)
    return [(setup, x, y)]


def _gradients(model: torch.nn.Module) -> list[torch.Tensor | None]:
    return [p.grad for p in model.parameters()]


def run(candidate, setup: tuple, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Checkpoint the model with the learner's function, then one forward and backward
    (after one unmeasured). Returns, flat in float64, every parameter's gradient
    (NaN for one that has none); marks the activations forward left and how
    often each block ran in forward and in backward."""
    sentinel = freeze()
    model = make_model(*setup)
    sizes = [p.numel() for p in model.parameters()]
    returned = candidate(model)
    if isinstance(returned, torch.nn.Module):
        model = returned
    # A first step unmeasured: what the learner's code imports or caches on its first
    # call is not an activation.
    warm = model(x.clone())
    if not (isinstance(warm, torch.Tensor) and warm.requires_grad):
        record.mark("invalid", why=(
            "the model's output needs no gradient: every block is cut from the graph. The "
            "first block's input is the model's, data that needs no gradient, and an "
            "autograd Function none of whose inputs needs one is cut off, and every block "
            "after it with it. Make the input require grad (x.detach().requires_grad_())"))
        return torch.empty(0)
    F.mse_loss(warm, y).backward()
    del warm  # and the graph behind it, before anything is measured
    model.zero_grad(set_to_none=True)
    # How often each block's first layer runs in forward and in backward: a block that
    # is checkpointed runs again in backward.
    runs = {"forward": [0] * len(model.blocks), "backward": [0] * len(model.blocks)}
    phase = ["forward"]
    for index, block in enumerate(model.blocks):
        block.norm1.register_forward_pre_hook(
            lambda module, args, index=index: runs[phase[0]].__setitem__(
                index, runs[phase[0]][index] + 1))
    x = x.clone()  # data: it needs no gradient
    before = live("cpu").bytes
    output = model(x)
    record.mark("forward", activations=live("cpu").bytes - before,
                parameters=[p.numel() for p in model.parameters()] == sizes)
    phase[0] = "backward"
    F.mse_loss(output, y).backward()
    record.mark("after", frozen=refrozen(sentinel), runs=runs)
    return torch.cat([torch.full((n,), torch.nan, dtype=torch.float64) if g is None
                      else g.detach().reshape(-1).double()
                      for g, n in zip(_gradients(model), sizes, strict=True)])


def reference(setup: tuple, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of one process running the model as it was."""
    with one_cpu_thread():
        model = make_model(*setup)
        F.mse_loss(model(x), y).backward()
    return _gradients(model)


# A block: the CPU generator's state that torch.utils.checkpoint keeps (5,056 B), to replay
# dropout the same way.
RNG_STATE_BYTES = 8192


def activations_bound(case: Case) -> int:
    """The block inputs and the output, L + 1 tensors of b × s × h in fp32; for each
    block the random generator's state, which torch.utils.checkpoint keeps to replay
    dropout the same way; half a tensor of slack."""
    activation = BATCH * LENGTH * case.sizes["dim"] * 4
    layers = case.sizes["layers"]
    return (layers + 1) * activation + layers * RNG_STATE_BYTES + activation // 2


def _grade(case: Case, inputs: list[tuple], outputs: list[object],
           logs: list[record.RankLog]) -> CaseResult:
    log, output = logs[0], outputs[0]
    forged = forged_marks(log, ("forward", "after", "invalid"))
    if forged:
        return CaseResult(case, Comparison(False, cause=forged))
    invalid = next((m for m in log.marks if m.label == "invalid"), None)
    if invalid is not None:
        return CaseResult(case, Comparison(False, cause=invalid.data.get("why", "")))
    forward = next((m for m in log.marks if m.label == "forward"), None)
    if forward is None or not isinstance(output, torch.Tensor):
        return CaseResult(case, Comparison(False, cause="the forward and backward were cut "
                                           "short"))
    if any(m.label == "after" and m.data.get("frozen") for m in log.marks):
        return CaseResult(case, Comparison(False, cause=(
            "objects were frozen (gc.freeze), out of the grader's sight: leave the "
            "collector's generations alone")))
    if not forward.data.get("parameters"):
        return CaseResult(case, Comparison(False, cause=(
            "the model's parameters changed: checkpointing keeps the model as it is and "
            "changes only what its blocks save")))
    setup, x, y = inputs[0]
    want = reference(setup, x, y)
    sizes = [w.numel() for w in want]
    blocks = case.sizes["layers"]
    per_block = len(want) // blocks
    worst, offset = 0.0, 0
    for index, (right, size) in enumerate(zip(want, sizes, strict=True)):
        got = output[offset:offset + size].view(right.shape)
        offset += size
        block = index // per_block
        what = f"block {block}'s parameters"
        if torch.isnan(got).all():
            cause = (f"{what} got no gradient" + (
                ": that block's input is the model's, data that needs no gradient, and an "
                "autograd Function none of whose inputs needs one is cut from the graph. "
                "Make the input require grad (x.detach().requires_grad_())"
                if block == 0 else
                ": return the input's gradient from backward, or the blocks before it "
                "get none"))
            return CaseResult(case, Comparison(False, cause=cause))
        if not got.abs().max() and right.abs().max():
            return CaseResult(case, Comparison(False, cause=(
                f"{what} got a gradient of zeros: no gradient came back from the blocks "
                "after it. Return the input's gradient from backward")))
        error = float((got - right).abs().max()) / max(float(right.abs().max()), 1e-30)
        worst = max(worst, error if error == error else float("inf"))
        if not error <= RELATIVE:
            return CaseResult(case, Comparison(False, rel_error=worst, cause=(
                f"{what}: the gradient differs from the model's without checkpointing "
                f"({error:.1e} of its largest value): backward must run the same forward "
                "again, on the same input")))
    seen = Comparison(True, rel_error=worst)
    after = next((m for m in log.marks if m.label == "after"), None)
    runs = after.data.get("runs", {}) if after is not None else {}
    again = runs.get("backward", [])
    if len(again) != blocks or not all(isinstance(n, int) and n >= 1 for n in again):
        first = next((i for i, n in enumerate(again) if not n), 0)
        return CaseResult(case, seen, error=(
            f"block {first}'s layers did not run in backward (they ran {again} times "
            "there, block by block): checkpointing computes a block's forward a second "
            "time, from its saved input, in backward (and checkpoint_blocks checkpoints the "
            "model it is given, or returns the one to train)"))
    held, bound = forward.data.get("activations"), activations_bound(case)
    if not isinstance(held, int):
        return CaseResult(case, seen, error="the grader could not measure the activations")
    if held > bound:
        activation = BATCH * LENGTH * case.sizes["dim"] * 4
        return CaseResult(case, seen, error=(
            f"after forward {held:,} B of activations were alive ({held / activation:.1f} "
            f"tensors of b × s × h), more than the {bound:,} B that keeping each of the "
            f"{blocks} blocks' inputs and the output takes: run the block's forward under "
            "torch.no_grad() and save only its input"))
    return CaseResult(case, seen)


register(RanksProblem(
    id="fsdp/checkpoint",
    title="Activation checkpointing: recompute each block in backward",
    signature=("checkpoint_blocks(model: TinyTransformer) -> TinyTransformer: each block "
               "keeps only its input for backward and runs its forward again there"),
    make_inputs=_inputs,
    reference=reference,
    cost=lambda case: Cost(0, 0),
    cpu_cases=CASES,
    gpu_cases=CASES,
    grade=_grade,
    harness=run,
    preload=("rooflab.kernels.fsdp",),
    solution="rooflab.kernels.fsdp:checkpoint_blocks",
    time_limit_s=30.0,
    hints=("A torch.autograd.Function whose forward runs the block under torch.no_grad() "
           "and saves only its input; its backward runs the block again with autograd on, "
           "calls torch.autograd.backward(output, grad) (the parameters' gradients "
           "accumulate as usual) and returns the input's gradient. Replace each block's "
           "forward with one that applies it.",
           "forward: ctx.run = run; ctx.save_for_backward(x); with torch.no_grad(): return "
           "run(x). backward: x = x.detach().requires_grad_(); with torch.enable_grad(): "
           "out = ctx.run(x); torch.autograd.backward(out, grad); return None, x.grad. The "
           "model's input needs no gradient: make it require one, or block 0 is cut off."),
    answer_in=("Recomputed", "checkpoint_blocks"),
))
