"""matmul/grouped is graded on what its order saves: the panels of A and B a wave of
programs reads. Grouped orders written any way pass (the course's, Triton's tutorial,
``tl.swizzle2d`` on a 1-D or a 2-D grid, groups along N); row-major and column-major
orders fail."""

import dataclasses

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from rooflab.autograder import check, get_problem
from rooflab.autograder.model.trace_data import Access, Launch, TensorArg
from rooflab.autograder.problems.matmul import (
    ORDER_CASE,
    ORDER_WAVE,
    grouped_program_order,
    wave_reuse,
)
from rooflab.kernels import matmul as mm

pytestmark = pytest.mark.cpu("the order is read from the interpreter's trace")

@triton.jit
def _swizzled(i_ptr, j_ptr, out_m_ptr, out_n_ptr, size_i, size_j, GROUP: tl.constexpr,
              COUNT: tl.constexpr):
    """Triton's own tl.swizzle2d of COUNT index pairs, in one program."""
    lanes = tl.arange(0, COUNT)
    i, j = tl.load(i_ptr + lanes), tl.load(j_ptr + lanes)
    new_i, new_j = tl.swizzle2d(i, j, size_i, size_j, GROUP)
    tl.store(out_m_ptr + lanes, new_i)
    tl.store(out_n_ptr + lanes, new_j)


def swizzle2d(i: torch.Tensor, j: torch.Tensor, size_i: int, size_j: int, group: int
              ) -> list[tuple[int, int]]:
    out_i, out_j = torch.empty_like(i), torch.empty_like(j)
    _swizzled[(1,)](i, j, out_i, out_j, size_i, size_j, GROUP=group, COUNT=i.numel())
    return list(zip(out_i.tolist(), out_j.tolist(), strict=True))


def grouped_m(tiles_m, tiles_n, group):
    """Triton's tutorial order, GROUP_SIZE_M (the course's too)."""
    order = []
    for pid in range(tiles_m * tiles_n):
        in_group = group * tiles_n
        first_m = pid // in_group * group
        size_m = min(tiles_m - first_m, group)
        order.append((first_m + pid % in_group % size_m, pid % in_group // size_m))
    return order


def orders(tiles_m: int, tiles_n: int) -> dict[str, list[tuple[int, int]]]:
    """For each way of ordering, the tile each program takes, in launch order (a 2-D
    grid launches program_id(0) fastest)."""
    count = triton.next_power_of_2(tiles_m * tiles_n)
    pid = torch.arange(count, dtype=torch.int32) % (tiles_m * tiles_n)
    return {
        "row-major": [(p // tiles_n, p % tiles_n) for p in range(tiles_m * tiles_n)],
        "column-major": [(p % tiles_m, p // tiles_m) for p in range(tiles_m * tiles_n)],
        "GROUP_M=2": grouped_m(tiles_m, tiles_n, 2),
        "GROUP_M=4": grouped_m(tiles_m, tiles_n, 4),
        "GROUP_SIZE_M=8": grouped_m(tiles_m, tiles_n, 8),
        "GROUP_M=16": grouped_m(tiles_m, tiles_n, 16),
        "8 columns": [(m, n) for n, m in grouped_m(tiles_n, tiles_m, 8)],
        "4 columns": [(m, n) for n, m in grouped_m(tiles_n, tiles_m, 4)],
        "swizzle2d": swizzle2d(pid // tiles_n, pid % tiles_n, tiles_m, tiles_n,
                               8)[:tiles_m * tiles_n],
        "swizzle2d, 2-D grid": swizzle2d(pid % tiles_m, pid // tiles_m, tiles_m, tiles_n,
                                         8)[:tiles_m * tiles_n],
        "swizzle2d G=4, 2-D grid": swizzle2d(pid % tiles_m, pid // tiles_m, tiles_m, tiles_n,
                                             4)[:tiles_m * tiles_n],
    }


def order_case():
    spec = get_problem("matmul/grouped")
    (case,) = [c for c in spec.cpu_cases if c.note == ORDER_CASE]
    return spec, case


def _launch(tiles: list[tuple[int, int]], c: torch.Tensor, block: int) -> Launch:
    """A launch whose programs each store the corner of their tile of ``c``, in order:
    what the check reads of a trace."""
    tensor = TensorArg("c_ptr", c.data_ptr(), c.numel() * c.element_size(),
                       c.element_size(), tuple(c.shape), tuple(c.stride()))
    launch = Launch("order", (len(tiles), 1, 1), [tensor])
    for program, (m, n) in enumerate(tiles):
        corner = c.data_ptr() + (m * block * c.stride(0) + n * block) * c.element_size()
        launch.accesses.append(Access("store", program, np.array([corner], np.uint64),
                                      np.array([True]), c.element_size()))
    return launch


def _verdicts(block: int = 64) -> dict[str, str]:
    _, case = order_case()
    c = torch.empty(case.sizes["m"], case.sizes["n"], dtype=torch.float16)
    tiles_m, tiles_n = case.sizes["m"] // block, case.sizes["n"] // block
    return {name: grouped_program_order(case, (), [_launch(tiles, c, block)], c)
            for name, tiles in orders(tiles_m, tiles_n).items()}


@pytest.fixture(scope="module")
def verdicts():
    return _verdicts()


@pytest.mark.parametrize("name", ["GROUP_M=4", "GROUP_SIZE_M=8", "GROUP_M=2", "8 columns",
                                  "4 columns", "swizzle2d", "swizzle2d, 2-D grid",
                                  "swizzle2d G=4, 2-D grid"])
def test_grouped_orders_written_any_way_pass(verdicts, name):
    assert verdicts[name] == ""


def test_row_major_and_column_major_orders_fail_and_say_what_a_wave_reads(verdicts):
    row = verdicts["row-major"]
    assert row.startswith("the programs take their tiles in row-major order"), row
    assert f"A wave of {ORDER_WAVE} programs" in row and "panels of A" in row, row
    column = verdicts["column-major"]
    assert column.startswith("the programs walk down whole columns of tiles"), column
    # A group as tall as a wave is a column-major wave: 16 rows of tiles, 1 column.
    assert "reads 16.0 panels of A and 1.0 of B" in verdicts["GROUP_M=16"]


def test_a_wave_of_a_grouped_order_reads_a_block_of_panels():
    grouped = [(m, n) for n in range(6) for m in range(4)]  # 4 rows of tiles, then right
    assert str(wave_reuse(grouped, 64, 64, wave=8)) == "4.0 panels of A and 2.0 of B"
    row_major = [(m, n) for m in range(4) for n in range(6)]
    reuse = wave_reuse(row_major, 64, 64, wave=8)  # rows 0-1, 1-2, 2-3; 6, 6, 6 columns
    assert (reuse.rows, reuse.cols, reuse.elements) == (2.0, 6.0, 512.0)


def test_the_check_reads_the_order_from_the_trace_and_fails_row_major():
    # The course's grouped matmul passes the whole check in test_solutions.py.
    spec, case = order_case()
    order = dataclasses.replace(spec, cpu_cases=[case], gpu_cases=[case])
    # 128 × 128 tiles: 96 programs to interpret, and 8 × 12 tiles still show the order.
    row = check(order, lambda a, b: mm.matmul(a, b, block_m=128, block_n=128, group_m=1),
                show=False, raise_on_failure=False, measure=False)
    assert all(c.ok or "row-major" in c.summary for c in row.cases)
    assert not row.passed and "row-major order" in row.causes[0], row.causes
    assert "8 × 12 tiles of C" in row.causes[0], row.causes
