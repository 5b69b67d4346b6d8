"""tp/block, tp/sequence and tp/plan: PyTorch's own tensor-parallel plan and a split written
another way pass; each classic slip fails with its cause named; the verdict is the same
for 20 draws of the weights and inputs; the functional collectives DTensor issues are
recorded as the collectives they are; right answers whose collectives carried zeros (the
partial sums sent through files), twice their share, or one rank's whole sum fail, named.

Slips are graded on the one case that shows them (3 ranks unless said), as in
test_fsdp_cheats.py; the course's own solutions run every case in test_solutions.py."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from mutants import grade, mutant

from rooflab.autograder import get_problem
from rooflab.autograder.problems import tensor_parallel as problems
from rooflab.kernels import tensor_parallel as tp


def on(problem: str, *ranks: int, copies: int = 1):
    """The problem with only its cases on ``ranks``, each ``copies`` times (every copy
    draws its own weights and inputs)."""
    spec = get_problem(problem)
    cases = [case for case in spec.cpu_cases if case.sizes["ranks"] in ranks] * copies
    return dataclasses.replace(spec, cpu_cases=cases, gpu_cases=cases)


def causes(result) -> str:
    return " | ".join(case.explained for case in result.cases if not case.ok)


# --- correct code, written other ways -------------------------------------------------------------


def dtensor_block(block):
    from rooflab.kernels.tensor_parallel import dtensor_plan

    return dtensor_plan(block)


def dtensor_sequence(block):
    from rooflab.kernels.tensor_parallel import dtensor_plan

    return dtensor_plan(block, sequence=True)


@pytest.mark.parametrize("problem, plan, ranks", [("tp/block", dtensor_block, 3),
                                                  ("tp/sequence", dtensor_sequence, 4)])
def test_pytorchs_own_tensor_parallel_plan_passes(problem, plan, ranks):
    """torch.distributed.tensor.parallel, planned as torchtitan plans Llama: its weights
    DTensors, its collectives the functional ones (on an odd and an even world)."""
    result = grade(on(problem, ranks), plan)
    assert result.passed, causes(result)


def sliced_in_place(block):
    """The Linear modules kept, their weights swapped for slices; g as a forward hook on
    the row-parallel layers, f as a hook on the gradient of each half's input."""
    import torch
    import torch.distributed as dist
    from torch import nn

    rank, world = dist.get_rank(), dist.get_world_size()

    class AllReduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            out = x.clone()
            dist.all_reduce(out)
            return out

        @staticmethod
        def backward(ctx, grad):
            return grad

    def keep(linear, dim):
        whole = linear.weight.detach()
        linear.weight = nn.Parameter(torch.chunk(whole, world, dim=dim)[rank].clone())

    for name in ("q", "k", "v"):
        keep(getattr(block.attention, name), 0)
    keep(block.mlp.up, 0)
    for layer in (block.attention.out, block.mlp.down):
        keep(layer, 1)
        layer.register_forward_hook(lambda m, args, out: AllReduce.apply(out))

    def summed(grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

    def f(module, args):
        x = args[0].view_as(args[0])  # a new node, whose gradient the hook sums
        if x.requires_grad:
            x.register_hook(summed)
        return (x,)

    block.attention.register_forward_pre_hook(f)
    block.mlp.register_forward_pre_hook(f)


def test_a_block_sliced_in_place_with_hooks_passes():
    result = grade(on("tp/block", 3), sliced_in_place)
    assert result.passed, causes(result)


def regathering(block):
    """Megatron's sequence parallelism as it saves memory: each half saves its rank's
    slice, not the gathered input, and gathers it again in backward."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from rooflab.kernels import tensor_parallel as tp

    world = dist.get_world_size()

    class GatherThenProject(torch.autograd.Function):
        @staticmethod
        def forward(ctx, shard, *weights):
            ctx.save_for_backward(shard, *weights)
            whole = tp._gather_sequence(shard)
            return tuple(F.linear(whole, w) for w in weights)

        @staticmethod
        def backward(ctx, *grads):
            shard, *weights = ctx.saved_tensors
            whole = tp._gather_sequence(shard)  # again: it was not kept
            grad_whole = sum(g @ w for g, w in zip(grads, weights, strict=True))
            grad_weights = [g.flatten(0, 1).t() @ whole.flatten(0, 1) for g in grads]
            return (tp._reduce_scatter_sequence(grad_whole), *grad_weights)

    for name, split in tp.SPLITS.items():
        linear = block.get_submodule(name)
        tp._replace(block, name, tp.ColumnParallelLinear(linear) if split == "column" else
                    tp.RowParallelLinear(linear, reduce=tp.reduce_scatter_to_sequence))
    attention, mlp = block.attention, block.mlp

    def attend(x):
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, world * length, -1, attention.head_dim).transpose(1, 2)
                   for t in GatherThenProject.apply(x, attention.q.weight, attention.k.weight,
                                                    attention.v.weight))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attention.out(out.transpose(1, 2).reshape(batch, world * length, -1))

    def feed(x):
        (up,) = GatherThenProject.apply(x, mlp.up.weight)
        return mlp.down(F.gelu(up))

    attention.forward, mlp.forward = attend, feed


def test_megatrons_sequence_parallelism_that_gathers_again_in_backward_passes():
    result = grade(on("tp/sequence", 3), regathering)
    assert result.passed, causes(result)


# --- the slips ------------------------------------------------------------------------------------

SLIPS = [
    ("no g: the row-parallel outputs never summed", "tp/block", (
        ("        dist.all_reduce(total)\n", ""),), "forward made 0 all-reduces, not 2"),
    ("f inside every column-parallel layer", "tp/block", (
        ("        return F.linear(x, self.weight)\n",
         "        return F.linear(copy_to_parallel(x), self.weight)\n"),
        ("        half.register_forward_pre_hook(lambda module, args: "
         "(copy_to_parallel(args[0]),))\n", "        pass\n")),
     "4 ran in the backward of CopyToParallel (f), 4 separate ones: one for each of "
     "attention.q, attention.k, attention.v and mlp.up. q, k and v read one input: one f for "
     "the three, where the attention begins"),
    ("the row-parallel layer split by rows", "tp/block", (
        ("        columns = linear.in_features // world\n        self.weight = nn.Parameter(\n"
         "            linear.weight.detach()[:, rank * columns:(rank + 1) * columns].clone())\n",
         "        columns = linear.out_features // world\n        self.weight = nn.Parameter(\n"
         "            linear.weight.detach()[rank * columns:(rank + 1) * columns].clone())\n"),),
     "split by its input features (columns)"),
    ("the whole weight kept beside its slice", "tp/block", (
        ("        self.weight = nn.Parameter(linear.weight.detach()[rank * rows:",
         "        self.whole = linear.weight.detach()\n"
         "        self.weight = nn.Parameter(linear.weight.detach()[rank * rows:"),),
     "of tensors, more than 1/3 of its matrices"),
    ("the whole weight kept in a library's module", "tp/block", (
        ("        self.weight = nn.Parameter(linear.weight.detach()[rank * rows:",
         "        import json\n"
         "        json.__dict__.setdefault('kept', []).append(linear.weight.detach().clone())\n"
         "        self.weight = nn.Parameter(linear.weight.detach()[rank * rows:"),),
     "of tensors, more than 1/3 of its matrices"),
    ("sequence parallelism that still all-reduces", "tp/sequence", (
        ("                 else RowParallelLinear(linear, reduce=reduce_scatter_to_sequence))",
         "                 else RowParallelLinear(linear))"),),
     "forward all-reduced: with sequence parallelism the all-reduce becomes a "
     "reduce-scatter"),
    ("the sequence gathered before the LayerNorm", "tp/sequence", (
        ("    for half in (block.attention, block.mlp):\n        ### KEY\n"
         "        half.register_forward_pre_hook(lambda module, args: "
         "(gather_from_sequence(args[0]),))",
         "    for half in (block.attention_norm, block.mlp_norm):\n        ### KEY\n"
         "        half.register_forward_pre_hook(lambda module, args: "
         "(gather_from_sequence(args[0]),))"),
        ),
     "of activations after forward"),
]


# g that all-reduces in backward as well as forward (its backward is the identity).
G_REDUCES_BACKWARD = (("        return grad  # the sum's gradient reaches each partial sum "
                       "unchanged\n",
                       "        grad = grad.clone()\n        dist.all_reduce(grad)\n"
                       "        return grad\n"),)
# The sequence gathers: along the sequence but in place (all_gather_into_tensor stacks along
# the first dimension, and gloo refuses the shapes); along the batch; in rank-reversed
# order; with the ranks' tokens interleaved; as a list concatenated along the batch.
SEQUENCE_LEFT_IN_PLACE = (
    ("    local = shard.movedim(SEQUENCE, 0).contiguous()\n", "    local = shard.contiguous()\n"),
    ("    whole = local.new_empty((world * local.shape[0], *local.shape[1:]))\n",
     "    whole = local.new_empty((local.shape[0], world * local.shape[1], "
     "*local.shape[2:]))\n"),
    ("    return whole.movedim(0, SEQUENCE).contiguous()", "    return whole"))
GATHERED_ALONG_THE_BATCH = (
    ("    local = shard.movedim(SEQUENCE, 0).contiguous()\n", "    local = shard.contiguous()\n"),)
RANK_REVERSED = (("    return whole.movedim(0, SEQUENCE).contiguous()",
                  "    whole = torch.cat(whole.chunk(world)[::-1])\n"
                  "    return whole.movedim(0, SEQUENCE).contiguous()"),)
INTERLEAVED = (("    return whole.movedim(0, SEQUENCE).contiguous()",
                "    whole = whole.view(world, -1, *whole.shape[1:]).transpose(0, 1)"
                ".reshape(whole.shape)\n"
                "    return whole.movedim(0, SEQUENCE).contiguous()"),)
LIST_CONCATENATED_ALONG_THE_BATCH = (
    ("    dist.all_gather_into_tensor(whole, local)\n",
     "    parts = [torch.empty_like(shard) for _ in range(world)]\n"
     "    dist.all_gather(parts, shard.contiguous())\n"
     "    whole = torch.cat(parts, dim=0).movedim(SEQUENCE, 0)\n"),)

SLIPS += [
    ("g all-reduces in backward too", "tp/block", G_REDUCES_BACKWARD,
     "rank 0's backward made 4 all-reduces, not 2 (of [1152, 1152, 1152, 1152] elements): "
     "2 ran in the backward of ReduceFromParallel (g, which sums attention.out's and "
     "mlp.down's partial outputs), which passes its gradient through unchanged; 2 ran in "
     "the backward of CopyToParallel (f), one where each half begins, as they should"),
    ("the sequence gathered where it lies", "tp/sequence", SEQUENCE_LEFT_IN_PLACE,
     "rank 0's 1st all-gather in forward, dist.all_gather_into_tensor, was handed the "
     "rank's slice as (2, 4, 48) and an output of (2, 12, 48): it stacks the 3 ranks' "
     "tensors along their first dimension, so that output would be (6, 4, 48). The "
     "sequence is dimension 1 of the rank's (2, 4, 48) slice (4 of the 12 tokens): to "
     "gather it, put it first, a (4, 2, 48) slice into (12, 2, 48), and move it back after; "
     "it raised RuntimeError: ProcessGroupGloo::allgather"),
    ("the batch gathered, not the sequence", "tp/sequence", GATHERED_ALONG_THE_BATCH,
     "in the block's forward; before it, its 1st all-gather in forward stacked the ranks' "
     "(2, 4, 48) slices along dimension 0, the batch, into (6, 4, 48)"),
    ("the gathered slices concatenated along the batch", "tp/sequence",
     LIST_CONCATENATED_ALONG_THE_BATCH,
     "rank 0's 1st reduce-scatter in forward, dist.reduce_scatter_tensor, was handed "
     "partial sums of (4, 6, 48) and an output of (1, 6, 48): it splits its input's first "
     "dimension 3 ways, and 4 does not split 3 ways. The partial sums are the (2, 12, 48) "
     "activation: with the sequence first, (12, 2, 48) into (4, 2, 48). This one holds "
     "3 × 2 = 6 along one dimension and 4 tokens along another: the ranks' slices were put "
     "together along the batch, not the sequence; it raised RuntimeError: Check failed"),
    ("the slices gathered in rank-reversed order", "tp/sequence", RANK_REVERSED,
     "rank 0: block.attention was handed the whole sequence, every token's row as one "
     "process has it, but out of order: the ranks' slices in the order 2, 1, 0, where the "
     "sequence is rank 0's 4 tokens, then rank 1's, and so on. So the block's output "
     "differs"),
    ("the ranks' tokens interleaved", "tp/sequence", INTERLEAVED,
     "rank 0: block.attention was handed the whole sequence, every token's row as one "
     "process has it, but out of order: its first 6 tokens are the sequence's 0, 4, 8, 1, "
     "5, 9, not 0 to 5"),
]
# What each of these slips must not be told: the cause that is not its own.
NOT_SAID = {"g all-reduces in backward too": ("one f for the three",),
            "the sequence gathered where it lies": ("rank 0 raised",),
            "the gathered slices concatenated along the batch": ("[rank0]:",)}


@pytest.mark.parametrize("name, problem, edits, words", SLIPS, ids=[s[0] for s in SLIPS])
def test_each_classic_slip_fails_and_is_named(tmp_path, name, problem, edits, words):
    module = mutant(tmp_path, "tensor_parallel", *edits)
    function = module.parallelize if problem == "tp/block" else module.parallelize_sequence
    result = grade(on(problem, 3), function)
    assert not result.passed
    assert words in causes(result), causes(result)
    for wrong in NOT_SAID.get(name, ()):
        assert wrong not in causes(result), causes(result)


@pytest.mark.parametrize("problem, edits, words", [
    ("tp/block", G_REDUCES_BACKWARD, "2 ran in the backward of ReduceFromParallel (g"),
    ("tp/sequence", RANK_REVERSED, "the ranks' slices in the order 1, 0")],
    ids=["g all-reduces in backward", "rank-reversed gather"])
def test_a_slip_is_told_the_same_for_20_draws(tmp_path, problem, edits, words):
    """Where the all-reduces ran, and the order of the rows, do not hang on the numbers
    drawn: twenty draws on 2 ranks, one message."""
    module = mutant(tmp_path, "tensor_parallel", *edits)
    function = module.parallelize if problem == "tp/block" else module.parallelize_sequence
    result = grade(on(problem, 2, copies=20), function)
    told = {case.explained for case in result.cases}
    assert len(result.cases) == 20 and not any(case.ok for case in result.cases)
    assert len(told) == 1 and words in told.pop(), told


def test_backward_all_reduces_from_nowhere_known_are_counted_not_explained():
    """Calls whose autograd node the log does not hold (or a graph the harness could not
    read): the count and the contract, and no guess at the cause."""
    from rooflab.autograder.ranks.record import Call, Mark, RankLog

    case = next(c for c in get_problem("tp/block").cpu_cases if c.sizes["ranks"] == 3)
    whole = problems.BATCH * case.sizes["length"] * case.sizes["dim"]
    calls = [Call(seq, "all_reduce", None, whole, 4 * whole, "float32", True)
             for seq in range(6)]
    log = RankLog(0, calls=calls, marks=[Mark("forward", 0), Mark("backward", 2),
                                         Mark("graph", 6, {"nodes": None}), Mark("after", 6)])
    told = problems.calls_cause(case, log, sequence=False)
    assert told == (f"rank 0's backward made 4 all-reduces, not 2 (of {[whole] * 4} "
                    "elements): one all-reduce of the b × s × h activation in each half's "
                    "forward (g) and one in each half's backward (f)"), told


def recorded_where(x):
    """An all-reduce in an autograd Function's backward, and an all-gather of a (2, 3)
    tensor into a (4, 3) one, in forward."""
    import torch
    import torch.distributed as dist

    class Summed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    whole = x.new_empty((2 * x.shape[0], *x.shape[1:]))
    dist.all_gather_into_tensor(whole, x)
    x = x.clone().requires_grad_()
    Summed.apply(x).sum().backward()
    return x.grad


def test_the_record_holds_each_calls_shapes_and_the_backward_it_ran_in():
    from rooflab.autograder.ranks import on_ranks

    for run in on_ranks(recorded_where, 2, torch.ones(2, 3)):
        gather, reduce = run.log.calls
        assert (gather.op, gather.shape, gather.into, gather.node) == (
            "all_gather_into_tensor", [2, 3], [4, 3], None)
        assert (reduce.op, reduce.shape, reduce.node[0]) == (
            "all_reduce", [2, 3], "SummedBackward")


def test_the_verdicts_are_the_same_for_20_draws():
    """Twenty draws of weights and inputs on 2 ranks: every case passes."""
    spec = on("tp/block", 2, copies=20)
    assert len(spec.cpu_cases) == 20
    result = grade(spec, tp.parallelize)
    assert result.passed and len(result.cases) == 20, causes(result)


# --- what the grader reads ----------------------------------------------------------------------


def test_a_split_that_loses_a_layer_is_refused_by_name():
    def drops_the_mlp(block):
        del block.mlp.down

    result = grade(on("tp/block", 2), drops_the_mlp)
    assert "the block has no mlp.down.weight after the split" in causes(result)


def test_the_reference_is_one_process_and_the_bytes_follow_megatrons_count():
    case = get_problem("tp/block").cpu_cases[0]
    setup = (32, 4, 7, False)
    x, grad = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    want = problems.reference(setup, x, grad)
    block = problems.make_block(32, 4, 7).double()
    xd = x.double().requires_grad_()
    block(xd).backward(grad.double())
    assert torch.equal(want["input"], xd.grad)
    assert torch.equal(want["mlp.up"], block.mlp.up.weight.grad)
    # four all-reduces of the 2 × 8 × 32 activation, 2·(t − 1)/t of 4 bytes each
    assert problems.cost(case).bytes == 4 * 2 * (1 / 2) * 2 * 8 * 32 * 4


def functional_sums(x):
    """The same sum three ways that go past torch.distributed's functions: funcol (as
    DTensor calls it), and the operator under it, as a packet and as its overload."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    name = dist.group.WORLD.group_name
    ops = torch.ops._c10d_functional
    sums = [funcol.all_reduce(x, "sum", dist.group.WORLD),
            ops.wait_tensor(ops.all_reduce(x, "sum", name)),
            ops.wait_tensor(ops.all_reduce.default(x, "sum", name))]
    return torch.stack([s.clone() for s in sums])


