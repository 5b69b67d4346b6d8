"""Lab 09's worked code and its counting exercise: data parallelism by hand gives one
process's gradients with the all-reduces it promises; fsdp/plan passes the course's
counts and names the classic miscounts; memory_held counts storages, not tensors."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mutants import grade

from rooflab.autograder.ranks import on_ranks
from rooflab.kernels import fsdp

DIM, LAYERS, BATCH = 16, 2, 2


def _batch(rank: int, world: int):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(world * BATCH, 4, DIM, generator=generator)
    y = torch.randn(world * BATCH, 4, DIM, generator=generator)
    return x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH]


def _model():
    torch.manual_seed(0)
    return fsdp.TinyTransformer(DIM, 4, LAYERS)


def _data_parallel_gradients(bucketed: bool) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model()
    buckets = fsdp.DataParallel(model, bucket_bytes=4_000) if bucketed else None
    x, y = _batch(rank, world)
    F.mse_loss(model(x), y).backward()
    issued = len(buckets.pending) if buckets else 0
    if buckets:
        buckets.finish()
    else:
        fsdp.average_gradients(model)
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()] +
                     [torch.tensor([float(issued)])])


def _both_ways() -> torch.Tensor:
    return torch.stack([_data_parallel_gradients(False), _data_parallel_gradients(True)])


def test_data_parallel_gives_one_process_gradients_with_the_promised_all_reduces():
    world = 3
    runs = on_ranks(_both_ways, world)  # per tensor, then buckets, on the same ranks
    one = _model()
    x = torch.cat([_batch(r, world)[0] for r in range(world)])
    y = torch.cat([_batch(r, world)[1] for r in range(world)])
    F.mse_loss(one(x), y).backward()
    want = torch.cat([p.grad.reshape(-1) for p in one.parameters()])
    for run in runs:
        assert torch.equal(run.output, runs[0].output)  # every rank steps the same way
        for way in range(2):
            torch.testing.assert_close(run.output[way, :-1], want, rtol=1e-5, atol=1e-6)
    parameters = list(one.parameters())
    reduces = [call for call in runs[0].log.calls if call.op == "all_reduce"]
    per_tensor, bucketed = reduces[:len(parameters)], reduces[len(parameters):]
    numel = sum(p.numel() for p in parameters)
    assert [call.elements for call in per_tensor] == [p.numel() for p in parameters]
    assert sum(call.elements for call in bucketed) == numel
    # Buckets of 4 kB over the parameters in backward's order: the greedy split, each
    # sent from the hook of its last gradient, all of them before backward returned.
    counts, size = 1, 0
    for p in reversed(parameters):
        if size >= 4_000:
            counts, size = counts + 1, 0
        size += p.numel() * 4
    assert 1 < len(bucketed) == counts == int(runs[0].output[1, -1])


def test_the_course_plan_passes_and_classic_miscounts_are_named():
    assert grade("fsdp/plan", fsdp.sharding_plan).passed

    def hsdp_sharded_everywhere(params, nodes, gpus, hybrid):
        held, within, across = fsdp.sharding_plan(params, nodes, gpus, hybrid)
        return (16 * params / (nodes * gpus), within, across)

    def twelve_bytes(params, nodes, gpus, hybrid):
        held, within, across = fsdp.sharding_plan(params, nodes, gpus, hybrid)
        return (held * 12 / 16, within, across)

    def whole_gradient_across(params, nodes, gpus, hybrid):
        held, within, across = fsdp.sharding_plan(params, nodes, gpus, hybrid)
        return (held, within, across * gpus if hybrid else across)

    def one_flat_ring(params, nodes, gpus, hybrid):
        held, within, across = fsdp.sharding_plan(params, nodes, gpus, hybrid)
        everyone = nodes * gpus
        return (held, within, across if hybrid else 3 * (everyone - 1) / everyone * 2 * params)

    for wrong, words in ((hsdp_sharded_everywhere, "16Ψ/g, not 16Ψ/G"),
                         (twelve_bytes, "12 bytes a parameter"),
                         (whole_gradient_across, "not the whole gradient"),
                         (one_flat_ring, "run in two levels")):
        result = grade("fsdp/plan", wrong)
        assert not result.passed, wrong.__name__
        assert words in " ".join(result.causes), result.causes


def test_memory_held_counts_each_storage_once_and_a_freed_one_as_nothing():
    whole = torch.zeros(100)
    views = [whole[:50], whole[50:], whole]
    assert fsdp.bytes_held(views) == 400
    assert fsdp.bytes_held([whole, torch.zeros(10)]) == 440
    whole.untyped_storage().resize_(0)
    assert fsdp.bytes_held(views) == 0


def test_the_sharding_runs_unchanged_under_torchrun():
    """Outside the grader, as on a multi-GPU machine (NCCL there, gloo here): each step's
    loss, and the bytes a rank holds equal to 16Ψ/N."""
    environment = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"} if sys.platform == "linux" \
        else dict(os.environ)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "rooflab.kernels.fsdp", "--dim", "32",
                           "--layers", "2", "--heads", "4", "--length", "8", "--steps", "3",
                           "--prefetch"], capture_output=True, text=True, timeout=300,
                          env=environment)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = re.findall(r"step \d: loss ([\d.]+), .* ([\d,]+) B held a rank, 16Ψ/N = ([\d,]+) B",
                       done.stdout)
    assert len(steps) == 3, done.stdout
    assert all(held == formula for _, held, formula in steps)
    assert float(steps[-1][0]) < float(steps[0][0])  # it trains
    assert "2 ranks on gloo, 2 blocks of width 32, prefetch on" in done.stdout
