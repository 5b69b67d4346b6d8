"""The memory-traffic model, against counts worked out by hand."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from rooflab.autograder.device import datasheet, roofline
from rooflab.autograder.model import time_model
from rooflab.autograder.model.trace import tracing
from rooflab.autograder.model.traffic import analyze, predict, prediction, violations
from rooflab.kernels.matmul import matmul, matmul_rows
from rooflab.kernels.softmax import softmax_fused, softmax_naive, softmax_online
from rooflab.kernels.strided_copy import strided_copy
from rooflab.kernels.transpose import transpose, transpose_rows
from rooflab.kernels.vector_add import vector_add

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
    assert races and races[0].startswith("programs (0, 0, 0) and (1, 0, 0) both store to "
                                         "out_ptr[0]")


def test_prediction_adds_l2_time_to_dram_time_and_a_fixed_cost_per_launch():
    ceilings = roofline.from_datasheet(H100)
    bandwidth = ceilings.bandwidth
    # Tiles: DRAM time only, at the bandwidth, plus the fixed cost of one launch, which at
    # this size is most of it.
    x = torch.randn(256, 512)
    cost = 2 * x.numel() * 4
    tile = predict([traced(transpose, x, block=32)], 0, cost, "fp32", ceilings, H100)
    assert tile.bound == "memory" and tile.traffic_fraction == pytest.approx(1.0)
    assert tile.seconds == pytest.approx(time_model.LAUNCH_S + cost / bandwidth)
    assert tile.launch_bound and "100% of roofline in its traffic, memory-bound" in tile.line
    x = torch.randn(128, 128)
    cost = 2 * 128 * 128 * 4
    rows = predict([traced(transpose_rows, x, block=128)], 0, cost, "fp32", ceilings, H100)
    # Rows: the same DRAM bytes, and 128 × 128 stores that each write 4 bytes of a sector,
    # merged in L2 at PARTIAL_STORE_COST full sectors' time each.
    (report,) = rows.reports
    assert report.partial_store_sectors == 128 * 128
    sector_s = 32 / (time_model.L2_OVER_DRAM * bandwidth)
    l2_s = 128 * 128 * time_model.PARTIAL_STORE_COST * sector_s
    assert rows.bound == "L2 transaction"
    assert rows.seconds == pytest.approx(time_model.LAUNCH_S + cost / bandwidth + l2_s)
    assert "uncoalesced" in rows.bottleneck and "out_ptr: 12.5%" in rows.bottleneck


def test_partial_stores_are_the_sectors_a_warp_writes_only_part_of():
    ragged = analyze(traced(strided_copy, torch.randn(1001), 1, block=256), H100)
    assert ragged.partial_store_sectors == 1  # the last sector holds one element
    assert analyze(traced(strided_copy, torch.randn(1000), 1, block=256),
                   H100).partial_store_sectors == 0
    # A transpose by tiles writes whole sectors of out; by rows, 4 bytes of each.
    x = torch.randn(64, 96)
    assert analyze(traced(transpose, x, block=32), H100).partial_store_sectors == 0
    assert analyze(traced(transpose_rows, x, block=32), H100).partial_store_sectors == 64 * 96


def test_rounds_count_the_dependent_steps_of_each_programs_loop():
    x = torch.randn(64, 96)
    # Each program loads its row in 96 / 32 = 3 steps (the stores between do not wait).
    assert analyze(traced(transpose_rows, x, block=32), H100).rounds == 64 * 3
    # One step: x and y are loaded together.
    assert analyze(traced(vector_add, torch.randn(1000), torch.randn(1000), block=256),
                   H100).rounds == 4
    # Online softmax walks each row twice, 3 blocks each time: 6 steps a row.
    assert analyze(traced(softmax_online, torch.randn(5, 300), block=128), H100).rounds == 5 * 6
    # The naive matmul loads one element of A and a block of B per step of K.
    a, b = torch.randn(4, 40), torch.randn(40, 64)
    assert analyze(traced(matmul_rows, a, b, block_n=32), H100).rounds == 4 * 2 * 40


def test_a_loop_without_dot_is_latency_bound_when_each_step_does_little():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ceilings = roofline.from_datasheet(H100)
    naive = predict([traced(matmul_rows, a, b)], 2 * 64**3, 3 * 64 * 64 * 4, "fp32", ceilings,
                    H100)
    (time,) = naive.times
    # 64 programs fit the chip at once: one program's 64 steps, one round trip each.
    assert time.latency == pytest.approx(64 * time_model.ROUND_TRIP_S)
    assert naive.bound == "latency" and naive.bottleneck.startswith("latency-bound")
    # The same loop with tl.dot is pipelined by Triton: no latency term, FLOPs instead.
    tiled = predict([traced(matmul, a, b, block_m=32, block_n=32, block_k=32)], 0, 0, "fp32",
                    ceilings, H100)
    assert tiled.times[0].latency == 0 and tiled.times[0].compute > 0


def test_a_second_read_from_l2_is_not_free():
    x = torch.randn(8, 1024)
    ceilings = roofline.from_datasheet(H100)
    fused = predict([traced(softmax_fused, x)], 0, 2 * x.numel() * 4, "fp32", ceilings, H100)
    online = predict([traced(softmax_online, x, block=256)], 0, 2 * x.numel() * 4, "fp32",
                     ceilings, H100)
    assert online.dram == fused.dram == 2 * x.numel() * 4  # the second read hits L2
    (time,) = online.times
    hits = x.numel() * 4 // 32  # the second read's sectors
    assert time.l2 == pytest.approx(hits * 32 / (time_model.L2_OVER_DRAM * ceilings.bandwidth))
    assert online.seconds > fused.seconds


def test_dots_run_in_waves_of_programs_over_the_sms():
    ceilings = roofline.from_datasheet(H100)
    per_program = 2 * 64 * 64 * 64 / (ceilings.peak_flops("tf32") / H100.sm_count)

    def compute(m: int) -> float:
        a, b = torch.randn(m, 64), torch.randn(64, 64)
        return predict([traced(matmul, a, b, block_m=64, block_n=64, block_k=64)], 0, 0,
                       "tf32", ceilings, H100).times[0].compute

    assert compute(64 * 132) == pytest.approx(per_program)  # one wave
    assert compute(64 * 133) == pytest.approx(2 * per_program)  # one program more: two


@triton.jit
def _add_into(x_ptr, out_ptr, target_ptr, n, BLOCK: tl.constexpr):
    """out[target[i]] += x[i], one atomic per element."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < n
    where = tl.load(target_ptr + offsets, mask=ok, other=0)
    tl.atomic_add(out_ptr + where, tl.load(x_ptr + offsets, mask=ok, other=0.0), mask=ok,
                  sem="relaxed")


