"""Tensor parallelism (Megatron-LM) and sequence parallelism, from torch.distributed calls.

Data parallelism and FSDP split the batch; tensor parallelism (TP) splits the layers. The
t ranks of a group work on the same tokens, each holding 1/t of every weight matrix:

1. ``copy_to_parallel`` (Megatron's ``f``) and ``reduce_from_parallel`` (``g``): the two
   autograd functions that are each other's conjugate. ``f`` does nothing forward and
   all-reduces the gradient backward; ``g`` all-reduces forward and does nothing backward.
2. ``ColumnParallelLinear``: ``Y = X·A`` with A's output features split, rank r computing
   its slice of Y from the whole X. ``RowParallelLinear``: ``Z = Y·B`` with B's input
   features split, rank r a partial sum of Z from its slice of Y; ``g`` adds them up.
3. ``parallelize(block)``: a transformer block as Megatron splits it. Attention's heads
   over the ranks (q, k, v by columns, the output projection by rows), the MLP's hidden
   units (up by columns, down by rows), ``f`` where each half begins and ``g`` in its
   row-parallel projection: one all-reduce of a b × s × h activation in each half's
   forward, one in its backward, four a block a step.
4. ``parallelize_sequence(block)``: sequence parallelism on top (Korthikanti et al.,
   2022). Between the halves the activations stay split along the sequence, so the
   LayerNorms run on 1/t of the tokens; each all-reduce becomes its two halves, an
   all-gather where a half begins and a reduce-scatter where it ends. The same bytes
   move, and every activation is split t ways.
5. ``parallel_plan``: per GPU and step, what data parallelism, FSDP, TP + SP and their
   combination hold and send, for a model and a cluster.

The same code runs on gloo processes on a CPU and under ``torchrun`` with NCCL; every
function is called on every rank of the group, inside an initialised default process
group, with the same model (same weights) on every rank. The blocks have no biases, as
Llama's and torchtitan's: a row-parallel bias would be added once, after ``g``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# --- the model ---------------------------------------------------------------------------------


class Attention(nn.Module):
    """Causal self-attention with separate q, k, v projections. The number of heads is read
    from the projections' output, so the same forward runs whole or on a rank's heads."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (project(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
                   for project in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    """``down(GeLU(up(x)))``, four times as wide inside."""

    def __init__(self, dim: int):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm transformer block, named as torchtitan names Llama's."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(dim), Attention(dim, heads)
        self.mlp_norm, self.mlp = nn.LayerNorm(dim), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


# Which way each weight is split: "column" (its output features), "row" (its inputs).
SPLITS = {"attention.q": "column", "attention.k": "column", "attention.v": "column",
          "attention.out": "row", "mlp.up": "column", "mlp.down": "row"}


# --- 1. f and g --------------------------------------------------------------------------------


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### KEY
        # Every rank's slice of the layer used the whole x: x's gradient is their sum.
        ### END KEY
        grad = grad.contiguous()
        ### KEY
        dist.all_reduce(grad)
        ### END KEY
        ### END SOLUTION
        return grad


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ### KEY
        total = partial.contiguous().clone()  # never all-reduce into a tensor autograd saved
        ### END KEY
        dist.all_reduce(total)
        ### END SOLUTION
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad  # the sum's gradient reaches each partial sum unchanged


def copy_to_parallel(x: torch.Tensor) -> torch.Tensor:
    """``f``: forward, x as it is; backward, the gradient all-reduced."""
    return CopyToParallel.apply(x)


def reduce_from_parallel(partial: torch.Tensor) -> torch.Tensor:
    """``g``: forward, the ranks' partial sums all-reduced; backward, the gradient as it
    is."""
    return ReduceFromParallel.apply(partial)


# --- 2. the split linear layers ---------------------------------------------------------------