def test_functional_collectives_and_their_operators_are_recorded_as_collectives():
    """Each is recorded as the all-reduce it is, so a ring that hands its work to them is a
    library call (lab 08's checks), and DTensor's plan is graded on its calls."""
    from rooflab.autograder.ranks import on_ranks

    runs = on_ranks(functional_sums, 2, torch.arange(8.0))
    for run in runs:
        assert torch.equal(run.output, torch.arange(8.0).mul(2).expand(3, 8))
        assert [(c.op, c.elements, c.via) for c in run.log.calls] == [
            ("all_reduce", 8, "functional"), ("all_reduce", 8, "torch.ops"),
            ("all_reduce", 8, "torch.ops")]


def test_marks_the_learners_code_writes_are_refused():
    """A split that writes the grader's own mark, claiming it holds nothing."""
    def claims_to_hold_nothing(block):
        from rooflab.autograder.ranks import record
        from rooflab.kernels.tensor_parallel import parallelize

        parallelize(block)
        record.mark("weights", held=0)

    result = grade(on("tp/block", 2), claims_to_hold_nothing)
    assert "holds the grader's mark \"weights\" 2 times" in causes(result), causes(result)


# --- tp/plan --------------------------------------------------------------------------------------


def test_the_plan_passes_in_any_number_type_and_fails_a_lookup_table():
    assert grade("tp/plan", tp.parallel_plan).passed

    def as_tensors(*args):
        return tuple(torch.tensor(v, dtype=torch.float64) for v in tp.parallel_plan(*args))

    assert grade("tp/plan", as_tensors).passed
    named = {case.note: tp.parallel_plan(*problems._plan_inputs(case, None, None))
             for case in get_problem("tp/plan").cpu_cases if "h" in case.sizes}

    def table(hidden, layers, seq_len, batch, gpus, tp_, sharded):
        for case in get_problem("tp/plan").cpu_cases:
            if case.sizes.get("h") == hidden and case.sizes.get("gpus") == gpus and \
                    case.sizes.get("tp") == tp_ and bool(case.sizes.get("sharded")) == sharded:
                return named[case.note]
        return (0.0, 0.0)

    assert not grade("tp/plan", table).passed


