"""Data parallel training, then fully sharded (FSDP, ZeRO-3), from torch.distributed calls.

Every rank runs the same model on its own slice of the batch. Plain data parallelism keeps
a whole copy of the model, its gradients and its optimizer state on every rank: for Adam
in fp32, 16 bytes a parameter (4 weight, 4 gradient, 8 for the two moments), whatever the
number of ranks. Sharding keeps 1/N of each on each rank and gathers a layer's weights
only while that layer computes. The ladder:

1. ``average_gradients``: after ``backward``, one all-reduce per gradient, divided by N.
2. ``DataParallel``: gradients in buckets of a few MiB, each all-reduced (asynchronously)
   as soon as backward has produced all of it, so communication overlaps the rest of
   backward, as ``DistributedDataParallel`` does.
3. ``ShardedLayer`` and ``shard_layers``: ZeRO-3. Each layer's parameters become one flat
   vector, padded to a multiple of N; rank r keeps elements [r·s, (r + 1)·s), s = ⌈numel/N⌉,
   as the parameter its optimizer steps. Before the layer's forward, an all-gather rebuilds
   the whole vector (and the layer's weights, which are views of it); after the forward it
   is freed. Backward gathers it again, and the layer's gradients are reduce-scattered:
   each rank receives the sum of its own slice. Per step and layer: two all-gathers and
   one reduce-scatter, 3·(N − 1)/N·Ψ elements on the wire a rank, 1.5 times data
   parallelism's all-reduce (2·(N − 1)/N·Ψ).
4. ``shard_layers(model, prefetch=True)``: the next layer's all-gather is issued before
   this layer computes, so the two overlap; at most two layers are whole at once.
5. ``shard_layers(model, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``: the
   mixed-precision policy of FSDP2's ``MixedPrecisionPolicy``. The shards, the parameters
   the optimizer steps, stay fp32 (the master weights); each is cast to bf16 before it is
   gathered, so the all-gathers move half the bytes and the blocks compute in bf16; their
   bf16 gradients are cast to fp32 before the reduce-scatter, whose sum over N ranks
   would lose bits in bf16.

The same code runs on gloo processes on a CPU and under ``torchrun`` with NCCL. Every
function is called on every rank, inside an initialised default process group, with the
same model (same initial weights) on every rank.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# --- the model ---------------------------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then a 4× MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, -1).unbind(2)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, dim))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyTransformer(nn.Module):
    """``layers`` blocks of width ``dim``. No embedding and no head: every parameter lives
    in a block, so each block is one unit of sharding (a real model adds one unit for the
    embedding and one for the head)."""

    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def loss_fn(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean squared error of the model's output: the mean over this rank's batch, in
    fp32 whatever precision the model computes in."""
    return F.mse_loss(model(x).float(), target)


# --- 1. data parallel, by hand -----------------------------------------------------------------


def average_gradients(model: nn.Module) -> None:
    """After ``loss.backward()`` on every rank: each gradient becomes the mean of the
    ranks' gradients, the gradient of the loss over the whole batch (the ranks' batches
    being the same size). One blocking all-reduce per parameter: as many messages as
    tensors, and none starts before backward has ended."""
    world = dist.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad /= world


class DataParallel:
    """Bucketed all-reduce, overlapped with backward.

    Backward produces gradients from the last layer to the first. The parameters are put
    in buckets of about ``bucket_bytes`` in that order; a hook on each parameter counts
    the gradients ready, and once a bucket's last gradient is there, the bucket is copied
    into one flat tensor and all-reduced asynchronously while backward goes on with the
    earlier layers. ``finish()``, after ``loss.backward()``, waits for every bucket and
    copies the averages back into the gradients.
    """

    def __init__(self, model: nn.Module, bucket_bytes: int = 1 << 20):
        self.world = dist.get_world_size()
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for parameter in reversed([p for p in model.parameters() if p.requires_grad]):
            if size >= bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(parameter)
            size += parameter.numel() * parameter.element_size()
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.pending: list[tuple[dist.Work, torch.Tensor, list[nn.Parameter]]] = []
        for bucket in self.buckets:
            for parameter in bucket:
                parameter.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, parameter: nn.Parameter) -> None:
        index = self.bucket_of[id(parameter)]
        self.ready[index] += 1
        bucket = self.buckets[index]
        if self.ready[index] == len(bucket):  # the bucket's last gradient: send it now
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            work = dist.all_reduce(flat, async_op=True)
            self.pending.append((work, flat, bucket))

    def finish(self) -> None:
        """Wait for every bucket's all-reduce and write the mean back into each gradient."""
        for work, flat, bucket in self.pending:
            work.wait()
            flat /= self.world
            offset = 0
            for parameter in bucket:
                parameter.grad.copy_(flat[offset:offset + parameter.numel()].view_as(parameter))
                offset += parameter.numel()
        self.pending.clear()
        self.ready = [0] * len(self.buckets)


