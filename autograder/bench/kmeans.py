"""Benchmarks for lab 06, k-means: one Lloyd step, and the update on its own.

``kmeans_workloads(device)`` gives the workloads of ``rooflab bench kmeans``:

* one Lloyd step (assign, then update) in fp32 at n = 2²⁰, d = 128, k = 1024 and at
  n = 2²², d = 64, k = 256, the baseline PyTorch's cdist + argmin + index_add (an H200
  measured 14.9 ms and 17.7 ms), against the course's fused assignment with the sorted
  update, and against the naive assignment (the n × k matrix in memory) with atomics;
* the update alone at n = 2²², d = 64, k = 256, on labels spread uniformly and on labels
  with half of the points in cluster 0, where atomics contend: the sorted update should
  take at most twice its uniform time there.

Each kernel returns the new centroids (k × d, fp32), which the benchmark checks against
the baseline's before and after timing. The cost of a step is 2nkd FLOPs for the
distances plus nd additions for the update, on the TF32 roof (the distances' tl.dot runs
on fp32 tiles), and its compulsory bytes are x read once, the labels written once and the
centroids read and written once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..problem import Cost
from .workload import NotAvailable, Workload

STEPS = [(1 << 20, 128, 1024), (1 << 22, 64, 256)]  # (n, d, k)
UPDATE = (1 << 22, 64, 256)


def torch_update(x: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """New centroids with index_add and bincount; an empty cluster's centroid is 0."""
    sums = torch.zeros((k, x.shape[1]), dtype=torch.float32, device=x.device)
    sums.index_add_(0, labels, x.float())
    counts = torch.bincount(labels, minlength=k).clamp_min(1)
    return sums / counts[:, None].float()


def torch_step(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """One Lloyd step in PyTorch: cdist + argmin + index_add, the baseline."""
    return torch_update(x, torch.cdist(x, c).argmin(dim=1), c.shape[0])


def _cuda_update(x: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    from ..device.cuda import cupy_missing

    if not torch.cuda.is_available() or cupy_missing():
        raise NotAvailable("the CUDA C update needs a GPU and CuPy")
    from rooflab.kernels.kmeans_cuda import update_cuda

    return update_cuda(x, labels, k)[0]


def step_cost(n: int, d: int, k: int) -> Cost:
    return Cost(2 * n * k * d + n * d, 4 * n * d + 8 * n + 2 * 4 * k * d, "tf32")


def update_cost(n: int, d: int, k: int) -> Cost:
    return Cost(n * d + k * d, 4 * n * d + 8 * n + 4 * k * d + 8 * k, "fp32")


def _step_inputs(n: int, d: int, k: int, device: str) -> Callable[[], tuple]:
    def make() -> tuple:
        x = torch.randn(n, d, device=device)
        start = x[torch.randperm(n, device=device)[:k]].clone()  # centroids on points
        return x, start

    return make


def _update_inputs(n: int, d: int, k: int, device: str, skewed: bool) -> Callable[[], tuple]:
    def make() -> tuple:
        x = torch.randn(n, d, device=device)
        labels = torch.randint(k, (n,), device=device)
        if skewed:  # half of all points in cluster 0: its atomics all hit the same row
            labels = torch.where(torch.rand(n, device=device) < 0.5, 0, labels)
        return x, labels, k

    return make


def _workloads(device: str, steps: list[tuple[int, int, int]],
               update: tuple[int, int, int]) -> list[Workload]:
    from rooflab.kernels.kmeans import assign, assign_naive, update_atomic, update_sorted

    loads = []
    for n, d, k in steps:
        loads.append(Workload(
            f"step n={n} d={d} k={k}", torch.float32, step_cost(n, d, k),
            _step_inputs(n, d, k, device),
            {"torch (cdist + argmin + index_add)": torch_step,
             "rooflab assign + update_sorted": lambda x, c: update_sorted(
                 x, assign(x, c), c.shape[0])[0],
             "rooflab assign_naive + update_atomic": lambda x, c: update_atomic(
                 x, assign_naive(x, c), c.shape[0])[0]},
            torch_step))
    n, d, k = update
    for skewed, label in ((False, "uniform"), (True, "half in cluster 0")):
        loads.append(Workload(
            f"update n={n} d={d} k={k} {label}", torch.float32, update_cost(n, d, k),
            _update_inputs(n, d, k, device, skewed),
            {"torch index_add": torch_update,
             "rooflab update_atomic (Triton)": lambda x, labels, k: update_atomic(
                 x, labels, k)[0],
             "rooflab update_cuda (CUDA C atomics)": _cuda_update,
             "rooflab update_sorted": lambda x, labels, k: update_sorted(x, labels, k)[0]},
            torch_update))
    return loads


def kmeans_workloads(device: str) -> list[Workload]:
    """The workloads of ``rooflab bench kmeans``: two Lloyd steps and the update on
    uniform and skewed labels, fp32, first kernel the PyTorch baseline."""
    return _workloads(device, STEPS, UPDATE)
