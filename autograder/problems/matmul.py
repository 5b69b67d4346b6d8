"""Lab 02 — matrix multiplication. Large matmuls are compute-bound: graded against the
tensor-core roof of the dtype."""

from __future__ import annotations

import torch

from ..problem import (
    DEFAULT_TOLERANCES,
    Case,
    Cost,
    Levels,
    Problem,
    Tolerance,
    random_tensor,
    register,
)


def _matrix(rows: int, cols: int, transposed: bool, case: Case, gen: torch.Generator,
            device: torch.device) -> torch.Tensor:
    """A rows×cols matrix; if ``transposed``, a view of a row-major cols×rows one."""
    if transposed:
        return random_tensor((cols, rows), case.dtype, gen, device, case.scale).T
    return random_tensor((rows, cols), case.dtype, gen, device, case.scale)


def _inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    m, n, k = case.sizes["m"], case.sizes["n"], case.sizes["k"]
    return (_matrix(m, k, "a" in case.transposed, case, gen, device),
            _matrix(k, n, "b" in case.transposed, case, gen, device))


def _cost(case: Case) -> Cost:
    m, n, k = case.sizes["m"], case.sizes["n"], case.sizes["k"]
    size = case.dtype.itemsize
    compute = {torch.float32: "tf32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    return Cost(flops=2 * m * n * k, bytes=(m * k + k * n + m * n) * size,
                dtype=compute.get(case.dtype, "fp32"))


register(Problem(
    id="matmul/tiled",
    title="Tiled matmul: one block of C per program",
    signature="(a: Tensor[m, k], b: Tensor[k, n]) -> Tensor[m, n]  # a @ b",
    make_inputs=_inputs,
    reference=lambda a, b: a @ b,
    cost=_cost,
    cpu_cases=[
        Case({"m": 64, "n": 64, "k": 64}, torch.float32),
        Case({"m": 70, "n": 33, "k": 47}, torch.float32, note="ragged tiles"),
        Case({"m": 50, "n": 65, "k": 40}, torch.float16, transposed=("b",)),
        Case({"m": 33, "n": 40, "k": 72}, torch.float32, transposed=("a",)),
        Case({"m": 32, "n": 40, "k": 1000}, torch.float16, note="long K"),
        Case({"m": 64, "n": 48, "k": 80}, torch.bfloat16),
    ],
    gpu_cases=[
        Case({"m": 1000, "n": 1001, "k": 999}, torch.float32, note="ragged tiles"),
        Case({"m": 2048, "n": 1536, "k": 1000}, torch.float16, transposed=("b",)),
        Case({"m": 1536, "n": 2048, "k": 1024}, torch.float16, transposed=("a",)),
        Case({"m": 4096, "n": 4096, "k": 4096}, torch.bfloat16, note="fills the chip"),
    ],
    levels=Levels(passing=0.3, good=0.5, excellent=0.7),
    # fp32 accumulation is what the exercise asks for: a correct fp16 result is off by
    # rounding alone (~2.8e-4); accumulating in fp16 over K ≥ 1000 is off by ~9e-4.
    tolerances={**DEFAULT_TOLERANCES, "fp16": Tolerance(rel=6e-4, elem=4e-3),
                "bf16": Tolerance(rel=5e-3, elem=3e-2)},
    library_ops=frozenset({"mm", "matmul", "addmm", "bmm", "baddbmm", "dot", "einsum",
                           "linear", "_scaled_mm", "mv", "tensordot"}),
    tf32_on_gpu=True,
))