class ColumnParallelLinear(nn.Module):
    """Rank r's rows [r·out/t, (r + 1)·out/t) of a ``Linear``'s weight: its slice of the
    output features, computed from the whole input. No communication: ``f`` goes where
    the input enters the parallel region, once for all the layers that read it."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        ### BEGIN SOLUTION
        ### KEY
        rows = linear.out_features // world
        ### END KEY
        self.weight = nn.Parameter(linear.weight.detach()[rank * rows:(rank + 1) * rows]
                                   .clone())
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """Rank r's columns [r·in/t, (r + 1)·in/t) of a ``Linear``'s weight: from its slice
    of the input, a partial sum of the whole output, which ``reduce`` adds up over the
    ranks (``reduce_from_parallel``, or with sequence parallelism
    ``reduce_scatter_to_sequence``)."""

    def __init__(self, linear: nn.Linear, reduce=reduce_from_parallel):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.reduce = reduce
        ### BEGIN SOLUTION
        columns = linear.in_features // world
        self.weight = nn.Parameter(
            linear.weight.detach()[:, rank * columns:(rank + 1) * columns].clone())
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(F.linear(x, self.weight))


# --- 3. a block, Megatron style ------------------------------------------------------------------


def _replace(block: nn.Module, name: str, layer: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(block.get_submodule(parent), child, layer)


def parallelize(block: Block) -> Block:
    """Split ``block`` in place over the ranks of the default group: q, k, v and up by
    columns, out and down by rows; ``f`` on the input of the attention and of the MLP.
    The heads and the hidden units must divide by the number of ranks."""
    ### BEGIN SOLUTION
    for name, split in SPLITS.items():
        linear = block.get_submodule(name)
        ### KEY
        _replace(block, name, ColumnParallelLinear(linear) if split == "column"
                 else RowParallelLinear(linear))
        ### END KEY
    for half in (block.attention, block.mlp):
        ### KEY
        half.register_forward_pre_hook(lambda module, args: (copy_to_parallel(args[0]),))
        ### END KEY
    ### END SOLUTION
    return block


# --- 4. sequence parallelism ---------------------------------------------------------------------

SEQUENCE = 1  # activations are (batch, sequence, hidden)


def _gather_sequence(shard: torch.Tensor) -> torch.Tensor:
    """Every rank's (b, s/t, h) shard, in rank order along the sequence: (b, s, h)."""
    ### BEGIN SOLUTION
    world = dist.get_world_size()
    ### KEY
    # all_gather_into_tensor stacks along the first dimension: put the sequence there.
    local = shard.movedim(SEQUENCE, 0).contiguous()
    ### END KEY
    whole = local.new_empty((world * local.shape[0], *local.shape[1:]))
    ### KEY
    dist.all_gather_into_tensor(whole, local)
    ### END KEY
    # Contiguous: the layers that read it save it for backward, and a strided view would
    # have them save a copy beside it.
    return whole.movedim(0, SEQUENCE).contiguous()
    ### END SOLUTION


