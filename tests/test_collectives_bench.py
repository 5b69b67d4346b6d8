"""`rooflab bench allreduce`: the course's ring against dist.all_reduce on gloo ranks on
this CPU, on tiny sizes: the report's fields, busbw by nccl-tests' definition, the ring's
answer checked (a wrong ring stops it), the JSON record, the gate, and the registry the
command reads."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rooflab.autograder import bench
from rooflab.autograder.bench import collectives as bench_collectives
from rooflab.autograder.cli import EXIT_FAIL, EXIT_PASS, main
from rooflab.kernels import collectives

TINY = [4096, 4 * 4099]  # bytes a rank; the second not a multiple of the ring's chunks


@pytest.fixture(scope="module")
def report():
    return bench_collectives.run(world=3, sizes=TINY, reps=3, warmup=1)


def test_every_size_has_both_collectives_with_time_and_bandwidths(report):
    assert [(row.bytes, row.kernel) for row in report.rows] == [
        (size, name) for size in TINY
        for name in (bench_collectives.LIBRARY, bench_collectives.RING)]
    for row in report.rows:
        assert len(row.runs_us) == 3 and row.median_us in row.runs_us
        assert row.algbw_gbs == pytest.approx(row.bytes / (row.median_us * 1e-6) / 1e9)
        assert row.busbw_gbs == pytest.approx(row.algbw_gbs * 2 * (3 - 1) / 3)
        assert row.library == (row.kernel == bench_collectives.LIBRARY)
    library, ring = report.rows[:2]
    assert library.ratio_to_baseline == 1.0
    assert ring.ratio_to_baseline == pytest.approx(library.median_us / ring.median_us)


def test_every_ring_answer_was_checked_against_the_library(report):
    # 3 ranks, 2 sizes, 1 warm-up and 3 timed runs each: every one compared
    assert report.checked_runs == 3 * 2 * (1 + 3)
    assert 0 <= report.largest_difference <= bench_collectives.ATOL


def test_the_record_says_where_how_and_whether_the_goal_holds(report):
    data = json.loads(json.dumps(bench_collectives.record(report)))
    assert data["bench"] == "allreduce" and data["kind"] == "cpu" and data["card"]
    assert data["backend"] == "gloo" and data["ranks"] == 3
    assert data["versions"]["torch"] and data["cores"] >= 1 and data["date"]
    assert data["checked"]["runs"] == report.checked_runs
    assert "busbw = algbw·2(N − 1)/N" in data["method"]
    assert {"median_us", "algbw_gbs", "busbw_gbs", "ratio_to_baseline"} <= set(data["rows"][0])
    # Tiny sizes are below the goal's 16 MiB: nothing to judge, so it cannot be held.
    assert data["goal"] == {"from_bytes": 16 << 20, "at_least": 1.0, "held": False,
                            "ratios": {}}
    assert "every ring answer checked against dist.all_reduce" in bench_collectives.table(report)


def test_the_goal_is_judged_from_16_mib_on(report):
    big = [bench_collectives.Row("allreduce", f"{m} MiB", "float32", bench_collectives.RING,
                                 m << 20, 1.0, 1.0, 1.0, ratio, False)
           for m, ratio in ((8, 0.5), (16, 1.2), (32, 0.97))]
    judged = bench_collectives.Report(4, 3, 1, big, 0, 0.0, 0.0).goal()
    assert judged["ratios"] == {"16 MiB": 1.2, "32 MiB": 0.97} and not judged["held"]
    big[2].ratio_to_baseline = 1.01
    assert bench_collectives.Report(4, 3, 1, big, 0, 0.0, 0.0).goal()["held"]


def _wrong_ring(x: torch.Tensor) -> torch.Tensor:
    collectives.ring_allreduce(x)
    x.view(-1)[-1] += 1.0  # one element off, on every rank
    return x


def test_a_wrong_ring_stops_the_benchmark():
    with pytest.raises(RuntimeError, match="ring_allreduce differs from dist.all_reduce"):
        bench_collectives.run(world=2, sizes=[4096], reps=1, warmup=0, ring=_wrong_ring)


def test_the_command_runs_it_without_a_gpu_and_writes_json(monkeypatch, tmp_path, capsys):
    run = bench_collectives.run
    monkeypatch.setattr(bench_collectives, "run", lambda *a, **k: run(
        *a, **{"world": 2, "sizes": [4096], "reps": 2, **k}))
    assert main(["bench", "allreduce", "--json", f"{tmp_path}/"]) == EXIT_PASS
    out = capsys.readouterr().out
    assert "2 gloo ranks on" in out and "rooflab ring_allreduce" in out
    (written,) = tmp_path.glob("*-allreduce.json")
    rows = json.loads(written.read_text())["rows"]
    assert [row["kernel"] for row in rows] == [bench_collectives.LIBRARY,
                                               bench_collectives.RING]
    # The flags `make gpu-bench` passes: with no record for this CPU, nothing to gate.
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "allreduce", "--baseline", "newest"]) == EXIT_PASS
    assert "nothing to gate against" in capsys.readouterr().out


def test_the_gate_fails_a_ring_that_fell_behind_its_record(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench_collectives, "run", lambda *a, **k: bench_collectives.Report(
        2, 2, 1, [bench_collectives.Row("allreduce", "4 KiB", "float32", name, 4096, 10.0,
                                        1.0, 1.0, ratio, name == bench_collectives.LIBRARY)
                  for name, ratio in ((bench_collectives.LIBRARY, 1.0),
                                      (bench_collectives.RING, 0.5))], 8, 0.0, 0.0))
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"rows": [{"shape": "4 KiB", "dtype": "float32",
                                            "kernel": bench_collectives.RING,
                                            "ratio_to_baseline": 1.0}]}))
    assert main(["bench", "allreduce", "--baseline", str(record)]) == EXIT_FAIL
    assert "REGRESSED" in capsys.readouterr().out
    assert main(["bench", "allreduce", "--baseline", str(record), "--tolerance", "60%"]) \
        == EXIT_PASS


def test_a_bench_on_ranks_is_registered_by_one_entry():
    from rooflab.autograder.bench import fsdp as bench_fsdp
    from rooflab.autograder.cli import build_parser

    assert bench.RANK_BENCHES["allreduce"] == "rooflab.autograder.bench.collectives:main"
    assert bench.rank_bench("allreduce") is bench_collectives.main
    assert bench.rank_bench("fsdp") is bench_fsdp.main  # the second, one line
    assert build_parser().parse_args(["bench", "fsdp", "--json", "x/"]).name == "fsdp"
    assert not set(bench.RANK_BENCHES) & set(bench.BENCHES)


def test_make_gpu_bench_and_the_gpu_session_run_every_bench_the_command_knows():
    from pathlib import Path

    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    (line,) = [line for line in makefile.splitlines() if line.startswith("BENCHES ?=")]
    names = line.split("=", 1)[1].split()
    assert "allreduce" in names
    assert set(names) == set(bench.BENCHES) | set(bench.RANK_BENCHES)
    # A GPU session's script runs the same list.
    script = (Path(__file__).parent.parent / "bench" / "gpu-session.sh").read_text()
    (listed,) = re.findall(r"\$\{BENCHES:-([^}]*)\}", script)
    assert listed.split() == names