PLAN_SLIPS = [
    ("activations whole", lambda h, L, s, B, G, t, shard: (
        tp.parallel_plan(h, L, s, B, G, t, shard)[0] + 34 * s * h * L * (1 - 1 / t),
        tp.parallel_plan(h, L, s, B, G, t, shard)[1]),
     "Sequence parallelism splits every activation"),
    ("TP traffic as one reduce-scatter", lambda h, L, s, B, G, t, shard: (
        tp.parallel_plan(h, L, s, B, G, t, shard)[0],
        tp.parallel_plan(h, L, s, B, G, t, shard)[1]
        - (B / (G // t)) * L * 4 * (t - 1) / t * 2 * s * h),
     "the TP side is half"),
]


@pytest.mark.parametrize("name, plan, words", PLAN_SLIPS, ids=[s[0] for s in PLAN_SLIPS])
def test_plan_slips_fail_and_are_named(name, plan, words):
    result = grade("tp/plan", plan)
    assert not result.passed
    assert words in causes(result), causes(result)


def test_the_plan_counts_the_concept_pages_model():
    """h 4096, 32 layers, 8 sequences of 4096 tokens on 8 GPUs: the concept page's
    picture says DP holds 121 GB and sends 23, FSDP 31 and 34, TP + SP 15 and 60."""
    for (tp_, sharded), (held, sent) in {(1, False): (121, 23), (1, True): (31, 34),
                                         (8, False): (15, 60)}.items():
        got = tp.parallel_plan(4096, 32, 4096, 8, 8, tp_, sharded)
        assert (round(got[0] / 1e9), round(got[1] / 1e9)) == (held, sent)
    assert math.isclose(tp.parallel_plan(4096, 32, 4096, 8, 8, 8, True)[0],
                        tp.parallel_plan(4096, 32, 4096, 8, 8, 8, False)[0])



# --- what the collectives carried ---------------------------------------------------------------

G_FORWARD = ("        total = partial.contiguous().clone()  # never all-reduce into a tensor "
             "autograd saved\n        ### END KEY\n        dist.all_reduce(total)\n")


def through_files(folder) -> tuple:
    """g whose all-reduce carries zeros of the right size, while the partial sums travel
    through files in ``folder``: each rank writes its own, then (the all-reduce of zeros
    standing in for a barrier) reads every rank's and adds them up."""
    return ((G_FORWARD,
             "        import torch as _torch\n"
             "        _CALLS.append(1)\n"
             f"        folder = {str(folder)!r}\n"
             "        step, rank = len(_CALLS), dist.get_rank()\n"
             "        _torch.save(partial.detach().clone(), f'{folder}/{step}-{rank}.pt')\n"
             "        dist.all_reduce(_torch.zeros_like(partial))\n"
             "        total = sum(_torch.load(f'{folder}/{step}-{r}.pt')\n"
             "                    for r in range(dist.get_world_size()))\n"
             "        ### END KEY\n"),
            ("class ReduceFromParallel(torch.autograd.Function):\n",
             "_CALLS = []\n\n\nclass ReduceFromParallel(torch.autograd.Function):\n"))


# What each all-reduce (or reduce-scatter) is handed, twice the rank's partial sum, halved
# after: the answers come out right, the messages carry what no split sends.
G_DOUBLED = ((G_FORWARD, "        total = partial.contiguous().clone() * 2\n        ### END KEY\n"
              "        dist.all_reduce(total)\n        total = total / 2\n"),)
F_DOUBLED = (("        grad = grad.contiguous()\n        ### KEY\n        dist.all_reduce(grad)\n",
              "        grad = grad.contiguous() * 2\n        ### KEY\n"
              "        dist.all_reduce(grad)\n        grad = grad / 2\n"),)
SCATTER_DOUBLED = (("    dist.reduce_scatter_tensor(mine, local)\n",
                    "    dist.reduce_scatter_tensor(mine, local * 2)\n    mine = mine / 2\n"),)
BACKWARD_GATHER_DOUBLED = (("        return _gather_sequence(grad)\n",
                            "        return _gather_sequence(grad * 2) / 2\n"),)
GATHER_DOUBLED = (("    dist.all_gather_into_tensor(whole, local)\n",
                   "    dist.all_gather_into_tensor(whole, local * 2)\n    whole = whole / 2\n"),)


def test_partial_sums_sent_through_files_while_the_all_reduces_carry_zeros_fail(tmp_path):
    """The block's numbers are right, its all-reduces of the right count and size, but
    they carry zeros: what each rank handed its all-reduce is judged."""
    folder = tmp_path / "exchange"
    folder.mkdir()
    module = mutant(tmp_path, "tensor_parallel", *through_files(folder))
    result = grade(on("tp/block", 3), module.parallelize)
    assert not result.passed
    told = causes(result)
    assert "1st all-reduce in forward (g, after attention.out) was handed only zeros, where " \
        "it must carry its own partial sum" in told or "a file written during this check" \
        in told, told


def whole_sum_on_rank_0(folder) -> tuple:
    """Each rank writes its partial sum to a file in ``folder``; rank 0 waits for them
    all, and its all-reduce carries their sum less what the others carry, a constant:
    the sum over the ranks is right, no rank's share is its partial sum."""
    return ((G_FORWARD,
             "        import os as _os\n        import time as _time\n"
             "        import torch as _torch\n"
             "        _CALLS.append(1)\n"
             f"        folder = {str(folder)!r}\n"
             "        step, rank = len(_CALLS), dist.get_rank()\n"
             "        world = dist.get_world_size()\n"
             "        _torch.save(partial.detach().clone(), f'{folder}/{step}-{rank}.tmp')\n"
             "        _os.replace(f'{folder}/{step}-{rank}.tmp', f'{folder}/{step}-{rank}.pt')\n"
             "        other = _torch.full_like(partial, 1e-3)\n"
             "        total = other\n"
             "        if rank == 0:\n"
             "            names = [f'{folder}/{step}-{r}.pt' for r in range(world)]\n"
             "            while not all(_os.path.exists(name) for name in names):\n"
             "                _time.sleep(0.01)\n"
             "            total = sum(_torch.load(name) for name in names) - (world - 1) * other\n"
             "        dist.all_reduce(total)\n"
             "        ### END KEY\n"),
            ("class ReduceFromParallel(torch.autograd.Function):\n",
             "_CALLS = []\n\n\nclass ReduceFromParallel(torch.autograd.Function):\n"))


CARRIED_WRONG = [
    ("g's all-reduce handed twice the partial sum", "tp/block", G_DOUBLED,
     "the 1st all-reduce in forward (g, after attention.out) was handed values that do not "
     "sum over the ranks to the attention's output: their sum over the ranks is 2 times what "
     "one process gives: each rank's all-reduce must carry its own partial sum"),
    ("f's all-reduce handed twice the gradient", "tp/block", F_DOUBLED,
     "the 1st all-reduce in backward (f, where the MLP begins) was handed values that do not "
     "sum over the ranks to the gradient at the MLP's input: their sum over the ranks is 2 "
     "times what one process gives"),
    ("the reduce-scatter handed twice the partial sum", "tp/sequence", SCATTER_DOUBLED,
     "the 1st reduce-scatter in forward (g, after attention.out) was handed values that do "
     "not sum over the ranks to the attention's output: their sum over the ranks is 2 times "
     "what one process gives"),
    ("the all-gather handed twice the slice", "tp/sequence", GATHER_DOUBLED,
     "rank 0's 1st all-gather in forward (where the attention begins) was handed values "
     "that are not the rank's slice of the attention's input: 2 times it"),
    ("the all-gather in backward handed twice the gradient", "tp/sequence",
     BACKWARD_GATHER_DOUBLED,
     "rank 0's 1st all-gather in backward was handed values that are not the rank's slice "
     "of the gradient at either half's output, nor of either half's input"),
]


@pytest.mark.parametrize("name, problem, edits, words", CARRIED_WRONG,
                         ids=[c[0] for c in CARRIED_WRONG])
def test_a_collective_that_carries_what_no_split_sends_fails_and_is_named(
        tmp_path, name, problem, edits, words):
    module = mutant(tmp_path, "tensor_parallel", *edits)
    function = module.parallelize if problem == "tp/block" else module.parallelize_sequence
    result = grade(on(problem, 3), function)
    assert not result.passed
    assert words in causes(result), causes(result)


def test_what_the_all_reduces_carried_is_told_the_same_for_20_draws(tmp_path):
    module = mutant(tmp_path, "tensor_parallel", *G_DOUBLED)
    result = grade(on("tp/block", 2, copies=20), module.parallelize)
    told = {case.explained for case in result.cases}
    assert len(result.cases) == 20 and not any(case.ok for case in result.cases)
    assert len(told) == 1 and "2 times what one process gives" in told.pop(), told



def test_the_whole_sum_carried_by_one_rank_fails(tmp_path):
    """Right answers, and all-reduces whose sum over the ranks is right, but rank 0's
    carries the whole sum (learnt through files) and the others' a constant: each rank's
    share is judged too."""
    folder = tmp_path / "exchange"
    folder.mkdir()
    module = mutant(tmp_path, "tensor_parallel", *whole_sum_on_rank_0(folder))
    result = grade(on("tp/block", 3), module.parallelize)
    assert not result.passed
    assert "rank 0's 1st all-reduce in forward (g, after attention.out) was handed values " \
        "that are not its own partial sum (the ranks' sum is the attention's output, but " \
        "not shared as the split shares it)" in causes(result), causes(result)
