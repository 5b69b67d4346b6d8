"""All-reduce: every rank ends with the sum of every rank's tensor.

Data-parallel training does this to every gradient, every step, so its cost is counted
in bytes on the wire: with N ranks and a tensor of S bytes, how much must each rank send?
The ladder:

1. ``naive_all_reduce``: every rank sends its whole tensor to every other rank and adds
   up what it gets. (N − 1)·S bytes sent per rank: it grows with N.
2. ``ring_allreduce_deadlock``: a ring in which every rank first *sends* to its right
   neighbour with a blocking ``dist.send``, then receives from its left. It never ends:
   a send completes only once the peer receives, and every rank is sending.
3. ``ring_allreduce``: the ranks in a ring, the tensor in N chunks. A reduce-scatter
   (N − 1 steps, each rank sending one chunk to its right neighbour and adding the one
   from its left into its own) leaves every chunk summed on one rank; an all-gather
   (N − 1 more steps) passes the summed chunks around. 2(N − 1) messages of S/N bytes:
   2(N − 1)/N·S per rank, under 2S whatever N, and the least any all-reduce can send
   (Patarasuk and Yuan, 2009).

4. ``add_into``: on GPUs, the addition inside each reduce-scatter step, chunk += incoming,
   is a kernel of its own: it reads two chunks and writes one, so it is bound by memory
   bandwidth, and a step is only as quick as the slower of its transfer and its addition.

You will learn about:

* point-to-point messages in torch.distributed, blocking (``send``/``recv``) and not
  (``isend``/``irecv`` and ``wait``), and why the blocking pair deadlocks in a ring;
* the bandwidth cost of a collective, 2(N − 1)/N·S, the "bus bandwidth" of nccl-tests;
* chunks that do not divide evenly: the tensor is rarely a multiple of N.

Every function is called on every rank, inside an initialised default process group,
with that rank's tensor, and returns the sum (working in place, as ``dist.all_reduce``
does). The same code runs on gloo processes on a CPU and under ``torchrun`` with NCCL.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl


def naive_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The starting point: send everything to everyone.

    Rank r posts N − 1 sends of its whole tensor and N − 1 receives, then adds the N
    tensors up in rank order, so every rank computes the same bits. Bytes sent per rank:
    (N − 1)·S, N/2 times what the ring sends: four times as much at N = 8.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.contiguous().view(-1)
    received = [flat if peer == rank else torch.empty_like(flat) for peer in range(world)]
    requests = [dist.isend(flat, peer) for peer in range(world) if peer != rank]
    requests += [dist.irecv(received[peer], peer) for peer in range(world) if peer != rank]
    for request in requests:
        request.wait()
    total = received[0].clone()
    for peer in range(1, world):
        total += received[peer]
    return total.view_as(x)


def ring_allreduce_deadlock(x: torch.Tensor) -> torch.Tensor:
    """A ring that hangs: do not write this one.

    Every rank calls the blocking ``dist.send`` to its right neighbour first. gloo ends a
    send only once the receiver has posted the matching receive (it keeps no buffer;
    NCCL does the same beyond small messages), and every rank is still sending: none
    reaches its ``recv``. ``ring_allreduce`` posts both halves of each step at once.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(x.contiguous().view(-1).tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        incoming = torch.empty_like(chunks[(rank - step - 1) % world])
        dist.send(chunks[(rank - step) % world], right)  # everyone waits here, forever
        dist.recv(incoming, left)
        chunks[(rank - step - 1) % world] += incoming
    return x


def ring_allreduce(x: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Ring all-reduce: a reduce-scatter, then an all-gather, around the ring of ranks.
    With ``average`` (floating tensors), the mean over ranks instead of the sum, as data
    parallelism wants for gradients.

    The tensor is cut into N chunks whose sizes differ by at most one element
    (``tensor_split``: any size, even one smaller than N, where some chunks are empty).
    In step s of the reduce-scatter, rank r sends chunk r − s to rank r + 1 and receives
    chunk r − s − 1 from rank r − 1, adding it into its own: after N − 1 steps chunk
    r + 1 holds the sum of every rank's, accumulated around the ring from rank r + 1.
    In step s of the all-gather, rank r sends its summed chunk r + 1 − s and receives
    chunk r − s, which its left neighbour has summed. Each step posts the send and the
    receive together (``isend``/``irecv``): with blocking calls every rank would send
    first and wait forever (``ring_allreduce_deadlock``). The mean divides each summed
    chunk once, on the rank that finished it, before the all-gather: 1/N of the divisions
    of dividing the whole tensor on every rank, and every rank gets the same bits.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.contiguous().view(-1)  # x itself when contiguous: the sum is written in place
    chunks = flat.tensor_split(world)  # views of flat, contiguous, as send requires
    right, left = (rank + 1) % world, (rank - 1) % world
    ### BEGIN SOLUTION
    ### KEY
    for step in range(world - 1):  # reduce-scatter
        mine, theirs = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
    ### END KEY
        incoming = torch.empty_like(theirs)
        ### KEY
        requests = [dist.isend(mine, right), dist.irecv(incoming, left)]
        ### END KEY
        for request in requests:
            request.wait()
        ### KEY
        # The partial sum from the left, plus this rank's own: the ring's order.
        theirs += incoming
        ### END KEY
    if average:  # chunk r + 1 is complete here, and only here
        chunks[(rank + 1) % world].div_(world)
    for step in range(world - 1):  # all-gather
        ### KEY
        done, arriving = chunks[(rank + 1 - step) % world], chunks[(rank - step) % world]
        ### END KEY
        requests = [dist.isend(done, right), dist.irecv(arriving, left)]
        for request in requests:
            request.wait()
    ### END SOLUTION
    return flat.view_as(x)


@triton.jit
def add_into_kernel(chunk_ptr, incoming_ptr, out_ptr, n, BLOCK: tl.constexpr):
    ### BEGIN SOLUTION
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n  # a chunk is rarely a multiple of the block
    ### KEY
    # Add in fp32 and round once: the sum of two fp16 or bf16 values correctly rounded, as
    # torch's own add gives it (and the interpreter cannot add in bf16).
    a = tl.load(chunk_ptr + offsets, mask=mask).to(tl.float32)
    ### END KEY
    b = tl.load(incoming_ptr + offsets, mask=mask).to(tl.float32)
    ### KEY
    tl.store(out_ptr + offsets, (a + b).to(out_ptr.dtype.element_ty), mask=mask)
    ### END KEY
    ### END SOLUTION


def add_into(chunk: torch.Tensor, incoming: torch.Tensor, out: torch.Tensor | None = None,
             block: int = 1024) -> torch.Tensor:
    """out = chunk + incoming, elementwise, in one pass: each byte of the two chunks read
    once, each byte of the sum written once. ``out`` may be ``chunk`` itself (the default),
    which is the ring's step, chunk += incoming: each element is read before it is
    written, by the same program. Contiguous tensors of one shape and dtype."""
    out = chunk if out is None else out
    assert chunk.shape == incoming.shape == out.shape, "chunk, incoming and out must match"
    assert chunk.dtype == incoming.dtype == out.dtype, "one dtype for all three"
    assert chunk.is_contiguous() and incoming.is_contiguous() and out.is_contiguous()
    n = out.numel()
    if n:  # an empty chunk (a tensor smaller than the ring) needs no launch
        add_into_kernel[(triton.cdiv(n, block),)](chunk, incoming, out, n, BLOCK=block)
    return out


def join_torchrun_group() -> tuple[int, int, torch.device]:
    """Join the process group ``torchrun`` describes (its environment variables): NCCL
    with one GPU a rank where there are enough GPUs, gloo on the CPU otherwise. This
    rank's number, the world size, and the device its tensors go on."""
    import os

    # Import torch.distributed.nn before the group exists. Its functions take
    # ``group=group.WORLD`` as a default argument, so importing it afterwards (an
    # optimizer's first step does, through torch._dynamo) keeps the default group alive
    # past ``destroy_process_group``: gloo's threads then outlive the interpreter and can
    # abort the process as it exits (``terminate called without an active exception``).
    import torch.distributed.nn  # noqa: F401

    world = int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if gpus else "gloo")
    return dist.get_rank(), world, torch.device("cuda" if gpus else "cpu")


def main(argv: list[str] | None = None) -> None:
    """The same functions outside the grader, under ``torchrun``; on eight GPUs:

        torchrun --standalone --nproc-per-node=8 -m rooflab.kernels.collectives

    NCCL with one GPU per rank where there are enough GPUs, gloo on the CPU otherwise.
    Rank 0 prints whether the ring's sum is ``dist.all_reduce``'s (exactly, for
    integers) and both times, with the bus bandwidth 2(N − 1)/N·S / t of each.

    The NCCL path is untested: this has not been run on a machine with several GPUs (none
    was available). The gloo path is tested (``tests/test_collectives.py`` runs this under
    ``torch.distributed.run`` on three CPU ranks).
    """
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m rooflab.kernels.collectives")
    parser.add_argument("--size", type=int, default=1 << 24, help="elements per rank")
    args = parser.parse_args(argv)
    rank, world, device = join_torchrun_group()
    gpus = device.type == "cuda"
    generator = torch.Generator(device=device).manual_seed(rank)
    report = []
    for dtype in (torch.float32, torch.int64):
        x = torch.randn(args.size, generator=generator, device=device).mul(1000).to(dtype)
        times = {}
        for name, function in (("dist.all_reduce", _library), ("ring_allreduce", ring_allreduce)):
            data = x.clone()
            dist.barrier()
            start = time.perf_counter()
            result = function(data)
            if gpus:
                torch.cuda.synchronize()
            times[name] = (time.perf_counter() - start, result)
        (library_s, expected), (ring_s, got) = times.values()
        if dtype.is_floating_point:
            same = torch.allclose(got, expected, rtol=1e-5, atol=1e-3)
        else:
            same = torch.equal(got, expected)
        moved = 2 * (world - 1) / world * x.numel() * x.element_size()
        report.append(f"{str(dtype)[6:]}: ring_allreduce {'matches' if same else 'DIFFERS FROM'} "
                      f"dist.all_reduce; ring {ring_s * 1e3:.1f} ms "
                      f"({moved / ring_s / 1e9:.2f} GB/s bus), dist.all_reduce "
                      f"{library_s * 1e3:.1f} ms ({moved / library_s / 1e9:.2f} GB/s bus)")
    if rank == 0:
        print(f"{world} ranks on {'NCCL' if gpus else 'gloo'}, {args.size:,} elements each")
        print("\n".join(report))
    dist.destroy_process_group()


def _library(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


if __name__ == "__main__":
    main()
