"""``rooflab bench softmax``: lab 03's three softmaxes against ``torch.softmax``, and the
online one's block width on rows too long for one block."""

from __future__ import annotations

import torch

from ..problem import Cost
from .workload import Workload


def softmax_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.softmax import softmax_fused, softmax_naive, softmax_online

    loads = []
    for m, n in ((16384, 1024), (8192, 8192), (4096, 32768)):
        dtype = torch.float16
        loads.append(Workload(
            f"{m}x{n}", dtype, Cost(5 * m * n, 2 * m * n * dtype.itemsize),
            lambda m=m, n=n, dtype=dtype: (torch.randn(m, n, device=device, dtype=dtype),),
            {"torch.softmax": lambda x: torch.softmax(x, dim=-1),
             "rooflab softmax_naive (3 passes)": softmax_naive,
             "rooflab softmax_fused": softmax_fused,
             "rooflab softmax_online": softmax_online},
            lambda x: torch.softmax(x, dim=-1)))
    # The case softmax/online is timed on: rows too long for one block, and too many in
    # flight for L2 to keep them for the second read. Wider blocks keep more bytes in
    # flight per program; these rows say how much that is worth.
    m, n, dtype = 1024, 65536, torch.bfloat16
    loads.append(Workload(
        f"{m}x{n}", dtype, Cost(5 * m * n, 2 * m * n * dtype.itemsize),
        lambda: (torch.randn(m, n, device=device, dtype=dtype),),
        {"torch.softmax": lambda x: torch.softmax(x, dim=-1),
         **{f"rooflab softmax_online (block {block})":
            (lambda x, block=block: softmax_online(x, block=block))
            for block in (1024, 2048, 4096, 8192)}},
        lambda x: torch.softmax(x, dim=-1)))
    return loads
