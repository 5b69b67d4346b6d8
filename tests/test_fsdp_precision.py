"""fsdp/precision: FSDP2's own fully_shard with MixedPrecisionPolicy, the course's sharding
and one written another way pass, over 20 seeds between them; each classic slip fails
with its cause named, from the bytes and dtypes the ranks' records show where they show
it. Every candidate runs on its own cases, all in one launch of the ranks (each launch
costs seconds): the cases are told apart by their number of blocks and of heads."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist
from mutants import grade, mutant
from test_fsdp_cheats import _Unit
from test_fsdp_grading import hooked_sharding

from rooflab.autograder import get_problem
from rooflab.autograder.problems import fsdp_precision as problem
from rooflab.kernels import fsdp

PROBLEM = "fsdp/precision"


def fsdp2(model, param_dtype, reduce_dtype):
    """PyTorch's FSDP2: each block a unit, then the root, under the policy."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return list(model.parameters())


class _ListUnit(_Unit):
    """The policy written another way, on test_fsdp_cheats's plain unit: a list-form
    all-gather of the bf16 shards, the parameters' .data swapped between views of it and
    empty tensors; the fp32 gradients reduce-scattered from a list of chunks with
    ReduceOp.AVG."""

    param_dtype, reduce_dtype = torch.bfloat16, torch.float32

    def fetch(self) -> None:
        if self.params[0].numel():
            return
        parts = [torch.empty(self.chunk, dtype=self.param_dtype) for _ in range(self.world)]
        dist.all_gather(parts, self.shard.detach().to(self.param_dtype))
        self.use(torch.cat(parts))

    def reduce(self) -> None:
        mine = torch.empty(self.chunk, dtype=self.reduce_dtype)
        chunks = list(self.gradient().to(self.reduce_dtype).chunk(self.world))
        dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.AVG)
        self.shard.grad = mine.to(self.shard.dtype)
        for p in self.params:
            p.grad = None
        self.release()


def list_sharding(model, param_dtype, reduce_dtype):
    """Units driven by module hooks, as FSDP2 drives its own; the model's input cast once,
    at the root, as FSDP2 casts it."""
    unit = type("PolicyUnit", (_ListUnit,), {"param_dtype": param_dtype,
                                             "reduce_dtype": reduce_dtype})
    model.register_forward_pre_hook(lambda m, args: tuple(a.to(param_dtype) for a in args))
    return hooked_sharding(unit)(model)


# --- the slips, each a few lines of the course's kernel changed -------------------------------

SENT = ("        sent = self.shard.detach().to(self.full.dtype)\n"
        "        # full or full.data alike: each parameter keeps its own version counter.\n"
        "        self.gathering = dist.all_gather_into_tensor(self.full.data, sent, "
        "async_op=async_op)\n")
# All-gathers the fp32 shards, then casts the whole vector to bf16: right numbers, twice
# the bytes.
GATHERED_FP32 = (SENT, "        whole = torch.empty(self.full.numel(), dtype=self.shard.dtype)\n"
                       "        dist.all_gather_into_tensor(whole, self.shard.detach())\n"
                       "        self.full.data.copy_(whole)\n"
                       "        self.gathering = None\n")
FULL = "            self.full = torch.empty_like(padded, dtype=param_dtype or padded.dtype)\n"
NO_INPUT_CAST = ("            if param_dtype is not None:  # the block's input, in its weights' "
                 "dtype\n", "            if False:\n")
# param_dtype ignored: gathers, computes and reduces in fp32.
COMPUTED_FP32 = [(FULL, "            self.full = torch.empty_like(padded)\n"), NO_INPUT_CAST]
# Gathers bf16, then casts the gathered weights back to fp32 to compute with.
CAST_BACK = [(FULL, "            self.full = torch.empty_like(padded)\n"
                    "            self.param_dtype = param_dtype\n"),
             (SENT, "        whole = torch.empty(self.full.numel(), dtype=self.param_dtype)\n"
                    "        dist.all_gather_into_tensor(whole, self.shard.detach()"
                    ".to(self.param_dtype))\n"
                    "        self.full.data.copy_(whole)\n"
                    "        self.gathering = None\n"),
             NO_INPUT_CAST]
# Reduce-scatters the bf16 gradients as backward made them.
REDUCED_BF16 = [("            self.reduce_dtype = reduce_dtype or self.full.dtype\n",
                 "            self.reduce_dtype = self.full.dtype\n")]
# The shard, the optimizer's parameter, in bf16: no fp32 master.
BF16_MASTER = [("            self.shard = nn.Parameter(padded[rank * self.shard_numel:]"
                "[:self.shard_numel].clone())\n",
                "            self.shard = nn.Parameter(padded[rank * self.shard_numel:]"
                "[:self.shard_numel].clone().to(param_dtype or padded.dtype))\n")]
SUMMED = [("        mine /= self.world  # the mean: gloo had no ReduceOp.AVG before "
           "torch 2.7\n", "")]
NOT_FREED = [("    def after_forward(index: int):\n        def hook(module, args, output):\n"
              "            units[index].free()\n",
              "    def after_forward(index: int):\n        def hook(module, args, output):\n"
              "            pass\n")]
