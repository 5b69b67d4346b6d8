"""fsdp/checkpoint: PyTorch's own checkpoint passes; each classic slip fails with its cause
named; a graph kept whole out of the measure's sight is no checkpoint. The course's own
solution runs in test_solutions.py; slips run on the first case only."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from mutants import grade, mutant

from rooflab.autograder import get_problem
from rooflab.autograder.evidence.live_memory import live


def first_case():
    spec = get_problem("fsdp/checkpoint")
    return dataclasses.replace(spec, cpu_cases=spec.cpu_cases[:1],
                               gpu_cases=spec.cpu_cases[:1])


def causes(result) -> str:
    return " | ".join(case.explained for case in result.cases if not case.ok)


def torch_checkpoint(model):
    """torch.utils.checkpoint as PyTorch recommends it (not reentrant): its saved tensors
    are packed by hooks, which the grader reads without running them."""
    import functools

    from torch.utils.checkpoint import checkpoint

    for block in model.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return model


def test_pytorchs_checkpoint_passes():
    result = grade(first_case(), torch_checkpoint)
    assert result.passed, causes(result)


def reentrant_checkpoint(model):
    import functools

    from torch.utils.checkpoint import checkpoint

    for block in model.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=True)
    return model


def test_the_reentrant_checkpoint_on_data_cuts_block_0_off_and_is_named():
    """PyTorch's own pitfall: with use_reentrant=True and an input that needs no gradient,
    the first block is cut from the graph, and every block after it."""
    result = grade(first_case(), reentrant_checkpoint)
    assert "the model's output needs no gradient: every block is cut from the graph" in \
        causes(result), causes(result)


def hidden_graph(model):
    """No recomputation: each block's whole graph kept on the Function's context, where
    no saved-tensor list shows it."""
    import torch

    class Hide(torch.autograd.Function):
        @staticmethod
        def forward(ctx, run, x):
            with torch.enable_grad():
                inner = x.detach().requires_grad_()
                ctx.inner, ctx.out = inner, run(inner)
            return ctx.out.detach()

        @staticmethod
        def backward(ctx, grad):
            torch.autograd.backward(ctx.out, grad)
            return None, ctx.inner.grad

    for block in model.blocks:
        run = block.forward
        block.forward = lambda x, run=run: Hide.apply(
            run, x if x.requires_grad else x.detach().requires_grad_())
    return model


def test_a_graph_kept_whole_out_of_sight_is_no_checkpoint():
    result = grade(first_case(), hidden_graph)
    assert "layers did not run in backward" in causes(result), causes(result)


SLIPS = [
    ("the input's gradient not returned", (("        return None, x.grad\n",
                                            "        return None, None\n"),),
     "block 0's parameters got a gradient of zeros"),
]


@pytest.mark.parametrize("name, edits, words", SLIPS, ids=[s[0] for s in SLIPS])
def test_each_classic_slip_fails_and_is_named(tmp_path, name, edits, words):
    module = mutant(tmp_path, "fsdp", *edits)
    result = grade(first_case(), module.checkpoint_blocks)
    assert not result.passed
    assert words in causes(result), causes(result)


def test_saving_everything_fails_on_the_activations(tmp_path):
    """A checkpoint that saves its forward's graph as well as recomputing: right gradients,
    the memory of no checkpoint."""
    module = mutant(tmp_path, "fsdp", (
        "        with torch.no_grad():  # no graph: its activations are freed as they are "
        "used\n            return run(x)\n",
        "        with torch.enable_grad():\n            ctx.kept = run(x.detach()"
        ".requires_grad_())\n            ctx.save_for_backward(x, ctx.kept)\n"
        "        with torch.no_grad():\n            return run(x)\n"),
        ("        (x,) = ctx.saved_tensors\n", "        x, _ = ctx.saved_tensors\n"))
    result = grade(first_case(), module.checkpoint_blocks)
    assert "of activations were alive" in causes(result), causes(result)


def test_packed_saved_tensors_are_counted_without_running_their_unpack_hook():
    unpacked = []

    def pack(tensor):
        return ("kept", tensor.clone())

    def unpack(packed):
        unpacked.append(1)
        return packed[1]

    x = torch.randn(64, 64, requires_grad=True)
    before = live().bytes
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = torch.sin(x)
    held = live().bytes - before
    assert unpacked == []
    assert held >= 2 * 64 * 64 * 4  # y, and the packed copy of x
    y.sum().backward()
    assert unpacked == [1]


def test_what_hooks_pack_into_bytes_is_counted_too():
    """A pack hook that hides the saved tensor in a byte string: the bytes are alive, and
    counted."""
    x = torch.randn(64, 64, requires_grad=True)
    before = live().bytes
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: {"blob": t.detach().numpy().tobytes()},
            lambda packed: torch.frombuffer(bytearray(packed["blob"]),
                                            dtype=torch.float32).view(64, 64)):
        y = torch.sin(x)
    assert live().bytes - before >= 2 * 64 * 64 * 4  # y, and the bytes of x
    y.sum().backward()


# --- activations kept out of the memory count's old sight --------------------------------

def _kept_elsewhere(pack, unpack):
    """No checkpoint: each block's activations are kept, packed by ``pack`` and read back
    by ``unpack``; the block runs again in backward (under no_grad, for show), so the layers
    do run there."""
    def checkpoint_blocks(model):
        for block in model.blocks:
            run = block.forward

            def forward(x, run=run):
                with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                    out = run(x)
                if out.requires_grad:
                    seen = x.detach()

                    def again(grad, seen=seen, run=run):
                        with torch.no_grad():
                            run(seen)
                    out.register_hook(again)
                return out

            block.forward = forward
        return model
    return checkpoint_blocks


def _to_storage(tensor):
    kept = tensor.detach().clone(memory_format=torch.contiguous_format)
    return kept.untyped_storage(), kept.dtype, kept.shape


def _from_storage(packed):
    storage, dtype, shape = packed
    return torch.tensor([], dtype=dtype).set_(storage).view(shape)


def _to_disk(tensor):
    import tempfile

    path = tempfile.mktemp(suffix=".pt")
    torch.save(tensor.detach().clone(), path)
    return path


KEPT_ELSEWHERE = [
    ("as bare storages", _to_storage, _from_storage, "of activations were alive"),
    ("on disk", _to_disk, torch.load, "a file written during this check"),
]


@pytest.mark.parametrize("name, pack, unpack, words", KEPT_ELSEWHERE,
                         ids=[k[0] for k in KEPT_ELSEWHERE])
def test_activations_kept_outside_tensors_are_no_checkpoint(name, pack, unpack, words):
    result = grade(first_case(), _kept_elsewhere(pack, unpack))
    assert not result.passed
    assert words in causes(result), causes(result)


def test_a_byte_stream_and_a_bare_storage_are_counted():
    """What a hook can keep a tensor's values in, besides a tensor: both are alive, and
    counted (neither was)."""
    import io

    before = live().bytes
    kept = [io.BytesIO(torch.randn(128, 128).numpy().tobytes()),
            torch.randn(128, 128).untyped_storage()]
    assert live().bytes - before >= 2 * 128 * 128 * 4
    kept[0].close()
    assert live().bytes - before < 2 * 128 * 128 * 4
