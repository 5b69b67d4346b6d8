"""fsdp/zero3 and fsdp/prefetch: the course's sharding and one written another way pass;
each classic slip fails, named. Every check runs real gloo ranks, so each test grades the
one case that shows its bug (three ranks, shards that need padding)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mutants import grade, mutant, only
from torch import nn

from rooflab.autograder import check, get_problem
from rooflab.autograder.checking.rank_check import recheck_ranks
from rooflab.autograder.problems import fsdp as problems
from rooflab.kernels import fsdp

PADDED = "the shards need padding"


def _one_case(problem: str):
    return only(problem, PADDED)


def _mutant(tmp_path, *edits):
    return mutant(tmp_path, "fsdp", *edits)


def _seeds(problem: str, copies: int):
    """Every case of the problem, ``copies`` times: each copy gets its own seed (check
    draws case i's inputs and weights from seed + i), all in one launch of the ranks."""
    spec = get_problem(problem)
    cases = list(spec.cpu_cases) * copies
    return dataclasses.replace(spec, cpu_cases=cases, gpu_cases=cases)


def _graded_with_room(problem: str, shard_layers, copies: int):
    """The check on ``copies`` seeds of every case, and the same runs judged again with no
    slack in the memory bound: the rank's shards, their gradients and AdamW's state only
    ("" where every case still passes)."""
    spec = _seeds(problem, copies)
    result = check(spec, shard_layers, show=False, raise_on_failure=False, measure=False,
                   keep_outputs=True)
    tight = dataclasses.replace(spec, grade=problems._grade(problem == "fsdp/prefetch",
                                                            slack_blocks=0))
    return result, recheck_ranks(tight, result.outputs, result.seed)


def test_the_course_solution_passes_far_inside_the_bar_for_21_seeds():
    # Every case on 2, 3 and 4 ranks, 7 seeds each: one process and the ranks agree far
    # inside the bar, so the bar is not loose; between steps each rank holds no more
    # than its shards, so the gathered blocks of slack are room to spare.
    result, without_slack = _graded_with_room("fsdp/prefetch", fsdp.shard_layers, 7)
    assert result.passed, result.causes
    assert len(result.cases) == 21
    assert max(case.comparison.rel_error for case in result.cases) < problems.RELATIVE / 5
    assert without_slack == "", without_slack


class _SwappedShard:
    """ZeRO-3 that frees by rebinding: each parameter's .data is swapped between an empty
    tensor and a view of a fresh list-form all-gather, and the gradients are
    reduce-scattered from a list of chunks. The parameters' own storages are empty between
    uses, but the tensors autograd saves in forward (views of the weights) keep each
    gathered vector alive until backward: every block is whole at the end of forward."""

    def __init__(self, block: nn.Module, rank: int, world: int):
        self.params = list(block.parameters())
        self.world, self.rank = world, rank
        self.numel = sum(p.numel() for p in self.params)
        self.chunk = -(-self.numel // world)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        flat = F.pad(flat, (0, self.chunk * world - self.numel))
        self.shard = nn.Parameter(flat.chunk(world)[rank].clone())
        self.done = 0
        self.release()

    def fetch(self) -> None:
        if self.params[0].numel():
            return
        parts = [torch.empty(self.chunk) for _ in range(self.world)]
        dist.all_gather(parts, self.shard.detach())
        flat, offset = torch.cat(parts), 0
        for p, shape in zip(self.params, self.shapes, strict=True):
            p.data = flat[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()

    def release(self) -> None:
        self.shapes = getattr(self, "shapes", [p.shape for p in self.params])
        for p in self.params:
            p.data = torch.empty(0)

    def reduce(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        flat = F.pad(flat, (0, self.chunk * self.world - self.numel))
        mine = torch.empty(self.chunk)
        dist.reduce_scatter(mine, list(flat.chunk(self.world)))
        self.shard.grad = mine / self.world
        for p in self.params:
            p.grad = None
        self.release()


class _RefilledShard(_SwappedShard):
    """ZeRO-3 written another way, correctly: a list-form all-gather copied into one flat
    vector per block, whose storage is given back after each use and refilled, so what
    autograd saved in forward holds nothing between; gradients reduce-scattered from a
    list of chunks."""

    def __init__(self, block: nn.Module, rank: int, world: int):
        params = list(block.parameters())
        self.flat = torch.empty(-(-sum(p.numel() for p in params) // world) * world)
        offset = 0
        for p in params:
            values = p.detach().reshape(-1).clone()
            p.data = self.flat[offset:offset + p.numel()].view_as(p)
            p.data.reshape(-1).copy_(values)
            offset += p.numel()
        super().__init__(block, rank, world)

    def fetch(self) -> None:
        if self.flat.untyped_storage().nbytes():
            return
        parts = [torch.empty(self.chunk) for _ in range(self.world)]
        dist.all_gather(parts, self.shard.detach())
        self.flat.untyped_storage().resize_(self.flat.numel() * self.flat.element_size())
        self.flat.copy_(torch.cat(parts))

    def release(self) -> None:
        self.flat.untyped_storage().resize_(0)


def hooked_sharding(unit_class):
    """shard_layers with one ``unit_class`` (fetch, release, reduce) per block, driven by
    module hooks as FSDP2 drives its units."""
    def shard_layers(model):
        units = [unit_class(b, dist.get_rank(), dist.get_world_size()) for b in model.blocks]
        for block, unit in zip(model.blocks, units, strict=True):
            block.register_forward_pre_hook(lambda m, a, u=unit: u.fetch())
            block.register_forward_hook(lambda m, a, o, u=unit: u.release())
            block.register_full_backward_pre_hook(lambda m, g, u=unit: u.fetch())

            def ready(p, u=unit):
                u.done += 1
                if u.done == len(u.params):
                    u.done = 0
                    u.reduce()
            for p in unit.params:
                p.register_post_accumulate_grad_hook(ready)
        return [unit.shard for unit in units]
    return shard_layers


swapped_shard_layers = hooked_sharding(_SwappedShard)
refilled_shard_layers = hooked_sharding(_RefilledShard)


def test_zero3_written_another_way_passes_every_case_for_21_seeds():
    result, without_slack = _graded_with_room("fsdp/zero3", refilled_shard_layers, 7)
    assert result.passed, result.causes
    assert len(result.cases) == 21
    assert without_slack == "", without_slack


def test_weights_freed_by_rebinding_data_fail_on_what_the_forward_kept_for_21_seeds():
    """Counted by the parameters' own storages, every block is sharded after its forward;
    counted by the storages alive, the forward's graph still holds each gathered vector."""
    result = check(_seeds("fsdp/zero3", 7), swapped_shard_layers, show=False,
                   raise_on_failure=False, measure=False)
    assert len(result.cases) == 21 and not any(case.ok for case in result.cases)
    for case in result.cases:
        assert "as its forward ended the rank held" in case.summary, case.summary
        assert "beyond the activations the model saves for backward" in case.summary
        assert "rebinding .data to a new tensor leaves the old one alive" in case.summary


NO_FREE = ("    def after_forward(index: int):\n        def hook(module, args, output):\n"
           "            units[index].free()\n",
           "    def after_forward(index: int):\n        def hook(module, args, output):\n"
           "            pass\n")
SUMMED = ("        mine /= self.world  # the mean: gloo had no ReduceOp.AVG before torch 2.7\n", "")
ALL_REDUCED = ("        dist.reduce_scatter_tensor(mine, flat)\n",
               "        dist.all_reduce(flat)\n"
               "        mine.copy_(flat.chunk(self.world)[dist.get_rank()])\n")
STALE = ("        sent = self.shard.detach().to(self.full.dtype)\n",
         "        self.initial = getattr(self, 'initial', self.shard.detach().clone())\n"
         "        sent = self.initial\n")
ONE_TOO_MANY = ("        self.shard_numel = math.ceil(self.numel / world)\n",
            "        self.shard_numel = math.ceil(self.numel / world) + 1\n")
BLOCKING_PREFETCH = ("                units[index + 1].gather(async_op=True)\n",
                     "                units[index + 1].gather()\n")
NO_PREFETCH = ("            if prefetch and index + 1 < len(units):\n",
               "            if False:\n")
NO_BACKWARD_PREFETCH = ("            if prefetch and index > 0:\n", "            if False:\n")
GRADIENTS_KEPT = ("            p.grad = None\n", "            p.grad.zero_()\n")
# Not freed after backward: the next step's gather, which skips a block already whole,
# leaves the weights of before the update.
NOT_FREED_AFTER_BACKWARD = ("            p.grad = None\n        self.free()\n",
                            "            p.grad = None\n")
NO_GATHER_FOR_BACKWARD = ("            units[index].gather()\n", "            pass\n")

SLIPS = [
    ("not freed after forward", "fsdp/zero3", [NO_FREE], "blocks were whole at once"),
    ("summed, not averaged", "fsdp/zero3", [SUMMED], "times too large"),
    ("all-reduced gradients", "fsdp/zero3", [ALL_REDUCED], "all-reduced the gradients"),
    ("stale weights", "fsdp/zero3", [STALE], "do not reach the weights"),
    ("a shard too large", "fsdp/zero3", [ONE_TOO_MANY], "each holds ⌈"),
    ("prefetch that blocks", "fsdp/prefetch", [BLOCKING_PREFETCH], "asynchronously"),
    ("no prefetch", "fsdp/prefetch", [NO_PREFETCH], "began its forward"),
    ("no prefetch in backward", "fsdp/prefetch", [NO_BACKWARD_PREFETCH],
     "began its backward"),
    ("whole gradients kept", "fsdp/zero3", [GRADIENTS_KEPT], "whole weights or gradients"),
    ("not freed after backward", "fsdp/zero3", [NOT_FREED_AFTER_BACKWARD],
     "backward rank 0 still held 3 blocks whole: their next forward computed with the "
     "weights of before the optimizer's step"),
    ("no gather before backward", "fsdp/zero3", [NO_GATHER_FOR_BACKWARD],
     "block 2's backward ran with its weights freed"),
]


@pytest.mark.parametrize("name, problem, edits, words", SLIPS, ids=[s[0] for s in SLIPS])
def test_each_classic_slip_fails_and_is_named(tmp_path, name, problem, edits, words):
    broken = _mutant(tmp_path, *edits)
    result = grade(_one_case(problem), broken.shard_layers)
    assert not result.passed
    assert words in " ".join(result.causes), result.causes


def test_a_shard_count_that_is_not_one_a_block_is_named():
    def one_shard(model):
        fsdp.shard_layers(model)
        return [nn.Parameter(torch.zeros(1))]
    result = grade(_one_case("fsdp/zero3"), one_shard)
    assert not result.passed
    assert "1 shards for 3 blocks" in result.causes[0], result.causes


def test_the_reference_is_one_process_and_the_bytes_follow_the_formula():
    case = get_problem("fsdp/zero3").cpu_cases[1]
    n, dim, layers = case.sizes["ranks"], case.sizes["dim"], case.sizes["layers"]
    sizes = problems.block_sizes(problems.make_model(dim, 4, layers, seed=3))
    assert sizes == [12 * dim * dim + 13 * dim] * layers
    assert any(size % n for size in sizes), "this case is meant to need padding"
    padded = sum(n * math.ceil(size / n) for size in sizes)
    assert problems.cost(case).bytes == pytest.approx(3 * (n - 1) / n * padded * 4 * 5)
    # The reference trains one model: its first loss is that model's on the whole batch.
    inputs = problems.inputs_maker(False)(case, torch.Generator().manual_seed(0), None)
    want = problems.reference(inputs[0][0], [i[1] for i in inputs], [i[2] for i in inputs])
    model = problems.make_model(dim, 4, layers, seed=inputs[0][0][3])
    whole_x = torch.cat([i[1][0] for i in inputs])
    whole_y = torch.cat([i[2][0] for i in inputs])
    assert float(want[0, 0]) == pytest.approx(fsdp.loss_fn(model, whole_x, whole_y).item(),
                                              rel=1e-6)