# Never freed after forward either, its parameters made to look like DTensors (FSDP2's
# shards): whole is whole, whatever a tensor claims.
DISGUISED = [(NOT_FREED[0][0],
              "    def after_forward(index: int):\n        def hook(module, args, output):\n"
              "            for p in module.parameters():\n"
              "                p.to_local = None\n")]

# name: (edits, blocks, heads, words the cause must hold)
SLIPS = {
    "gathered fp32": ([GATHERED_FP32], 2, 1, "Gathered float32: the policy gathers bf16"),
    "computed in fp32": (COMPUTED_FP32, 2, 6, "Gathered float32: the policy gathers bf16"),
    "gathered bf16, cast back to fp32": (CAST_BACK, 2, 8,
                                         "computed with float32 weights"),
    "reduced in bf16": (REDUCED_BF16, 2, 12, "Gradients reduce-scattered in bfloat16: "
                        "summing 2 bfloat16 gradients loses bits, the policy reduces in fp32"),
    "bf16 master weights": (BF16_MASTER, 2, 24, "the parameters returned for the optimizer "
                            "are bfloat16: the policy keeps them, the master weights, in fp32"),
    "gathered weights never freed": (NOT_FREED, 3, 4, "3 blocks were whole at once"),
    "never freed, passed off as shards": (DISGUISED, 3, 6, "3 blocks were whole at once"),
    # Every byte right: the numbers name it, by how far they are off.
    "summed, not averaged": (SUMMED, 3, 2, "2 times one process's"),
}
# Between them, 20 draws of the weights and the data, on 2 and 3 ranks.
PASSES = {"FSDP2": (fsdp2, 7, 2), "the course's": (fsdp.shard_layers, 7, 4),
          "written another way": (list_sharding, 6, 3)}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Every candidate's verdict on each of its cases ("" where it passes), from one
    launch of the ranks: {name: [verdict, ...]}."""
    folder = tmp_path_factory.mktemp("precision")
    by_shape, cases = {}, []
    for name, (edits, blocks, heads, _) in SLIPS.items():
        module = mutant(folder, "fsdp", *edits, name="mutant_" + name.replace(" ", "_")
                        .replace(",", ""))
        by_shape[blocks, heads] = module.shard_layers
        cases.append(problem.rank_case(2, dim=24, layers=blocks, heads=heads, note=name))
    for name, (candidate, draws, heads) in PASSES.items():
        by_shape[2, heads] = candidate
        cases += [problem.rank_case(2 + i % 2, dim=24, layers=2, heads=heads, note=name)
                  for i in range(draws)]

    def shard_layers(model, **policy):
        return by_shape[len(model.blocks), model.blocks[0].heads](model, **policy)

    spec = dataclasses.replace(get_problem(PROBLEM), cpu_cases=cases, gpu_cases=cases)
    result = grade(spec, shard_layers)
    assert len(result.cases) == len(cases), result.causes
    found: dict[str, list[str]] = {}
    for case in result.cases:
        found.setdefault(case.case.note, []).append("" if case.ok else case.explained)
    errors = {case.case.note: case.comparison.rel_error for case in result.cases
              if case.ok and case.comparison is not None}
    return found, errors


@pytest.mark.parametrize("name", list(PASSES))
def test_fsdp2_the_course_and_another_way_pass_every_draw(verdicts, name):
    found, errors = verdicts
    assert found[name] == [""] * PASSES[name][1], found[name]
    # The same bf16 arithmetic on the same numbers as one process: far inside the bar.
    assert errors[name] < problem.RELATIVE / 100, errors[name]


@pytest.mark.parametrize("name", list(SLIPS))
def test_each_classic_slip_fails_with_its_cause_named(verdicts, name):
    found, _ = verdicts
    verdict, = found[name]
    assert verdict, f"{name} passed"
    assert SLIPS[name][3] in verdict, verdict


def test_the_reference_is_one_process_under_the_policy():
    """Its first loss is a bf16 copy of the model's on the whole batch; the bytes a rank
    sends a step are two bf16 all-gathers and one fp32 reduce-scatter, (N − 1)/N of each."""
    case = problem.CASES[1]
    n, dim, layers = case.sizes["ranks"], case.sizes["dim"], case.sizes["layers"]
    inputs = problem.make_inputs(case, torch.Generator().manual_seed(0), None)
    want = problem.reference(inputs[0][0], [i[1] for i in inputs], [i[2] for i in inputs])
    model = problem.make_model(dim, 4, layers, seed=inputs[0][0][3]).to(torch.bfloat16)
    losses = [fsdp.loss_fn(model, i[1][0].to(torch.bfloat16), i[2][0]).item()
              for i in inputs]
    assert float(want[0, 0]) == pytest.approx(sum(losses) / n, rel=1e-12)
    padded = layers * n * math.ceil((12 * dim * dim + 13 * dim) / n)
    assert problem.cost(case).bytes == pytest.approx((n - 1) / n * padded * 8 * problem.STEPS)
