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
    Structure,
    Tolerance,
    random_tensor,
    register,
)
from . import traced


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


# --- how the answer was computed (from the interpreter's trace) ---------------------------

ORDER_CASE = "traced for the order of its programs"


def grouped_program_order(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """matmul/grouped: programs take their tiles in grouped order, whatever the tile size:
    read from which tile of C each program stored, in launch order."""
    launch = next((launch for launch in reversed(launches)
                   if traced.bytes_moved([launch], output, "store")), None)
    if launch is None or case.note != ORDER_CASE:
        return ""
    tiles = traced.tiles_in_launch_order(launch, output)
    tiles_m, tiles_n = 1 + max(m for m, _ in tiles), 1 + max(n for _, n in tiles)
    group = traced.group_of(tiles)
    if group is not None and 1 < group < tiles_m:
        return ""
    where = f"({tiles_m} × {tiles_n} tiles of C at {case.label})"
    if group == 1:
        return (f"the programs take their tiles in row-major order {where}: program 1 computes "
                "the tile right of program 0's. Grouped order walks GROUP_M rows of tiles "
                "down a column before moving right, so that programs running at once share "
                "rows of A and columns of B")
    if group == tiles_m:
        return (f"the programs walk down whole columns of tiles {where}: one group as tall as "
                "C; make groups of GROUP_M rows of tiles, fewer than the rows of tiles")
    return (f"the programs take their tiles in neither row-major nor grouped order {where}: "
            f"program 1 computes tile {tiles[1]}, program 2 tile {tiles[2]}")


def written_once(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """matmul/epilogue: C is stored once. A second kernel (or a second pass) for the bias
    and ReLU stores it again, after reading it back."""
    stored = traced.requested(launches, "store")
    needed = output.numel() * output.element_size()
    if stored <= needed:
        return ""
    return (f"stores {stored / needed:.2f}× the bytes of C: C is written, then read back and "
            "written again for the bias and ReLU. Apply them to the tile while it is still "
            "in registers, before its one store (the epilogue)")


def tensor_core_work(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """matmul/tensor_core: the tensor cores do the multiplication — all of its FLOPs are in
    tl.dot, and fp32 tiles go in as TF32, not IEEE fp32 on the CUDA cores."""
    m, n, k = case.sizes["m"], case.sizes["n"], case.sizes["k"]
    dots = [dot for launch in launches for dot in launch.dots]
    if any(dot.operand == "fp32" and dot.input_precision == "ieee" for dot in dots):
        return ("tl.dot with input_precision=\"ieee\" multiplies fp32 on the CUDA cores, about "
                "15× slower than the tensor cores: leave the default (TF32) for fp32 tiles")
    flops = sum(2 * dot.m * dot.n * dot.k for dot in dots if not dot.constant_operand)
    if flops < 2 * m * n * k:
        shown = " (a dot on a tile of one repeated value, zeros say, multiplies nothing)" if any(
            dot.constant_operand for dot in dots) else ""
        return (f"its tl.dot calls do {flops / (2 * m * n * k):.0%} of the {2 * m * n * k:,} "
                f"FLOPs of this product{shown}: the multiplication must run in tl.dot, on "
                "the tensor cores, not in elementwise arithmetic")
    return ""


MATMUL_OPS = frozenset({"mm", "matmul", "addmm", "bmm", "baddbmm", "dot", "einsum", "linear",
                        "_scaled_mm", "mv", "tensordot"})
# fp32 accumulation is what the exercises ask for: a correct fp16 result is off by
# rounding alone (~2.8e-4); accumulating in fp16 over K ≥ 1000 is off by ~9e-4.
MATMUL_TOLERANCES = {**DEFAULT_TOLERANCES, "fp16": Tolerance(rel=6e-4, elem=4e-3),
                     "bf16": Tolerance(rel=5e-3, elem=3e-2)}


def _matmul_problem(id: str, title: str, **fields) -> Problem:
    """The fields every matmul exercise shares: (a, b) -> a @ b on any strides."""
    return register(Problem(
        id=id, title=title,
        signature="(a: Tensor[m, k], b: Tensor[k, n]) -> Tensor[m, n]  # a @ b",
        make_inputs=_inputs, reference=lambda a, b: a @ b,
        library_ops=MATMUL_OPS, tolerances=MATMUL_TOLERANCES, **{"cost": _cost, **fields},
    ))


_matmul_problem(
    "matmul/naive", "Naive matmul: a block of one row of C per program, K one element at a time",
    solution="rooflab.kernels.matmul:matmul_rows",
    # One interpreted program per row and K loop steps of one element: keep these small.
    cpu_cases=[
        Case({"m": 16, "n": 24, "k": 20}, torch.float32),
        Case({"m": 9, "n": 70, "k": 13}, torch.float32, note="ragged"),
        Case({"m": 12, "n": 40, "k": 16}, torch.float16, transposed=("b",)),
        # Summing 128 products in an fp16 accumulator is off by 1.1e-3 to 3e-3 (1000
        # seeds), above the 6e-4 fp16 tolerance every time; accumulating in fp32 and
        # rounding once at the end, by at most 3e-4.
        Case({"m": 2, "n": 40, "k": 128}, torch.float16, note="long K"),
    ],
    gpu_cases=[
        Case({"m": 1000, "n": 1001, "k": 999}, torch.float32, note="ragged"),
        Case({"m": 4096, "n": 4096, "k": 4096}, torch.float16, transposed=("b",)),
    ],
    # The starting point of the ladder: timed to be compared, not held to a speed.
    levels=Levels(passing=0.0, good=0.05, excellent=0.1),
    hints=("Each program owns one row of C and a block of its columns; walk k from 0 to K.",
           "At step k, C[row, cols] += A[row, k] * B[k, cols]: one element of A, a vector of "
           "B, accumulated in fp32."),
    answer_in=("matmul_rows_kernel",),
)

_matmul_problem(
    "matmul/tiled", "Tiled matmul: one block of C per program",
    solution="rooflab.kernels.matmul:matmul",
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
    tf32_on_gpu=True,
    hints=("Walk K in steps of BLOCK_K: each step loads a BLOCK_M × BLOCK_K tile of A and a "
           "BLOCK_K × BLOCK_N tile of B.",
           "tl.dot multiplies the two tiles; accumulate into an fp32 BLOCK_M × BLOCK_N "
           "accumulator; mask rows, columns and the K tail (other=0.0 adds nothing)."),
    answer_in=("tile_coordinates", "matmul_kernel"),
)

_matmul_problem(
    "matmul/grouped", "Tiled matmul with grouped program order, for L2 reuse",
    solution="rooflab.kernels.matmul:matmul_grouped",
    cpu_cases=[
        Case({"m": 70, "n": 33, "k": 47}, torch.float32, note="ragged tiles"),
        # 5 rows of tiles in groups of 4: the last group has one row; 3 columns of tiles.
        Case({"m": 300, "n": 130, "k": 64}, torch.float32, note="a short last group"),
        # At least 16 rows of tiles (BLOCK_M up to 256) and 2 columns (BLOCK_N up to 256):
        # enough for the order of the programs to show, with groups of 8 or fewer.
        Case({"m": 4096, "n": 384, "k": 32}, torch.float16, note=ORDER_CASE),
    ],
    gpu_cases=[
        Case({"m": 2048, "n": 1536, "k": 1000}, torch.float16, transposed=("b",)),
        # 1100 rows make 35, 18, 9 or 5 rows of tiles (BLOCK_M 32 to 256): never a whole
        # number of groups of 4 or 8.
        Case({"m": 1100, "n": 1000, "k": 512}, torch.float16, note="a short last group"),
        Case({"m": 4096, "n": 4096, "k": 4096}, torch.bfloat16, note="fills the chip"),
    ],
    levels=Levels(passing=0.3, good=0.5, excellent=0.7),
    # Graded on the order itself, which tile each program takes (on a CPU, from the
    # trace): the traffic it saves depends on the tile size and the L2, the order does not.
    trace_check=grouped_program_order,
    tf32_on_gpu=True,
    hints=("Programs that run at the same time should share rows of A and columns of B: "
           "number the tiles down a group of GROUP_M rows before moving one column right.",
           "With per_group = GROUP_M * tiles_n programs in a group, the group is pid // "
           "per_group, its first row first_m = group * GROUP_M; the last group may have "
           "fewer rows."),
    answer_in=("tile_coordinates",),
)


def _cuda_cost(case: Case) -> Cost:
    """CUDA C with float arithmetic runs on the CUDA cores: the fp32 roof, not TF32's."""
    return Cost(**{**vars(_cost(case)), "dtype": "fp32"})


def _uncoalesced(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from rooflab.kernels.matmul_cuda import matmul_cuda_uncoalesced

    return matmul_cuda_uncoalesced(a, b)


_matmul_problem(
    "matmul/cuda_coalesced",
    "CUDA C, one thread per element of C: consecutive threads on consecutive columns",
    solution="rooflab.kernels.matmul_cuda:matmul_cuda_coalesced",
    kernel="cupy",
    # Never run on a CPU (the CUDA C is compile-checked there); listed for `rooflab list`.
    cpu_cases=[Case({"m": 33, "n": 70, "k": 20}, torch.float32)],
    gpu_cases=[
        Case({"m": 1000, "n": 1001, "k": 999}, torch.float32, note="ragged"),
        Case({"m": 300, "n": 500, "k": 64}, torch.float32, transposed=("a",)),
        Case({"m": 2048, "n": 2048, "k": 2048}, torch.float32),
    ],
    cost=_cuda_cost,
    # Still naive (no reuse beyond the caches): timed to be compared, not held to a speed,
    # except against the same kernel with the uncoalesced mapping.
    levels=Levels(passing=0.0, good=0.2, excellent=0.4),
    baseline=_uncoalesced, baseline_name="the column-walking mapping",
    at_least_vs_baseline=1.5,
    hints=("Within a warp, threadIdx.x (so i) goes up by one from thread to thread. Which "
           "index of C should go up by one with it, so that B and C are read and written "
           "in consecutive addresses?",
           "C is row-major: c[row * N + col]. Consecutive i should give consecutive col, "
           "and the same row."),
    answer_in=("ALONG_THE_ROWS",),
)

# The bar for a matmul meant to be fast: timed at 4096³ bf16 on a GPU, at least 40% of the
# measured roof and half the speed of torch.matmul on the same inputs.
AGAINST_CUBLAS = Case({"m": 4096, "n": 4096, "k": 4096}, torch.bfloat16,
                      note="timed against cuBLAS", timed=True)
AT_LIBRARY_SPEED = dict(levels=Levels(passing=0.4, good=0.6, excellent=0.75), tf32_on_gpu=True,
                        baseline=torch.matmul, baseline_name="torch.matmul",
                        at_least_vs_baseline=0.5)

_matmul_problem(
    "matmul/tensor_core", "Tiles shaped for the tensor cores",
    solution="rooflab.kernels.matmul:matmul_tensor_core",
    cpu_cases=[
        Case({"m": 200, "n": 130, "k": 96}, torch.float16, note="ragged tiles"),
        Case({"m": 64, "n": 300, "k": 70}, torch.float16, transposed=("b",)),
        Case({"m": 130, "n": 70, "k": 64}, torch.float32, note="TF32 on a GPU"),
        Case({"m": 96, "n": 128, "k": 80}, torch.bfloat16),
    ],
    gpu_cases=[
        Case({"m": 1000, "n": 1001, "k": 999}, torch.float32, note="TF32"),
        Case({"m": 2048, "n": 1536, "k": 1000}, torch.float16, transposed=("b",)),
        AGAINST_CUBLAS,
    ],
    **AT_LIBRARY_SPEED,
    structure=Structure(tensor_cores=True),
    trace_check=tensor_core_work,
    hints=("The kernel is step 3's; what changes is the launch: tile sizes, warps and "
           "stages. Count what one program needs before choosing.",
           "A Hopper warpgroup multiplies 64×N×16 per instruction: BLOCK_M and BLOCK_N of "
           "128 keep it busy. The fp32 accumulator, BLOCK_M×BLOCK_N values, is shared by "
           "num_warps×32 threads; num_stages copies of both input tiles live in shared "
           "memory (227 KiB on an H100)."),
    answer_in=("matmul_tensor_core",),
)

_matmul_problem(
    "matmul/autotuned", "The autotuned matmul: configurations chosen per shape",
    solution="rooflab.kernels.matmul:matmul_autotuned",
    # Each new shape and dtype makes the autotuner try every configuration: keep few.
    cpu_cases=[
        Case({"m": 200, "n": 130, "k": 64}, torch.float16, note="ragged tiles"),
        Case({"m": 16, "n": 256, "k": 192}, torch.float32, note="skinny"),
        Case({"m": 96, "n": 64, "k": 128}, torch.bfloat16),
    ],
    gpu_cases=[
        Case({"m": 16, "n": 8192, "k": 8192}, torch.bfloat16, note="skinny"),
        Case({"m": 1000, "n": 1001, "k": 999}, torch.float32, note="TF32"),
        AGAINST_CUBLAS,
    ],
    **AT_LIBRARY_SPEED,
    # The configuration the autotuner settles on must fit an SM, in every dtype; and the
    # launches go through @triton.autotune.
    structure=Structure(tile_fit=True, autotuned=True),
    hints=("Offer the autotuner a handful of triton.Config: big tiles for big problems, "
           "narrow ones for skinny problems, and several warps/stages per tile size.",
           "Each config is triton.Config({'BLOCK_M': ..., 'BLOCK_N': ..., 'BLOCK_K': ..., "
           "'GROUP_M': 8}, num_warps=..., num_stages=...). Check each fits: "
           "num_stages × (BLOCK_M + BLOCK_N) × BLOCK_K × 2 bytes ≤ 227 KiB."),
    answer_in=("matmul_configs",),
)


def _epilogue_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    a, b = _inputs(case, gen, device)
    return a, b, random_tensor((case.sizes["n"],), case.dtype, gen, device, case.scale)


def _epilogue_cost(case: Case) -> Cost:
    cost = _cost(case)
    extra = case.sizes["n"] * case.dtype.itemsize  # the bias; C is written once either way
    return Cost(cost.flops + 2 * case.sizes["m"] * case.sizes["n"], cost.bytes + extra,
                cost.dtype)


register(Problem(
    id="matmul/epilogue", title="Fused epilogue: relu(a @ b + bias) in one kernel",
    solution="rooflab.kernels.matmul:matmul_bias_relu",
    signature="(a: Tensor[m, k], b: Tensor[k, n], bias: Tensor[n]) -> Tensor[m, n]"
              "  # relu(a @ b + bias)",
    make_inputs=_epilogue_inputs,
    reference=lambda a, b, bias: torch.relu(a @ b + bias),
    cost=_epilogue_cost,
    cpu_cases=[
        Case({"m": 70, "n": 33, "k": 47}, torch.float32, note="ragged tiles"),
        Case({"m": 64, "n": 130, "k": 64}, torch.float16, transposed=("a",)),
        Case({"m": 64, "n": 48, "k": 80}, torch.bfloat16),
    ],
    gpu_cases=[
        Case({"m": 1000, "n": 1001, "k": 999}, torch.float32, note="TF32"),
        Case({"m": 4096, "n": 4096, "k": 4096}, torch.bfloat16),
    ],
    # A separate add and relu would read and write C twice more: aten calls are reported.
    library_ops=MATMUL_OPS | {"add", "add_", "relu", "relu_", "clamp", "clamp_min",
                              "maximum", "threshold", "where"},
    tolerances=MATMUL_TOLERANCES, levels=Levels(passing=0.3, good=0.5, excellent=0.7),
    tf32_on_gpu=True, trace_check=written_once,
    hints=("The tile of C is still in registers after the K loop: add the bias there and "
           "apply relu before the store, in `epilogue`.",
           "The bias has one value per column of C: load bias_ptr + rn (masked), and add it "
           "to every row of the tile with bias[None, :]."),
    answer_in=("epilogue",),
))