def _add_into_report(target: torch.Tensor):
    x, out = torch.randn(target.numel()), torch.zeros(target.numel())
    launch = traced(lambda: _add_into[(target.numel() // 64,)](x, out, target, x.numel(),
                                                                  BLOCK=64))
    return analyze(launch, H100)


def test_atomics_cost_their_transactions_and_the_longest_chain_on_one_sector():
    ceilings = roofline.from_datasheet(H100)
    n = 64 * 512
    # Spread: element i adds into out[i], 8 lanes to a sector, 4 sectors per warp.
    spread = _add_into_report(torch.arange(n))
    assert spread.atomic_transactions == n // 8
    assert spread.atomic_chain == 8  # each sector's 8 lanes, once
    # Into 256 places: 32 sectors of out, n / 32 lanes on each.
    assert _add_into_report(torch.arange(n) % 256).atomic_chain == n // 32
    assert spread.partial_store_sectors == 0  # an atomic's cost is its own, not a store's
    # Contended: every element adds into out[0]: one transaction per warp, all on one sector.
    hot = _add_into_report(torch.zeros(n, dtype=torch.int64))
    assert hot.atomic_transactions == n // 32 and hot.atomic_chain == n
    spread_time, hot_time = (time_model.estimate(r, ceilings, H100) for r in (spread, hot))
    sector_s = 32 / (time_model.L2_OVER_DRAM * ceilings.bandwidth)
    assert spread_time.l2 >= n // 8 * time_model.ATOMIC_COST * sector_s
    assert hot_time.chain == pytest.approx(n * time_model.ATOMIC_CHAIN_S)
    assert hot_time.bound == "atomic chain" and spread_time.bound != "atomic chain"
    assert hot_time.seconds > 3 * spread_time.seconds
    words = prediction([hot], 0, 0, "fp32", ceilings, H100).bottleneck  # what a learner reads
    assert words.startswith(f"atomic-chain-bound: {n:,} atomic lanes of _add_into")


def test_a_tf32x3_dot_takes_three_tf32_products():
    ceilings = roofline.from_datasheet(H100)
    a, b = torch.randn(64 * 132, 64), torch.randn(64, 64)

    def compute(precision: str) -> float:
        launch = traced(matmul, a, b, block_m=64, block_n=64, block_k=64,
                        precision=precision)
        assert launch.dots[0].input_precision == precision
        return predict([launch], 0, 0, "tf32", ceilings, H100).times[0].compute

    assert compute("tf32x3") == pytest.approx(3 * compute("tf32"))


def _network_lanes(log_n: int, log_k: int) -> int:
    """Lanes of compare-and-swaps of a bitonic top-2^log_k of 2^log_n: each layer a minimum
    and a maximum of every pair; each halving, which keeps the larger of two runs, one
    maximum of every pair."""
    lanes = 0
    for s in range(1, log_n + 1):
        n = log_n if s <= log_k else log_n - (s - log_k)  # the vector is 2^n long
        lanes += (2**n if s > log_k else 0) + min(s, log_k) * 2**n
    return lanes


@triton.jit
def _sorted(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.sort(tl.load(x_ptr + offsets)))


@triton.jit
def _low_high(a_ptr, b_ptr, low_ptr, high_ptr, BLOCK: tl.constexpr):
    """Elementwise minimum and maximum of two tensors: no sorting network."""
    offsets = tl.arange(0, BLOCK)
    a, b = tl.load(a_ptr + offsets), tl.load(b_ptr + offsets)
    tl.store(low_ptr + offsets, tl.minimum(a, b))
    tl.store(high_ptr + offsets, tl.maximum(a, b))


def test_sorting_networks_count_their_compare_and_swaps_and_a_clamp_or_a_pair_is_none():
    from rooflab.kernels.amp import fp8_quantize
    from rooflab.kernels.topk import topk_rows

    # Four blocks of 16, top 4 of each, each merged with the running top 4 (8 → 4).
    small = traced(topk_rows, torch.randn(1, 64), 4, block=16)
    assert small.compare_lanes == 4 * (_network_lanes(4, 2) + _network_lanes(3, 2))
    # Triton's own tl.sort of 16: 4 · 5 / 2 = 10 layers, each element compared in each.
    x, out = torch.randn(16), torch.empty(16)
    assert traced(lambda: _sorted[(1,)](x, out, BLOCK=16)).compare_lanes == 16 * 10
    assert torch.equal(out, x.sort().values)
    # fp8_quantize clamps every element to ±448 (a minimum and a maximum, against bounds).
    clamp = traced(fp8_quantize, torch.randn(4096).to(torch.bfloat16), torch.tensor([1.0]))
    assert clamp.compare_lanes == 0
    # The minimum and the maximum of two loaded tensors: the same two operands, no network.
    a, b, low, high = torch.randn(256), torch.randn(256), torch.empty(256), torch.empty(256)
    pair = traced(lambda: _low_high[(1,)](a, b, low, high, BLOCK=256))
    assert pair.compare_lanes == 0 and torch.equal(low, torch.minimum(a, b))
    # Top 64 of four blocks of 1024: the networks outweigh the 16 KB read many times.
    ceilings = roofline.from_datasheet(H100)
    big = predict([traced(topk_rows, torch.randn(1, 4096), 64, block=1024)], 0, 4096 * 4,
                  "fp32", ceilings, H100)
    (report,), (time,) = big.reports, big.times
    assert report.compare_lanes == 4 * (_network_lanes(10, 6) + _network_lanes(7, 6))
    assert time.network == pytest.approx(report.compare_lanes * time_model.COMPARE_LANE_S)
    assert time.bound == "sorting network" and big.bottleneck.startswith("sorting-network")


def test_lanes_need_not_be_kept_for_the_model():
    x = torch.randn(67, 130)
    kept = analyze(traced(transpose_rows, x, block=64), H100)
    with tracing(keep_lanes=False) as tracer:
        transpose_rows(x, block=64)
    (launch,) = tracer.launches
    assert not launch.accesses and launch.footprints
    compact = analyze(launch, H100)
    for name in ("requested_load", "requested_store", "load_sectors", "store_sectors",
                 "partial_store_sectors", "dram_no_reuse", "dram_perfect_cache",
                 "dram_estimate", "rounds"):
        assert getattr(compact, name) == getattr(kept, name), name
    assert np.array_equal(compact.per_program, kept.per_program)


def test_the_l2_model_is_an_exact_lru():
    """Stack distances, counted with arrays, against an LRU simulated one sector at a time."""
    from collections import OrderedDict

    from rooflab.autograder.model.traffic import _lru_misses

    rng = np.random.default_rng(0)
    for _ in range(300):
        refs = np.concatenate([np.unique(rng.integers(0, 60, rng.integers(1, 25)))
                               for _ in range(rng.integers(1, 10))])  # waves, sorted
        capacity = int(rng.integers(1, 40))
        cache, expected = OrderedDict(), []
        for sector in refs.tolist():
            expected.append(sector not in cache)
            cache[sector] = None
            cache.move_to_end(sector)
            if len(cache) > capacity:
                cache.popitem(last=False)
        assert _lru_misses(refs, capacity).tolist() == expected


def test_compulsory_bytes_count_each_tensor_once_and_no_intermediates():
    from rooflab.autograder.model.autotune import compulsory_bytes

    x = torch.randn(16, 512)
    with tracing() as tracer:
        softmax_naive(x, block=128)
    reports = [analyze(launch, H100) for launch in tracer.launches]
    # x in and y out: the row maxima, sums and exponentials stay between the launches.
    assert compulsory_bytes(reports, tracer.launches) == 2 * x.numel() * 4
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    with tracing() as tracer:
        matmul(a, b)  # passes c twice (as c and as the unused bias)
    reports = [analyze(launch, H100) for launch in tracer.launches]
    assert compulsory_bytes(reports, tracer.launches) == (64 * 32 + 32 * 48 + 64 * 48) * 4


def test_the_h200_has_the_l2_it_reports():
    assert datasheet.get("NVIDIA H200").l2_bytes == 60 << 20
    assert datasheet.get("H100 SXM").l2_bytes == datasheet.get("H100 PCIe").l2_bytes == 50 << 20


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
    plot = pytest.importorskip("rooflab.autograder.model.plot")
    launch = traced(transpose, torch.randn(64, 96), block=32)
    heat = plot.program_heatmap(analyze(launch, H100))
    assert heat.data[0].z.shape == (3, 2)
    pattern = plot.access_pattern(launch, program=0, tensor="out_ptr")
    marks = np.asarray(pattern.data[0].z)
    assert marks.shape == (96, 64)
    assert (marks == 2).sum() == 32 * 32  # program 0 stores one 32×32 tile of out
    assert (marks[:32, :32] == 2).all()


@triton.jit
def _flag_if_negative(x_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    if tl.min(x, axis=0) < 0:
        tl.store(flag_ptr, 1.0)  # whichever programs find one: the same value


@triton.jit
def _flag_each_block(x_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(flag_ptr, (tl.min(x, axis=0) < 0).to(tl.float32))  # 0.0 or 1.0: the last wins


@triton.jit
def _flag_then_count(x_ptr, flag_ptr, BLOCK: tl.constexpr):
    tl.store(flag_ptr, 1.0)
    tl.atomic_add(flag_ptr, 1.0)  # another program's store may land after this


def test_programs_storing_one_value_to_one_address_do_not_race_and_different_ones_do():
    x = -torch.rand(64)  # every block has a negative: every program stores
    assert violations(traced(_flag_if_negative[(4,)], x, torch.zeros(1), 64, BLOCK=16)) \
        == ([], [])
    x[:32] = 1.0  # the first two blocks store 0.0, the last two 1.0
    _, races = violations(traced(_flag_each_block[(4,)], x, torch.zeros(1), 64, BLOCK=16))
    assert races and races[0].startswith("programs (0, 0, 0) and (1, 0, 0) both store to "
                                         "flag_ptr[0], different values"), races
    _, races = violations(traced(_flag_then_count[(2,)], x, torch.zeros(1), BLOCK=16))
    assert races and "both store to flag_ptr[0]" in races[0], races