def _reduce_scatter_sequence(whole: torch.Tensor) -> torch.Tensor:
    """The ranks' (b, s, h) tensors summed; this rank keeps its (b, s/t, h) slice."""
    ### BEGIN SOLUTION
    world = dist.get_world_size()
    local = whole.movedim(SEQUENCE, 0).contiguous()
    mine = local.new_empty((local.shape[0] // world, *local.shape[1:]))
    ### KEY
    dist.reduce_scatter_tensor(mine, local)
    ### END KEY
    return mine.movedim(0, SEQUENCE)
    ### END SOLUTION


class GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard: torch.Tensor) -> torch.Tensor:
        return _gather_sequence(shard)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_sequence(grad)


class ReduceScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_sequence(partial)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _gather_sequence(grad)


def gather_from_sequence(shard: torch.Tensor) -> torch.Tensor:
    """``f`` with sequence parallelism: forward, all-gather the sequence; backward,
    reduce-scatter the gradient (each rank's slice of the sum)."""
    return GatherFromSequence.apply(shard)


def reduce_scatter_to_sequence(partial: torch.Tensor) -> torch.Tensor:
    """``g`` with sequence parallelism: forward, reduce-scatter the partial sums along the
    sequence; backward, all-gather the gradient."""
    return ReduceScatterToSequence.apply(partial)


def parallelize_sequence(block: Block) -> Block:
    """``parallelize`` with sequence parallelism: the block takes and returns this rank's
    slice of the sequence, (b, s/t, h), and its LayerNorms and residual adds run on it.
    Each LayerNorm's weight and bias gradients are then this rank's tokens' share: their
    sum over the ranks is the gradient, left for the step's gradient all-reduce to add
    up (Megatron sums them after backward, DTensor keeps them as ``Partial``)."""
    ### BEGIN SOLUTION
    for name, split in SPLITS.items():
        linear = block.get_submodule(name)
        ### KEY
        _replace(block, name, ColumnParallelLinear(linear) if split == "column"
                 else RowParallelLinear(linear, reduce=reduce_scatter_to_sequence))
        ### END KEY
    for half in (block.attention, block.mlp):
        ### KEY
        half.register_forward_pre_hook(lambda module, args: (gather_from_sequence(args[0]),))
        ### END KEY
    ### END SOLUTION
    return block


# --- the same with PyTorch's DTensor --------------------------------------------------------------


# PyTorch's plan is a right answer to tp/block and tp/sequence: the learner writes it too
# (lab 10, section 2), and a release ships it as a stub.
def dtensor_plan(block: Block, sequence: bool = False) -> Block:
    """The block split by ``torch.distributed.tensor.parallel``, as torchtitan splits
    Llama's: the library's version of ``parallelize`` (``sequence=False``) and of
    ``parallelize_sequence``. Its weights become DTensors; its activations stay plain
    tensors between the layers."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    ### BEGIN SOLUTION
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    between = Shard(SEQUENCE) if sequence else Replicate()
    ### KEY
    plan = {name: ColwiseParallel() if split == "column"
            else RowwiseParallel(output_layouts=between)
            for name, split in SPLITS.items()}
    ### END KEY
    for half in ("attention", "mlp"):
        # One f for q, k and v together: their inputs' gradients add up before the one
        # all-reduce (or reduce-scatter) that turns them from partial sums into the sum.
        ### KEY
        plan[half] = PrepareModuleInput(input_layouts=(between,),
                                        desired_input_layouts=(Replicate(),),
                                        use_local_output=False)
        ### END KEY
    if sequence:
        plan["attention_norm"] = plan["mlp_norm"] = SequenceParallel()
    return parallelize_module(block, mesh, plan)
    ### END SOLUTION


# --- 5. counting ----------------------------------------------------------------------------------

STATE_BYTES = 16  # a parameter, mixed-precision Adam: bf16 weight and gradient, fp32 master, m, v
ACTIVATION_BYTES = 34  # a token and unit of width a layer, in 16-bit (Korthikanti et al.)


def parallel_plan(hidden: int, layers: int, seq_len: int, batch: int, gpus: int, tp: int,
                  sharded: bool) -> tuple[float, float]:
    """Per GPU and step: (bytes held, bytes sent) for a transformer of ``layers`` layers
    of width ``hidden`` (12·hidden² parameters each), training on ``batch`` sequences of
    ``seq_len`` tokens a step, one sequence at a time, on ``gpus`` GPUs: tensor and
    sequence parallel over groups of ``tp`` (tp = 1: none), data parallel over the
    gpus/tp groups, the training state replicated over them or, ``sharded``, split (FSDP).
    Held: the training state and one sequence's activations. Sent: what each GPU's ring
    collectives send (an all-reduce of S bytes, 2·(n − 1)/n·S)."""
    ### BEGIN SOLUTION
    params = 12 * hidden * hidden * layers
    data = gpus // tp  # GPUs that hold the same slice of the layers
    ### KEY
    state = STATE_BYTES * params / tp / (data if sharded else 1)
    ### END KEY
    activations = ACTIVATION_BYTES * seq_len * hidden * layers / tp
    # The data-parallel side, among the `data` GPUs of one TP rank, on its 1/tp slice of
    # the bf16 weights: FSDP all-gathers them twice and reduce-scatters the gradient; DP
    # all-reduces the gradient (a reduce-scatter and an all-gather).
    weights = 2 * params / tp
    ### KEY
    across = (3 if sharded else 2) * (data - 1) / data * weights
    ### END KEY
    # The TP side: a layer's two all-reduces forward and two backward (with SP their
    # halves, the same bytes) of a sequence's 2·s·h bytes, for each sequence of the group.
    sequences = batch / data
    ### KEY
    within = sequences * layers * 4 * 2 * (tp - 1) / tp * 2 * seq_len * hidden
    ### END KEY
    return state + activations, across + within
    ### END SOLUTION
