"""fsdp/zero3, fsdp/prefetch and fsdp/plan against answers that pass a looser check:
memory kept between steps where the blocks' parameters do not show it, a collective the
contract does not list, a prefetch that overlaps nothing, a lookup table of the plan's
cases, and right plan answers held as float32, Fraction or numpy numbers."""

from __future__ import annotations

import dataclasses
import gc
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mutants import grade, mutant
from test_fsdp_grading import hooked_sharding
from torch import nn

from rooflab.autograder import get_problem
from rooflab.autograder.problems import fsdp as problems
from rooflab.kernels import fsdp


class _Unit:
    """ZeRO-3 for one block, written plainly: a fresh gathered vector on each gather,
    the parameters swapped between views of it and empty tensors."""

    def __init__(self, block: nn.Module, rank: int, world: int):
        self.params = list(block.parameters())
        self.shapes = [p.shape for p in self.params]
        self.world, self.done = world, 0
        self.numel = sum(p.numel() for p in self.params)
        self.chunk = -(-self.numel // world)
        self.shard = nn.Parameter(self.padded([p.detach() for p in self.params])
                                  [rank * self.chunk:(rank + 1) * self.chunk].clone())
        self.release()

    def padded(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return F.pad(flat, (0, self.chunk * self.world - self.numel))

    def fetch(self) -> None:
        if self.params[0].numel():
            return
        flat = torch.empty(self.chunk * self.world)
        dist.all_gather_into_tensor(flat, self.shard.detach())
        self.use(flat)

    def use(self, flat: torch.Tensor) -> None:
        offset = 0
        for p, shape in zip(self.params, self.shapes, strict=True):
            p.data = flat[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()

    def release(self) -> None:
        for p in self.params:
            p.data = torch.empty(0)

    def gradient(self) -> torch.Tensor:
        return self.padded([p.grad for p in self.params])

    def reduce(self) -> None:
        mine = torch.empty(self.chunk)
        dist.reduce_scatter_tensor(mine, self.gradient())
        self.shard.grad = mine / self.world
        for p in self.params:
            p.grad = None
        self.release()




class _KeepsTheWholeVector(_Unit):
    """Frees with p.data = torch.empty(0), and keeps the gathered vector."""

    def use(self, flat: torch.Tensor) -> None:
        self.flat = flat
        super().use(flat)


class _KeepsAGradientBuffer(_Unit):
    """Reduce-scatters from a full-size gradient buffer it keeps, one a block."""

    def gradient(self) -> torch.Tensor:
        self.buffer = getattr(self, "buffer", torch.zeros(self.chunk * self.world))
        self.buffer.copy_(super().gradient())
        return self.buffer


class _HidesTheWholeVector(_KeepsTheWholeVector):
    """Keeps the gathered vector, frozen out of the garbage collector's lists."""

    def use(self, flat: torch.Tensor) -> None:
        super().use(flat)
        gc.freeze()


_POOL = torch.zeros(0)  # made as this module loads: in the ranks, before the first step


class _KeepsVectorsInItsModule(_Unit):
    """Keeps every gathered vector in a tensor its module made when it was loaded, the
    storage grown as it goes."""

    def use(self, flat: torch.Tensor) -> None:
        start = _POOL.numel()
        _POOL.resize_(start + flat.numel())
        _POOL[start:].copy_(flat)
        super().use(flat)


def _keeps_a_graph(model):
    """Checks its sharding with a forward it keeps: autograd then keeps every block's
    gathered vector, saved for a backward that never comes."""
    shards = hooked_sharding(_Unit)(model)
    dim = model.blocks[0].norm1.normalized_shape[0]
    model.probe = model(torch.zeros(1, 1, dim))
    return shards


def _cases_of(problem: str, candidates: dict[str, object]):
    """The problem on one case per candidate, three ranks and blocks that need padding,
    told apart by their number of blocks (2, 3, ...), and one candidate that is each of
    them on its own case: every case is graded alone, in one launch of the ranks."""
    cases = [problems.rank_case(3, dim=20, layers=2 + i, note=name)
             for i, name in enumerate(candidates)]
    by_layers = {2 + i: fn for i, fn in enumerate(candidates.values())}

    def shard_layers(model, **prefetch):
        return by_layers[len(model.blocks)](model, **prefetch)

    return dataclasses.replace(get_problem(problem), cpu_cases=cases, gpu_cases=cases), \
        shard_layers


def _verdicts(problem: str, candidates: dict[str, object]) -> dict[str, str]:
    """Each candidate's verdict on its own case: "" where it passes, else why not."""
    spec, shard_layers = _cases_of(problem, candidates)
    result = grade(spec, shard_layers)
    assert len(result.cases) == len(candidates), result.causes
    return {case.case.note: "" if case.ok else case.explained for case in result.cases}


ALL_REDUCE_BESIDE = ("        dist.reduce_scatter_tensor(mine, flat)\n",
                     "        dist.reduce_scatter_tensor(mine, flat)\n"
                     "        dist.all_reduce(flat)\n")
OVER = "B over the"  # memory_cause: how many bytes over, and the bound


def test_memory_kept_between_steps_and_a_collective_beside_the_contract_fail_named(
        tmp_path):
    verdicts = _verdicts("fsdp/zero3", {
        "plain": hooked_sharding(_Unit),
        "the whole vector kept": hooked_sharding(_KeepsTheWholeVector),
        "a gradient buffer kept": hooked_sharding(_KeepsAGradientBuffer),
        "a graph kept": _keeps_a_graph,
        "kept in a tensor its module made": hooked_sharding(_KeepsVectorsInItsModule),
        "an all-reduce beside": mutant(tmp_path, "fsdp", ALL_REDUCE_BESIDE).shard_layers,
        "frozen out of sight": hooked_sharding(_HidesTheWholeVector),
    })
    assert verdicts.pop("plain") == ""
    frozen = verdicts.pop("frozen out of sight")
    assert "objects were frozen (gc.freeze)" in frozen, frozen
    beside = verdicts.pop("an all-reduce beside")
    assert "backward called all_reduce" in beside and "nothing else" in beside, beside
    for name, verdict in verdicts.items():
        assert OVER in verdict and "one rank may hold between steps" in verdict, \
            (name, verdict)


# --- prefetch: the next block's all-gather overlaps this block's compute -------------------

ISSUED = "                units[index + 1].gather(async_op=True)\n"
WAITS_AT_ONCE_FORWARD = (ISSUED, ISSUED + "                units[index + 1].wait()\n")
WAITS_AT_ONCE_BACKWARD = ("                units[index - 1].gather(async_op=True)\n",
                          "                units[index - 1].gather(async_op=True)\n"
                          "                units[index - 1].wait()\n")
# Waits at once on the handle, then again (a no-op) where the course waits.
WAITS_TWICE = (ISSUED, ISSUED + "                units[index + 1].gathering.wait()\n")


def test_a_prefetch_waited_for_in_the_hook_that_issues_it_fails(tmp_path):
    # (The course's prefetch, which waits when the next block begins, passes:
    # test_fsdp_grading.py grades it on 21 seeds.)
    verdicts = _verdicts("fsdp/prefetch", {
        "forward": mutant(tmp_path, "fsdp", WAITS_AT_ONCE_FORWARD, name="at_once").shard_layers,
        "backward": mutant(tmp_path, "fsdp", WAITS_AT_ONCE_BACKWARD, name="back").shard_layers,
        "forward, waited for twice": mutant(tmp_path, "fsdp", WAITS_TWICE,
                                            name="twice").shard_layers,
    })
    for name, verdict in verdicts.items():
        phase = name.split(",")[0]
        assert "overlapped nothing" in verdict and f"began its {phase}" in verdict, verdict


# --- fsdp/plan -----------------------------------------------------------------------------

SEEDS = range(20)


def _plan_table():
    """What a lookup table of the plan's fixed cases knows: their answers, by input."""
    spec = get_problem("fsdp/plan")
    table = {}
    for seed in SEEDS:
        for index, case in enumerate(spec.cpu_cases):
            inputs = spec.make_inputs(case, torch.Generator().manual_seed(seed + index), None)
            if case.note != problems.DRAWN:
                table[inputs] = fsdp.sharding_plan(*inputs)
    return table


def test_a_lookup_table_of_the_plan_cases_fails_for_every_seed():
    table = _plan_table()

    def looked_up(params, nodes, gpus, hybrid):
        return table.get((params, nodes, gpus, hybrid), next(iter(table.values())))

    for seed in SEEDS:
        result = grade("fsdp/plan", looked_up, seed=seed)
        assert not result.passed, seed
        assert problems.DRAWN in result.causes[0], result.causes


def _float32(params, nodes, gpus, hybrid):
    return tuple(np.float32(v) for v in fsdp.sharding_plan(params, nodes, gpus, hybrid))


def _fractions(params, nodes, gpus, hybrid):
    p = Fraction(params)
    held = 16 * p / (gpus if hybrid else nodes * gpus)
    network = (2 if hybrid else 3) * Fraction(nodes - 1, nodes) * 2 * p / gpus
    return held, 3 * Fraction(gpus - 1, gpus) * 2 * p, network


@pytest.mark.parametrize("answer", [_float32, _fractions], ids=["numpy float32", "Fraction"])
def test_right_plan_answers_of_any_number_type_pass_for_every_seed(answer):
    for seed in SEEDS:
        result = grade("fsdp/plan", answer, seed=seed)
        assert result.passed, (seed, result.causes)


def test_a_plan_answer_off_by_a_little_more_than_rounding_fails_showing_the_difference():
    def slightly_off(params, nodes, gpus, hybrid):
        return tuple(v * (1 + 2e-6) for v in fsdp.sharding_plan(params, nodes, gpus, hybrid))

    for seed in SEEDS:
        result = grade("fsdp/plan", slightly_off, seed=seed)
        assert not result.passed, seed
        shown = re.findall(r"(?:held|NVLink|network) (\S+?), expected (\S+?)(?:;|$)",
                           result.causes[0])
        assert shown and all(got != want for got, want in shown), result.causes[0]

