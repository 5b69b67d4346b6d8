"""Lab 01 — memory coalescing. Both kernels move bytes and do (almost) no arithmetic,
so they are graded against the bandwidth roof."""

from __future__ import annotations

import torch

from ..problem import (
    Case,
    Cost,
    Draw,
    Hidden,
    Levels,
    Problem,
    Span,
    Structure,
    random_tensor,
    register,
)


def vector_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    """Two random vectors of ``n`` elements."""
    n = case.sizes["n"]
    return (random_tensor((n,), case.dtype, gen, device, case.scale),
            random_tensor((n,), case.dtype, gen, device, case.scale))


def vector_cost(case: Case) -> Cost:
    """Two vectors read, one written: 3n elements moved, one FLOP an element."""
    n, size = case.sizes["n"], case.dtype.itemsize
    return Cost(flops=n, bytes=3 * n * size, dtype="fp32")


register(Problem(
    id="coalescing/vector_add",
    title="Vector add with a masked tail",
    signature="(x: Tensor[n], y: Tensor[n]) -> Tensor[n]  # x + y",
    make_inputs=vector_inputs,
    reference=lambda x, y: x + y,
    cost=vector_cost,
    cpu_cases=[
        Case({"n": 1}, torch.float32, note="one element"),
        Case({"n": 1000}, torch.float32, note="ragged tail"),
        Case({"n": 4097}, torch.float16, note="ragged tail"),
        Case({"n": 3000}, torch.float16, scale=2e4, note="large values"),
        Case({"n": 2049}, torch.bfloat16),
    ],
    # 2^26 fp32 elements move 768 MB: far beyond any L2, yet small enough to check on a
    # 16 GB card (checking holds float64 copies of inputs, reference and output).
    gpu_cases=[
        Case({"n": 98_432 + 17}, torch.float32, note="ragged tail"),
        Case({"n": 1_000_003}, torch.float16, scale=2e4, note="large values"),
        Case({"n": (1 << 25) + 7}, torch.bfloat16),
        Case({"n": 1 << 26}, torch.float32, note="fills the chip"),
    ],
    # Odd lengths: a multiple of no block, so an unmasked last block fails whatever BLOCK.
    hidden=Hidden(cpu=Draw({"n": Span(1025, 4095, odd=True)}, count=2),
                  gpu=Draw({"n": Span((1 << 20) + 1, (1 << 24) - 1, odd=True)})),
    levels=Levels(passing=0.7, good=0.8, excellent=0.9),
    structure=Structure(sector_efficiency=0.9, dram_over_compulsory=1.5),
    library_ops=frozenset({"add", "add_", "sub", "sum", "stack", "cat", "copy_"}),
    solution="rooflab.kernels.vector_add:vector_add",
    hints=("Program pid covers the elements pid * BLOCK ... pid * BLOCK + BLOCK - 1: "
           "tl.program_id(0) and tl.arange(0, BLOCK) give you those offsets.",
           "The last block runs past n: build mask = offsets < n and pass it to every "
           "tl.load and tl.store."),
    answer_in=("add_kernel",),
))


def _matrix_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    m, n = case.sizes["m"], case.sizes["n"]
    if "x" in case.transposed:  # an (m, n) view of a row-major (n, m) matrix
        return (random_tensor((n, m), case.dtype, gen, device, case.scale).T,)
    return (random_tensor((m, n), case.dtype, gen, device, case.scale),)


def _transpose_cost(case: Case) -> Cost:
    m, n = case.sizes["m"], case.sizes["n"]
    return Cost(flops=0, bytes=2 * m * n * case.dtype.itemsize, dtype="fp32")


register(Problem(
    id="coalescing/transpose",
    title="Matrix transpose into a contiguous result",
    signature="(x: Tensor[m, n]) -> Tensor[n, m]  # x.T, contiguous",
    make_inputs=_matrix_inputs,
    reference=lambda x: x.T.contiguous(),
    cost=_transpose_cost,
    cpu_cases=[
        Case({"m": 1, "n": 37}, torch.float32),
        Case({"m": 67, "n": 130}, torch.float32, note="ragged tiles"),
        Case({"m": 96, "n": 33}, torch.float16, note="ragged tiles"),
        Case({"m": 40, "n": 70}, torch.float32, transposed=("x",)),
        Case({"m": 96, "n": 128}, torch.float32, note="aligned rows: traced for traffic"),
    ],
    gpu_cases=[
        Case({"m": 1023, "n": 4097}, torch.float32, note="ragged tiles"),
        Case({"m": 3000, "n": 5001}, torch.bfloat16, note="ragged tiles"),
        Case({"m": 2000, "n": 3001}, torch.float16, transposed=("x",)),
        Case({"m": 8192, "n": 8192}, torch.float32, note="fills the chip"),
    ],
    levels=Levels(passing=0.7, good=0.8, excellent=0.9),
    # On a CPU: reads and writes must both use (nearly) whole sectors, as a tile does.
    structure=Structure(sector_efficiency=0.9),
    out_contiguous=True,
    library_ops=frozenset({"clone", "copy_", "t_copy", "transpose_copy", "permute_copy"}),
    solution="rooflab.kernels.transpose:transpose",
    hints=("Give each program a BLOCK_M × BLOCK_N tile: rows from program_id(0), columns "
           "from program_id(1); make 2-D offsets with rows[:, None] and cols[None, :].",
           "Read the tile through x's strides and write the same tile through out's "
           "strides with rows and columns swapped; mask both dimensions."),
    answer_in=("transpose_kernel",),
))


def _strided_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    n, stride = case.sizes["n"], case.sizes["stride"]
    return (random_tensor((n,), case.dtype, gen, device, case.scale), stride)


def _strided_cost(case: Case) -> Cost:
    n, stride = case.sizes["n"], case.sizes["stride"]
    kept = -(-n // stride)
    return Cost(flops=0, bytes=2 * kept * case.dtype.itemsize)


register(Problem(
    id="coalescing/strided_copy",
    title="Copy every stride-th element into a contiguous vector",
    signature="(x: Tensor[n], stride: int) -> Tensor[ceil(n / stride)]  # x[::stride]",
    make_inputs=_strided_inputs,
    reference=lambda x, stride: x[::stride].contiguous(),
    cost=_strided_cost,
    cpu_cases=[
        Case({"n": 1000, "stride": 1}, torch.float32),
        Case({"n": 1001, "stride": 4}, torch.float32, note="ragged tail"),
        Case({"n": 3000, "stride": 7}, torch.float16),
    ],
    gpu_cases=[
        Case({"n": 10_000_019, "stride": 3}, torch.float32),
        Case({"n": (1 << 26) + 5, "stride": 16}, torch.float16),
    ],
    # A strided read cannot reach the bandwidth roof: that is the lesson, not a failure.
    timed=False,
    out_contiguous=True,
    library_ops=frozenset({"clone", "copy_", "slice", "index_select", "contiguous"}),
    solution="rooflab.kernels.strided_copy:strided_copy",
    hints=("Program p handles output elements p*BLOCK ... p*BLOCK + BLOCK - 1.",
           "Output element i is input element i * stride; the mask is on the output index."),
    answer_in=("strided_copy_kernel",),
))
