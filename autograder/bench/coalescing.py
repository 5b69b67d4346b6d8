"""``rooflab bench coalescing``: lab 01's vector add and transposes against torch's."""

from __future__ import annotations

import torch

from ..problem import Cost
from .workload import Workload


def coalescing_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.transpose import transpose, transpose_rows
    from rooflab.kernels.vector_add import vector_add

    n = 1 << 26
    side = 8192
    return [
        Workload(f"n={n}", torch.float32, Cost(n, 3 * n * 4),
                 lambda: (torch.randn(n, device=device), torch.randn(n, device=device)),
                 {"torch add": torch.add, "rooflab vector_add": vector_add}, torch.add),
        Workload(f"{side}x{side}", torch.float32, Cost(0, 2 * side * side * 4),
                 lambda: (torch.randn(side, side, device=device),),
                 {"torch x.T.contiguous()": lambda x: x.T.contiguous(),
                  "rooflab transpose (tiles)": transpose,
                  "rooflab transpose_rows": transpose_rows},
                 lambda x: x.T.contiguous()),
    ]
