"""``rooflab bench matmul``: lab 02's autotuned matmul against ``torch.matmul``, in bf16,
fp16 and (as TF32 on both sides) fp32."""

from __future__ import annotations

import torch

from ..problem import Cost
from .workload import Workload


def torch_matmul_tf32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul with TF32 allowed for fp32 (PyTorch's default is true fp32): the fair
    baseline for a kernel whose fp32 tl.dot runs as TF32."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        return torch.matmul(a, b)
    finally:
        torch.set_float32_matmul_precision(previous)


def matmul_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.matmul import matmul_autotuned

    loads = []
    shapes = [(n, n, n) for n in (1024, 2048, 4096, 8192)] + [(16, 8192, 8192),
                                                              (8192, 8192, 128)]
    dtypes = [(torch.bfloat16, "bf16"), (torch.float16, "fp16")]
    # Every shape in bf16 and fp16; fp32 inputs (TF32 on both sides) at one size.
    for shape, dtype, compute in ([(s, d, c) for s in shapes for d, c in dtypes]
                                  + [((4096, 4096, 4096), torch.float32, "tf32")]):
        m, n, k = shape
        cost = Cost(2 * m * n * k, (m * k + k * n + m * n) * dtype.itemsize, compute)
        baseline = ("torch.matmul (TF32)", torch_matmul_tf32) if compute == "tf32" else \
            ("torch.matmul", torch.matmul)
        loads.append(Workload(
            f"{m}x{n}x{k}", dtype, cost,
            lambda m=m, n=n, k=k, dtype=dtype: (
                torch.randn(m, k, device=device, dtype=dtype),
                torch.randn(k, n, device=device, dtype=dtype)),
            dict([baseline, ("rooflab matmul (autotuned)", matmul_autotuned)]),
            baseline[1]))
    return loads
