"""`rooflab bench fsdp`: the course's ZeRO-3 sharding against FSDP2 on gloo ranks on this
CPU, on a tiny model: the report's fields, the memory by kind against ZeRO's 16Ψ/N worked
out by hand, the peak of whole parameters, the losses checked (a broken sharding stops
it), the goals, the JSON record and the gate."""

from __future__ import annotations

import json

import pytest
import torch

from rooflab.autograder.bench import fsdp as bench_fsdp
from rooflab.kernels.fsdp import shard_layers

# dim 16, 2 blocks: a block holds 12·16² + 13·16 = 3280 parameters, Ψ = 6560. Every
# parameter's first dimension is even, so on 2 ranks neither the course (⌈3280/2⌉ = 1640
# a block) nor FSDP2 (each parameter cut in two along dim 0) pads anything.
TINY = bench_fsdp.Setup(dim=16, heads=2, layers=2, batch=1, length=8)
BLOCK_BYTES = 3280 * 4
NAMES = [bench_fsdp.FSDP2, bench_fsdp.COURSE, bench_fsdp.PREFETCH]


@pytest.fixture(scope="module")
def report():
    return bench_fsdp.run(world=2, setup=TINY, steps=3, warmup=1)


def test_each_way_of_sharding_has_its_step_time_and_ratios(report):
    assert [row.kernel for row in report.rows] == NAMES
    library = report.rows[0]
    assert library.library and library.ratio_to_baseline == 1.0
    for row in report.rows:
        assert row.shape == "dim 16, 2 blocks, 2×1×8 tokens" and row.dtype == "float32"
        assert len(row.runs_us) == 3 and row.median_us in row.runs_us
        assert row.time_vs_fsdp2 == pytest.approx(row.median_us / library.median_us)
        assert row.ratio_to_baseline == pytest.approx(library.median_us / row.median_us)
        assert len(row.losses) == 1 + 3


def test_memory_by_kind_is_zero3s_16_psi_over_n(report):
    # Ψ/N = 3280 parameters a rank: 4 bytes each for the weight and its gradient, 8 for
    # AdamW's two moments (its step counter, a 0-d tensor, is not state a parameter holds).
    by_hand = {"parameters": 13120, "gradients": 13120, "optimizer": 26240}
    assert report.formula() == {**by_hand, "total": 52480}
    for row in report.rows:
        assert row.memory == by_hand, row.kernel
        assert row.held == 16 * TINY.parameters() // 2


def test_the_peak_counts_whole_blocks_alive_at_once(report):
    peak = {row.kernel: row.peak_unsharded_bytes for row in report.rows}
    assert peak[bench_fsdp.COURSE] == BLOCK_BYTES  # one block whole at a time
    assert peak[bench_fsdp.PREFETCH] == 2 * BLOCK_BYTES  # and the next on its way
    assert peak[bench_fsdp.FSDP2] >= BLOCK_BYTES
    for row in report.rows:
        expected = (row.held + row.peak_unsharded_bytes) / \
            (report.rows[0].held + report.rows[0].peak_unsharded_bytes)
        assert row.memory_vs_fsdp2 == pytest.approx(expected)


def test_the_losses_agree_with_fsdp2s(report):
    library = report.rows[0].losses
    for row in report.rows[1:]:
        assert row.losses == pytest.approx(library, rel=bench_fsdp.RELATIVE)
    assert 0 <= report.largest_loss_difference <= bench_fsdp.RELATIVE
    assert len(set(library)) > 1  # it trained: the loss moved


def _shifted_shards(model, prefetch=False):
    """A sharding whose ranks keep the wrong slice: each shard rolled by one element."""
    shards = shard_layers(model, prefetch=prefetch)
    with torch.no_grad():
        for shard in shards:
            shard.copy_(shard.roll(1))
    return shards


def test_a_broken_sharding_stops_the_benchmark():
    with pytest.raises(RuntimeError, match="loss differs from FSDP2's at step 1"):
        bench_fsdp.run(world=2, setup=TINY, steps=1, warmup=1, shard=_shifted_shards)


def _row(name: str, median_us: float, held: int, peak: int) -> bench_fsdp.Row:
    kinds = {"parameters": held // 4, "gradients": held // 4, "optimizer": held // 2}
    return bench_fsdp.Row("fsdp", "tiny", "float32", name, median_us, 1.0,
                          name == bench_fsdp.FSDP2, kinds, peak)


def test_the_goals_are_judged_at_1_1_times_fsdp2():
    rows = [_row(bench_fsdp.FSDP2, 100.0, 800, 200), _row(bench_fsdp.COURSE, 110.0, 800, 300),
            _row(bench_fsdp.PREFETCH, 111.0, 800, 400)]
    rows[1].time_vs_fsdp2, rows[1].memory_vs_fsdp2 = 1.1, 1.1
    rows[2].time_vs_fsdp2, rows[2].memory_vs_fsdp2 = 1.11, 1.2
    goal = bench_fsdp.Report(2, TINY, 3, 1, rows, 0.0, 0.0).goal()
    assert goal["at_most"] == 1.1 and goal["of"] == bench_fsdp.FSDP2
    assert goal["runs"][bench_fsdp.COURSE]["time_held"]
    assert goal["runs"][bench_fsdp.COURSE]["memory_held"]
    assert not goal["runs"][bench_fsdp.PREFETCH]["time_held"]
    assert not goal["runs"][bench_fsdp.PREFETCH]["memory_held"]


def test_the_record_says_where_how_and_with_what_model(report):
    data = json.loads(json.dumps(bench_fsdp.record(report)))
    assert data["bench"] == "fsdp" and data["kind"] == "cpu" and data["card"]
    assert data["backend"] == "gloo" and data["ranks"] == 2 and data["date"]
    assert data["versions"]["torch"] and data["cores"] >= 1
    assert data["model"] == {"dim": 16, "heads": 2, "layers": 2, "batch": 1, "length": 8,
                             "parameters": 6560}
    assert data["formula"]["total"] == 52480
    assert data["checked"]["relative"] == bench_fsdp.RELATIVE
    assert set(data["goal"]["runs"]) == {bench_fsdp.COURSE, bench_fsdp.PREFETCH}
    assert {"median_us", "ratio_to_baseline", "memory", "peak_unsharded_bytes",
            "time_vs_fsdp2", "memory_vs_fsdp2"} <= set(data["rows"][0])
    text = bench_fsdp.table(report)
    assert "ZeRO-3 formula, 16Ψ/N" in text and "every step's loss checked" in text


def test_main_writes_the_record_and_gates_on_this_cpus_newest(monkeypatch, tmp_path, capsys,
                                                               report):
    monkeypatch.setattr(bench_fsdp, "run", lambda *a, **k: report)
    monkeypatch.chdir(tmp_path)
    assert bench_fsdp.main(json_path="bench/results/", baseline="newest", tolerance=0.05) == 0
    assert "nothing to gate against" in capsys.readouterr().out
    (written,) = (tmp_path / "bench" / "results").glob("*-fsdp.json")
    assert [row["kernel"] for row in json.loads(written.read_text())["rows"]] == NAMES
    # A record where the course was twice as fast relative to FSDP2: a regression, which
    # a second look (the same report again) confirms.
    faster = json.loads(written.read_text())
    for row in faster["rows"]:
        row["ratio_to_baseline"] *= 2
    written.write_text(json.dumps(faster))
    assert bench_fsdp.main(json_path=None, baseline="newest", tolerance=0.05) == 1
    assert "REGRESSED" in capsys.readouterr().out
    assert bench_fsdp.main(json_path=None, baseline="newest", tolerance=0.6) == 0