# --- 2. fully sharded: ZeRO-3 ------------------------------------------------------------------


class ShardedLayer:
    """One layer's parameters as one flat vector, of which this rank keeps ⌈numel/N⌉.

    ``shard``: this rank's slice, the parameter the optimizer steps. ``full``: the whole
    (padded) vector, whose storage exists only between ``gather`` and ``free``; the
    layer's own parameters are views of it, so the layer's forward runs unchanged and
    autograd, which keeps references to those views for backward, finds the weights again
    once ``gather`` has refilled the same storage.

    ``param_dtype`` and ``reduce_dtype`` are a mixed-precision policy, FSDP2's: the whole
    vector, and so the weights the layer computes with and their gradients, in
    ``param_dtype`` (None: the parameters' own); the gradients reduce-scattered in
    ``reduce_dtype`` (None: the gradients' own, as FSDP2 does). The shard keeps the
    parameters' own dtype, fp32: the master weights.
    """

    def __init__(self, layer: nn.Module, rank: int, world: int,
                 param_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype | None = None):
        self.layer, self.world = layer, world
        self.params = [p for p in layer.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = math.ceil(self.numel / world)
        with torch.no_grad():
            flat = torch.cat([p.reshape(-1) for p in self.params])
            padded = F.pad(flat, (0, self.shard_numel * world - self.numel))
            self.shard = nn.Parameter(padded[rank * self.shard_numel:][:self.shard_numel].clone())
            self.full = torch.empty_like(padded, dtype=param_dtype or padded.dtype)
            self.reduce_dtype = reduce_dtype or self.full.dtype
            offset = 0
            for p in self.params:
                p.data = self.full[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        self.gathering: dist.Work | None = None
        self.grads_ready = 0
        self.free()

    @property
    def gathered(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    def gather(self, async_op: bool = False) -> None:
        """Rebuild the whole vector from every rank's shard (a no-op if it is whole or on
        its way); with ``async_op``, return at once, the all-gather's handle kept in
        ``self.gathering`` for ``wait`` to finish."""
        if self.gathered:
            return
        ### BEGIN SOLUTION
        ### KEY fsdp/zero3
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        ### END KEY
        ### KEY fsdp/precision
        # The shard cast to the vector's dtype first (bf16 under the policy): the ranks
        # send one another half the bytes. A no-op when the two are the same.
        sent = self.shard.detach().to(self.full.dtype)
        # full or full.data alike: each parameter keeps its own version counter.
        self.gathering = dist.all_gather_into_tensor(self.full.data, sent, async_op=async_op)
        ### END KEY
        ### END SOLUTION
        if not async_op:
            self.gathering = None

    def wait(self) -> None:
        """Block until an asynchronous ``gather`` has arrived."""
        if self.gathering is not None:
            self.gathering.wait()
            self.gathering = None

    def free(self) -> None:
        """Give the whole vector's memory back; the shard stays."""
        ### BEGIN SOLUTION
        ### KEY fsdp/zero3
        self.full.untyped_storage().resize_(0)
        ### END KEY
        ### END SOLUTION

    def reduce_gradients(self) -> None:
        """Once backward has produced every gradient of the layer: each rank receives the
        mean over ranks of its own slice, as its shard's gradient (in the shard's dtype).
        Then the whole gradients and weights are freed."""
        ### BEGIN SOLUTION
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        ### KEY fsdp/precision
        # In reduce_dtype (fp32 under the policy): a sum of N bf16 gradients loses bits.
        flat = F.pad(flat.to(self.reduce_dtype), (0, self.shard_numel * self.world - self.numel))
        mine = torch.empty(self.shard_numel, dtype=self.reduce_dtype)
        ### END KEY
        ### KEY fsdp/zero3
        dist.reduce_scatter_tensor(mine, flat)
        mine /= self.world  # the mean: gloo had no ReduceOp.AVG before torch 2.7
        ### END KEY
        ### KEY fsdp/precision
        mine = mine.to(self.shard.dtype)  # the master's dtype, for the optimizer
        ### END KEY
        if self.shard.grad is None:
            self.shard.grad = mine
        else:  # gradient accumulation over several backward passes
            self.shard.grad += mine
        ### END SOLUTION
        for p in self.params:  # the whole gradients and weights are not needed any more
            p.grad = None
        self.free()


def shard_layers(model: TinyTransformer, prefetch: bool = False,
                 param_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype | None = None) -> list[nn.Parameter]:
    """Shard every block of ``model`` across the ranks (ZeRO-3) and return the shards,
    one flat parameter per block, for the optimizer: ``AdamW(shard_layers(model))``.
    Afterwards ``loss_fn(model, x, y).backward()`` works as before, leaves each shard's
    gradient as the mean over ranks, and leaves every block sharded. With ``prefetch``,
    each block's forward first issues the next block's all-gather, asynchronously, so that
    it arrives while this block computes; backward likewise gathers the block before.
    With ``param_dtype`` (bf16, say), the blocks gather their weights and compute in it,
    their inputs cast to it; with ``reduce_dtype``, the gradients are reduce-scattered in
    it; the shards keep the model's dtype. FSDP2's ``MixedPrecisionPolicy``, in two
    arguments.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    units = [ShardedLayer(block, rank, world, param_dtype, reduce_dtype)
             for block in model.blocks]
    ### BEGIN SOLUTION

    def before_forward(index: int):
        def hook(module, args):
            unit = units[index]
            ### KEY fsdp/zero3
            unit.gather()  # a no-op if prefetched
            unit.wait()
            ### END KEY
            ### KEY fsdp/prefetch
            if prefetch and index + 1 < len(units):
                units[index + 1].gather(async_op=True)
            ### END KEY
            ### KEY fsdp/precision
            if param_dtype is not None:  # the block's input, in its weights' dtype
                return tuple(a.to(param_dtype) for a in args)
            ### END KEY
        return hook

    ### KEY fsdp/zero3
    def after_forward(index: int):
        def hook(module, args, output):
            units[index].free()
    ### END KEY
        return hook

    ### KEY fsdp/zero3
    def before_backward(index: int):
    ### END KEY
        def hook(module, grad_output):
            ### KEY fsdp/zero3
            units[index].gather()
            ### END KEY
            ### KEY fsdp/prefetch
            units[index].wait()
            if prefetch and index > 0:
                units[index - 1].gather(async_op=True)
            ### END KEY
        return hook

    def gradient_ready(index: int):
        def hook(parameter):
            unit = units[index]
            unit.grads_ready += 1
            if unit.grads_ready == len(unit.params):
                unit.grads_ready = 0
                ### KEY fsdp/zero3
                unit.reduce_gradients()
                ### END KEY
        return hook

    for index, (block, unit) in enumerate(zip(model.blocks, units, strict=True)):
        block.register_forward_pre_hook(before_forward(index))
        block.register_forward_hook(after_forward(index))
        block.register_full_backward_pre_hook(before_backward(index))
        for p in unit.params:
            p.register_post_accumulate_grad_hook(gradient_ready(index))
    ### END SOLUTION
    return [unit.shard for unit in units]


# --- 3. memory: what a rank holds --------------------------------------------------------------


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (FSDP2's parameters are DTensors), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def bytes_held(tensors) -> int:
    """The bytes of the distinct storages behind ``tensors`` on this rank: a view counts
    once with its base, a freed storage (resized to 0) as nothing."""
    storages = {}
    for tensor in tensors:
        if tensor is not None:
            storage = local_part(tensor).untyped_storage()
            storages[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(storages.values())


def memory_held(parameters, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds for training, by kind: the parameters it keeps (the shards,
    under sharding), their gradients, and the optimizer's state (Adam: two moments)."""
    parameters = list(parameters)
    state = [value for per_parameter in optimizer.state.values()
             for value in per_parameter.values()
             if isinstance(value, torch.Tensor) and value.dim() > 0]
    return {"parameters": bytes_held(parameters),
            "gradients": bytes_held(p.grad for p in parameters),
            "optimizer": bytes_held(state)}


# --- 4. planning a large job: shard everywhere, or shard in a node and replicate ------------

ADAM_MIXED_BYTES = 16  # a parameter: bf16 weight and gradient (2 + 2), fp32 master and moments


def sharding_plan(params: float, nodes: int, gpus_per_node: int,
                  hybrid: bool) -> tuple[float, float, float]:
    """Per GPU and per step, for mixed-precision Adam on ``nodes`` × ``gpus_per_node``
    GPUs: (bytes of training state held, bytes sent over NVLink within the node, bytes
    sent over the network through the GPU's own network card).

    A collective over several nodes runs in two levels, as NCCL runs it: among the GPUs
    of the same local rank across the n nodes (each with 1/g of the data), then within
    each node. An all-gather of S bytes over n·g GPUs so sends (n − 1)/n·S/g a GPU over the
    network and (g − 1)/g·S over NVLink; a reduce-scatter the same; an all-reduce twice.

    FSDP (``hybrid=False``) shards over all n·g GPUs: 16Ψ/(n·g) held; every step two
    all-gathers of the bf16 weights and a reduce-scatter of the bf16 gradients, 2Ψ bytes
    each, over all GPUs. HSDP shards within a node and replicates across nodes: 16Ψ/g
    held; the same three collectives within the node, then an all-reduce of each GPU's
    gradient shard (2Ψ/g bytes) among the n replicas, the only bytes that leave the node.
    """
    ### BEGIN SOLUTION
    g, n = gpus_per_node, nodes
    ### KEY
    held = ADAM_MIXED_BYTES * params / (g if hybrid else n * g)
    nvlink = 3 * (g - 1) / g * 2 * params  # AG, AG, RS: each node's share of the levels
    ### END KEY
    if hybrid:  # an all-reduce of the gradient shard among the replicas
        ### KEY
        network = 2 * (n - 1) / n * 2 * params / g
        ### END KEY
    else:  # the cross-node level of the three collectives
        network = 3 * (n - 1) / n * 2 * params / g
    return held, nvlink, network
    ### END SOLUTION


# --- 5. activation checkpointing: keep a block's input, compute the rest again -----------------


class Recomputed(torch.autograd.Function):
    """``run(x)`` with nothing saved for backward but ``x``: backward runs it again, with
    autograd on, and backpropagates through that second graph. The parameters ``run``
    uses get their gradients there (accumulated into ``.grad`` as usual); ``x`` gets its
    own from it, returned to the graph around."""

    @staticmethod
    def forward(ctx, run, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        ctx.run = run
        ctx.save_for_backward(x)
        ### KEY
        with torch.no_grad():  # no graph: its activations are freed as they are used
            return run(x)
        ### END KEY
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ### BEGIN SOLUTION
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_()
        ### KEY
        with torch.enable_grad():
            output = ctx.run(x)  # the same forward again, this time keeping its graph
        ### END KEY
        torch.autograd.backward(output, grad)
        return None, x.grad
        ### END SOLUTION


def checkpoint_blocks(model: TinyTransformer) -> TinyTransformer:
    """Make every block of ``model`` keep only its input for backward and compute its
    forward again there: activations of L·b·s·h (the blocks' inputs) instead of every
    block's, for one more forward a step."""
    ### BEGIN SOLUTION
    for block in model.blocks:
        run = block.forward

        def recomputed(x: torch.Tensor, run=run) -> torch.Tensor:
            # The model's input needs no gradient; a Function none of whose inputs does
            # is cut from the graph, and its block's parameters would get none.
            ### KEY
            if not x.requires_grad:
                x = x.detach().requires_grad_()
            return Recomputed.apply(run, x)
            ### END KEY

        block.forward = recomputed
    ### END SOLUTION
    return model


# --- outside the grader: under torchrun ----------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """The sharding outside the grader, under ``torchrun``, one process a GPU:

        torchrun --standalone --nproc-per-node=8 -m rooflab.kernels.fsdp

    NCCL with one GPU a rank where there are enough GPUs, gloo on the CPU otherwise. Each
    rank trains the lab's model, sharded by ``shard_layers`` (``--prefetch`` to prefetch),
    on its own slice of every step's batch; rank 0 prints each step's loss (the mean over
    ranks), its time, and the bytes a rank holds against 16Ψ/N.
    """
    import argparse
    import time

    from rooflab.kernels.collectives import join_torchrun_group

    parser = argparse.ArgumentParser(prog="python -m rooflab.kernels.fsdp")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4, help="sequences a rank a step")
    parser.add_argument("--length", type=int, default=512, help="tokens a sequence")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prefetch", action="store_true")
    args = parser.parse_args(argv)
    rank, world, device = join_torchrun_group()
    gpus = device.type == "cuda"
    torch.manual_seed(0)  # the same weights on every rank
    model = TinyTransformer(args.dim, args.heads, args.layers).to(device)
    psi = sum(p.numel() for p in model.parameters())
    shards = shard_layers(model, prefetch=args.prefetch)
    optimizer = torch.optim.AdamW(shards, lr=1e-3)
    generator = torch.Generator(device=device).manual_seed(1)
    for step in range(args.steps):
        shape = (world * args.batch, args.length, args.dim)
        x, y = (torch.randn(shape, generator=generator, device=device)
                [rank * args.batch:(rank + 1) * args.batch] for _ in range(2))
        start = time.perf_counter()
        loss = loss_fn(model, x, y)
        loss.backward()
        optimizer.step()
        if gpus:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        held = sum(memory_held(shards, optimizer).values())
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step}: loss {mean.item() / world:.6f}, {elapsed * 1e3:.1f} ms; "
                  f"{held:,} B held a rank, 16Ψ/N = {16 * psi / world:,.0f} B")
    if rank == 0:
        print(f"{world} ranks on {'NCCL' if gpus else 'gloo'}, {args.layers} blocks of width "
              f"{args.dim}, prefetch {'on' if args.prefetch else 'off'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
