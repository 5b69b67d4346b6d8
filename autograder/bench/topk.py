"""``rooflab bench topk``: the lab's top-k kernels against ``torch.topk``, on a GPU.

Each workload times ``torch.topk`` (the baseline, first) and the course's kernels on the
same fp32 scores, and checks their values against it. The shapes are the ones the lab
states its goals at:

=====================  ======  =======================================  ==================
shape                  k       torch.topk on an H200 (median)           goal
=====================  ======  =======================================  ==================
256 × 262144           256     862 µs                                   ≥ 3× torch.topk
256 × 262144           1024    864 µs                                   ≥ 3× torch.topk
4096 × 32768           64      1609 µs                                  ≥ 4× torch.topk
8 × 131072             50      (few rows: one program per row idles)    ≥ 1× torch.topk
stream 2**26, 2**22    1024    (torch.topk of the whole stream at once)  shown
=====================  ======  =======================================  ==================

A kernel here returns the values only (the benchmark compares one tensor); the indices
are computed all the same. Cost: no FLOPs, and the compulsory bytes of the input read once
and k values and int64 indices written once per row.
"""

from __future__ import annotations

import torch

from ..problem import Cost
from .workload import Workload


def _values(topk):
    """A top-k function as the benchmark calls it: (x) -> the values."""
    return lambda x, k: topk(x, k)[0]


def _torch_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.topk(x, k).values


def _stream(chunk: int):
    """StreamingTopK over a 1-D stream fed in chunks of ``chunk``: (x, k) -> the values."""
    from rooflab.kernels.topk import StreamingTopK

    def run(x: torch.Tensor, k: int) -> torch.Tensor:
        stream = StreamingTopK(k)
        for start in range(0, x.numel(), chunk):
            stream.update(x[start:start + chunk])
        return stream.result()[0]

    return run


def topk_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.topk import topk_radix, topk_rows

    loads = []
    dtype = torch.float32
    s = dtype.itemsize
    for m, n, k in ((256, 262144, 256), (256, 262144, 1024), (4096, 32768, 64),
                    (8, 131072, 50)):
        loads.append(Workload(
            f"{m}x{n} k={k}", dtype, Cost(0, m * n * s + m * k * (s + 8)),
            lambda m=m, n=n, k=k: (torch.randn(m, n, device=device, dtype=dtype), k),
            {"torch.topk": _torch_topk,
             "rooflab topk_radix": _values(topk_radix),
             "rooflab topk_rows (one program per row)": _values(topk_rows)},
            _torch_topk))
    n, chunk, k = 1 << 26, 1 << 22, 1024
    loads.append(Workload(
        f"stream {n} in chunks of {chunk} k={k}", dtype, Cost(0, n * s + k * (s + 8)),
        lambda: (torch.randn(n, device=device, dtype=dtype), k),
        {"torch.topk (the whole stream at once)": _torch_topk,
         "rooflab StreamingTopK": _stream(chunk)},
        _torch_topk))
    return loads
