"""Lab 02 — matrix multiplication. Large matmuls are compute-bound: graded against the
tensor-core roof of the dtype."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..problem import (
    DEFAULT_TOLERANCES,
    Case,
    Cost,
    Draw,
    Hidden,
    Levels,
    Problem,
    Span,
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
# The card the order is graded on: the programs of a wave share what they read through L2,
# and a wave is as many programs as the card has SMs. A toy card of 16 SMs (one program
# each): an H100's 132 would need a case of thousands of tiles for the order to show, too
# many for the interpreter; on 16, a group of 2 to 8 rows (or columns) of tiles reads
# about half the panels row-major order does.
ORDER_WAVE = 16


@dataclass(frozen=True)
class Reuse:
    """What the waves of an order read, on average: distinct row panels of A (one per
    row of tiles) and column panels of B, and their size in elements of K (a panel of A
    is ``height`` rows, one of B ``width`` columns)."""

    rows: float
    cols: float
    height: float
    width: float

    @property
    def elements(self) -> float:
        return self.rows * self.height + self.cols * self.width

    def __str__(self) -> str:
        return f"{self.rows:.1f} panels of A and {self.cols:.1f} of B"


def wave_reuse(tiles: list[tuple[int, int]], height: float, width: float,
               wave: int = ORDER_WAVE) -> Reuse:
    """The panels each wave of ``wave`` programs reads, on average over the waves, for
    programs that take ``tiles`` in launch order."""
    rows = cols = 0
    waves = range(0, len(tiles), wave)
    for first in waves:
        taken = tiles[first:first + wave]
        rows += len({m for m, _ in taken})
        cols += len({n for _, n in taken})
    return Reuse(rows / len(waves), cols / len(waves), height, width)


def _grouped(tiles_m: int, tiles_n: int, group: int, along_n: bool) -> list[tuple[int, int]]:
    """Grouped order: ``group`` rows of tiles walked down before moving right, or (along
    N) ``group`` columns walked across before moving down."""
    if along_n:
        return [traced.grouped_order(p, tiles_n, tiles_m, group)[::-1]
                for p in range(tiles_m * tiles_n)]
    return [traced.grouped_order(p, tiles_m, tiles_n, group) for p in range(tiles_m * tiles_n)]


def _best_grouped(tiles_m: int, tiles_n: int, height: float, width: float
                  ) -> tuple[Reuse, str]:
    """The grouped order, along M or along N, whose waves read the fewest elements."""
    options = [(wave_reuse(_grouped(tiles_m, tiles_n, g, False), height, width),
                f"GROUP_M = {g}") for g in range(2, tiles_m + 1)]
    options += [(wave_reuse(_grouped(tiles_m, tiles_n, g, True), height, width),
                 f"groups of {g} columns") for g in range(2, tiles_n + 1)]
    return min(options, key=lambda option: option[0].elements)


def grouped_program_order(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """matmul/grouped: the programs of a wave share panels of A and B, as grouped order
    makes them: graded on the panels each wave of ORDER_WAVE programs reads (read from
    which tile of C each program stored, in launch order), against row-major order and
    the best grouped order on the same tiles. Any order that saves at least a fifth of
    what grouping can save passes: Triton's GROUP_SIZE_M (with tall tiles on a short C,
    its group of 8 is one column of tiles, which still saves a quarter), ``tl.swizzle2d``,
    groups along N."""
    launch = next((launch for launch in reversed(launches)
                   if traced.bytes_moved([launch], output, "store")), None)
    if launch is None or case.note != ORDER_CASE:
        return ""
    tiles = traced.tiles_in_launch_order(launch, output)
    tiles_m, tiles_n = 1 + max(m for m, _ in tiles), 1 + max(n for _, n in tiles)
    height, width = output.shape[0] / tiles_m, output.shape[1] / tiles_n
    got = wave_reuse(tiles, height, width)
    row_major = wave_reuse(_grouped(tiles_m, tiles_n, 1, False), height, width)
    best, how = _best_grouped(tiles_m, tiles_n, height, width)
    if got.elements <= row_major.elements - (row_major.elements - best.elements) / 5:
        return ""
    where = f"({tiles_m} × {tiles_n} tiles of C at {case.label})"
    reads = (f"A wave of {ORDER_WAVE} programs (the check's card has {ORDER_WAVE} SMs) reads "
             f"{got} on average; row-major order reads {row_major}, {how} {best}")
    group = traced.group_of(tiles)
    if group == 1:
        return (f"the programs take their tiles in row-major order {where}: program 1 computes "
                f"the tile right of program 0's. {reads}. Grouped order walks GROUP_M rows of "
                "tiles down a column before moving right, so that programs running at once "
                "share rows of A and columns of B")
    if group == tiles_m:
        return (f"the programs walk down whole columns of tiles {where}: one group as tall as "
                f"C. {reads}. Make groups of GROUP_M rows of tiles, fewer than the rows of "
                "tiles, so that a wave covers a block of tiles about as wide as it is tall")
    return (f"the programs of a wave share few rows of A and columns of B {where}: program 1 "
            f"computes tile {tiles[1]}, program 2 tile {tiles[2]}. {reads}. Number the tiles "
            "so that the programs of a wave cover a block about as wide as it is tall")


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
    # Odd sizes, n on either side of a 64-column block; small, as the cases above are.
    hidden=Hidden(cpu=Draw({"m": Span(3, 9, odd=True), "n": Span(33, 99, odd=True),
                            "k": Span(3, 15, odd=True)}),
                  gpu=Draw({"m": Span(301, 999, odd=True), "n": Span(301, 999, odd=True),
                            "k": Span(301, 999, odd=True)})),
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
    # Odd M, N and K: ragged tiles on every side, whatever the tile.
    hidden=Hidden(cpu=Draw({name: Span(33, 99, odd=True) for name in "mnk"}, count=2),
                  gpu=Draw({name: Span(1001, 3001, odd=True) for name in "mnk"})),
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
        # 16 × 24 tiles of 64 × 64 (8 × 12 of 128 × 128): waves of 16 programs in
        # row-major order read about twice the panels grouped orders do.
        Case({"m": 1024, "n": 1536, "k": 32}, torch.float16, note=ORDER_CASE),
    ],
    gpu_cases=[
        Case({"m": 2048, "n": 1536, "k": 1000}, torch.float16, transposed=("b",)),
        # 1100 rows make 35, 18, 9 or 5 rows of tiles (BLOCK_M 32 to 256): never a whole
        # number of groups of 4 or 8.
        Case({"m": 1100, "n": 1000, "k": 512}, torch.float16, note="a short last group"),
        Case({"m": 4096, "n": 4096, "k": 4096}, torch.bfloat16, note="fills the chip"),
    ],
    levels=Levels(passing=0.3, good=0.5, excellent=0.7),
    # Graded on what the order saves, the panels of A and B a wave of programs shares
    # (on a CPU, from the trace): not on one formula of the order.
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
