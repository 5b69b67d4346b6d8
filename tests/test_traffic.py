"""The memory-traffic model, against counts worked out by hand."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from rooflab.autograder import datasheet, roofline
from rooflab.autograder.trace import tracing
from rooflab.autograder.traffic import analyze, predict, violations
from rooflab.kernels.matmul import matmul
from rooflab.kernels.strided_copy import strided_copy
from rooflab.kernels.transpose import transpose, transpose_rows

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="traces the interpreter")
H100 = datasheet.get("H100 SXM")


def traced(fn, *args, **kwargs):
    with tracing() as tracer:
        fn(*args, **kwargs)
    (launch,) = tracer.launches
    return launch


def test_contiguous_copy_uses_every_byte_of_every_sector():
    report = analyze(traced(strided_copy, torch.randn(4096), 1, block=256), H100)
    assert report.grid == (16, 1, 1)
    assert report.requested_load == report.requested_store == 4096 * 4
    assert report.sector_efficiency == 1.0
    assert report.dram_estimate == report.dram_perfect_cache == report.dram_no_reuse == 32768


def test_stride_4_reads_use_a_quarter_of_each_sector():
    report = analyze(traced(strided_copy, torch.randn(4096), 4, block=256), H100)
    assert report.per_tensor["x_ptr"].efficiency == 0.25  # 4 useful bytes in every 16
    assert report.per_tensor["out_ptr"].efficiency == 1.0
    # 1024 useful fp32 read + 1024 written = 8 KiB, in 512 + 128 sectors.
    assert report.sector_efficiency == pytest.approx(8192 / (640 * 32))
    # Every sector of x is fetched (16 KiB), plus the 4 KiB written.
    assert report.dram_perfect_cache == 16384 + 4096


def test_transpose_column_walk_wastes_seven_eighths_of_each_written_sector():
    x = torch.randn(128, 128)
    rows = analyze(traced(transpose_rows, x, block=128), H100)
    assert rows.per_tensor["x_ptr"].efficiency == 1.0
    assert rows.per_tensor["out_ptr"].efficiency == 0.125  # 4 bytes of each 32
    # No reuse between programs: each of 128 programs reads 16 sectors of its row and
    # writes 128 sectors (one per element); a perfect cache moves each sector once.
    assert rows.dram_no_reuse == 128 * (16 + 128) * 32
    assert rows.dram_perfect_cache == 2 * 128 * 128 * 4

    tiles = analyze(traced(transpose, x, block=32), H100)
    assert tiles.sector_efficiency == 1.0
    assert tiles.dram_no_reuse == tiles.dram_perfect_cache == 2 * 128 * 128 * 4


def test_grouped_program_order_reuses_l2_in_a_tiled_matmul():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    small_l2 = {"l2_bytes": 64 * 1024, "sm_count": 8}
    reports = {
        group: analyze(traced(matmul, a, b, block_m=32, block_n=32, block_k=64, group_m=group),
                       H100, **small_l2)
        for group in (1, 4)
    }
    for report in reports.values():
        assert report.dram_perfect_cache == 3 * 256 * 256 * 4  # A, B read, C written once
        # No reuse: 64 programs each read a 32×256 strip of A and of B, write a 32×32 tile.
        assert report.dram_no_reuse == 64 * (2 * 32 * 256 + 32 * 32) * 4
    assert reports[4].dram_estimate < reports[1].dram_estimate
    assert reports[1].dram_estimate < reports[1].dram_no_reuse


@triton.jit
def _gather(x_ptr, index_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    index = tl.load(index_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.load(x_ptr + index, mask=mask), mask=mask)


def test_gather_every_eighth_element():
    x, index = torch.randn(8 * 512), torch.arange(0, 8 * 512, 8, dtype=torch.int32)
    out = torch.empty(512)
    report = analyze(traced(_gather[(4,)], x, index, out, 512, BLOCK=128), H100)
    assert report.per_tensor["x_ptr"].efficiency == 0.125
    assert report.per_tensor["index_ptr"].efficiency == 1.0
    assert report.per_tensor["out_ptr"].efficiency == 1.0


@triton.jit
def _unmasked_copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


def test_out_of_bounds_access_names_program_tensor_and_offset():
    padded = torch.randn(256)  # room to read past x, so nothing but the model sees the bug
    launch = traced(_unmasked_copy[(2,)], padded[:200], torch.empty(256), BLOCK=128)
    out_of_bounds, races = violations(launch)
    assert not races
    assert out_of_bounds[0].startswith("program (1, 0, 0) loads x_ptr[200], past its end")
    assert "x_ptr has 200 elements" in out_of_bounds[0]


@triton.jit
def _everyone_writes_first(out_ptr, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32) + tl.program_id(0))


def test_race_between_programs_is_reported():
    launch = traced(_everyone_writes_first[(3,)], torch.empty(16), BLOCK=16)
    _, races = violations(launch)
    assert races and races[0].startswith("programs 0 and 1 both store to out_ptr[0]")


def test_prediction_uses_dram_and_sector_traffic():
    x = torch.randn(128, 128)
    ceilings = roofline.from_datasheet(H100)
    cost = 2 * 128 * 128 * 4
    tile = predict([traced(transpose, x, block=32)], 0, cost, "fp32", ceilings, H100)
    rows = predict([traced(transpose_rows, x, block=128)], 0, cost, "fp32", ceilings, H100)
    assert tile.fraction == pytest.approx(1.0)
    assert tile.bound == "memory"
    # 128*(16+128) sectors moved between L2 and the SMs, at 2.5x DRAM bandwidth.
    assert rows.bound == "L2 transaction"
    assert rows.fraction == pytest.approx(cost / (128 * 144 * 32 / 2.5))
    assert "uncoalesced" in rows.bottleneck and "out_ptr: 12.5%" in rows.bottleneck


def test_tracing_off_leaves_the_interpreter_untouched():
    from triton.runtime.interpreter import InterpretedFunction, interpreter_builder

    run = InterpretedFunction.run
    with tracing():
        assert "create_masked_load" in vars(interpreter_builder)
    assert "create_masked_load" not in vars(interpreter_builder)
    assert InterpretedFunction.run is run


def test_per_program_bytes_form_the_grid():
    report = analyze(traced(transpose, torch.randn(64, 96), block=32), H100)
    assert report.per_program.shape == (1, 3, 2)  # (z, y, x) for a 2×3 grid
    assert np.all(report.per_program == 2 * 32 * 32 * 4)


def test_pictures_show_bytes_per_program_and_one_programs_elements():
    plot = pytest.importorskip("rooflab.autograder.plot")
    launch = traced(transpose, torch.randn(64, 96), block=32)
    heat = plot.program_heatmap(analyze(launch, H100))
    assert heat.data[0].z.shape == (3, 2)
    pattern = plot.access_pattern(launch, program=0, tensor="out_ptr")
    marks = np.asarray(pattern.data[0].z)
    assert marks.shape == (96, 64)
    assert (marks == 2).sum() == 32 * 32  # program 0 stores one 32×32 tile of out
    assert (marks[:32, :32] == 2).all()
