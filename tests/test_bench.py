"""`rooflab bench`: refuses on a CPU; on a GPU, times, re-checks and compares with the
library. The GPU logic is tested here with a stand-in device and timer."""

import json
from types import SimpleNamespace

import pytest
import torch

from rooflab.autograder import bench
from rooflab.autograder.checking import engine
from rooflab.autograder.cli import EXIT_FAIL, EXIT_NEEDS_GPU, EXIT_PASS, EXIT_USAGE, main
from rooflab.autograder.device import Device, roofline
from rooflab.autograder.device.timing import Timing
from rooflab.autograder.problem import Cost


@pytest.mark.cpu("what a CPU says instead of timing")
def test_bench_refuses_to_time_on_a_cpu(capsys):
    assert main(["bench", "coalescing"]) == EXIT_NEEDS_GPU  # not 1, a regression's code
    assert "benchmarks need a GPU; nothing was timed" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Never the user's cache: ceilings measured or raised here live in a temporary folder."""
    monkeypatch.setenv("ROOFLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def stand_in_gpu(monkeypatch):
    gpu = Device(kind="gpu", name="Stand-in H100", torch_device="cpu", driver="0.0")
    times = {"torch add": 10e-6, "twice as slow": 20e-6}  # the timer's answer, by kernel

    def fake_time(fn):
        fn()
        return Timing(times[fake_time.label], "do_bench")

    def workloads(device):
        x, y = torch.randn(1000), torch.randn(1000)
        load = bench.Workload("n=1000", torch.float32, Cost(1000, 12_000), lambda: (x, y),
                              {"torch add": torch.add, "twice as slow": torch.add}, torch.add)
        return [load]

    original_measure = bench._measure

    def measure(name, label, load, inputs, floor):
        fake_time.label = label
        return original_measure(name, label, load, inputs, floor)

    monkeypatch.setattr(bench, "current", lambda: gpu)
    monkeypatch.setattr(engine.device_layer, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(bench, "time_gpu", fake_time)
    monkeypatch.setattr(bench, "_measure", measure)
    monkeypatch.setattr(bench.roofline, "ceilings", lambda: roofline.from_datasheet("H100 SXM"))
    monkeypatch.setitem(bench.BENCHES, "coalescing", workloads)
    return SimpleNamespace(gpu=gpu, times=times)


def test_rows_carry_time_throughput_fraction_and_ratio(stand_in_gpu):
    base, slow = bench.run("coalescing")
    assert (base.median_us, slow.median_us) == pytest.approx((10, 20))
    assert base.unit == "GB/s" and base.throughput == pytest.approx(12_000 / 10e-6 / 1e9)
    assert base.roofline_fraction == pytest.approx(12_000 / 3.35e12 / 10e-6)
    assert (base.ratio_to_baseline, slow.ratio_to_baseline) == pytest.approx((1.0, 0.5))
    record = bench.record([base, slow])
    assert record["card"] == "Stand-in H100" and "torch" in record["versions"]
    assert json.dumps(record)  # serialisable as it is
    assert "twice as slow" in bench.table([base, slow])


def test_every_row_is_compared_with_every_library_kernel(stand_in_gpu, monkeypatch):
    def three(device):
        x, y = torch.randn(1000), torch.randn(1000)
        return [bench.Workload("n=1000", torch.float32, Cost(1000, 12_000), lambda: (x, y),
                               {"torch add": torch.add, "twice as slow": torch.add},
                               torch.add, library=("torch add", "twice as slow"))]

    monkeypatch.setitem(bench.BENCHES, "coalescing", three)
    base, slow = bench.run("coalescing")
    assert base.ratios == pytest.approx({"torch add": 1.0, "twice as slow": 2.0})
    assert slow.ratios == pytest.approx({"torch add": 0.5, "twice as slow": 1.0})


def test_a_library_kernel_this_card_lacks_is_left_out_not_fatal(stand_in_gpu, monkeypatch,
                                                               capsys):
    def missing(*_):
        raise bench.NotAvailable("this torch has none of the SDPA backends ['X']")

    def loads(device):
        x, y = torch.randn(1000), torch.randn(1000)
        return [bench.Workload("n=1000", torch.float32, Cost(1000, 12_000), lambda: (x, y),
                               {"torch add": torch.add, "absent": missing,
                                "twice as slow": torch.add},
                               torch.add, library=("torch add", "absent"))]

    monkeypatch.setitem(bench.BENCHES, "coalescing", loads)
    rows = bench.run("coalescing")
    assert [r.kernel for r in rows] == ["torch add", "twice as slow"]
    assert rows[1].ratios == pytest.approx({"torch add": 0.5})
    assert "absent left out" in capsys.readouterr().out


def test_a_wrong_kernel_stops_the_benchmark(stand_in_gpu, monkeypatch):
    def wrong(device):
        x = torch.randn(100)
        return [bench.Workload("n=100", torch.float32, Cost(100, 1200), lambda: (x, x),
                               {"torch add": torch.add, "twice as slow": torch.sub},
                               torch.add)]

    monkeypatch.setitem(bench.BENCHES, "coalescing", wrong)
    with pytest.raises(AssertionError, match="twice as slow is wrong before timing"):
        bench.run("coalescing")


@pytest.mark.gpu
def test_coalescing_benchmark_on_a_gpu(tmp_path, capsys):
    assert main(["bench", "coalescing", "--json", f"{tmp_path}/"]) == EXIT_PASS
    (written,) = tmp_path.glob("*-coalescing.json")
    rows = json.loads(written.read_text())["rows"]
    assert {r["kernel"] for r in rows} >= {"rooflab vector_add", "rooflab transpose (tiles)"}
    assert all(0 < r["roofline_fraction"] < 1.5 for r in rows)
    # A fraction above 100% always comes with its cause.
    assert all(r["note"] for r in rows if r["roofline_fraction"] > 1.05)


def test_attention_workloads_count_causal_work_once_and_check_gradients():
    loads = {load.shape: load for load in bench.BENCHES["attention"]("cpu")}
    full, causal = loads["fwd b4 h16 s4096 d128"], loads["fwd b4 h16 s4096 d128 causal"]
    assert causal.cost.flops * 2 == full.cost.flops == 4 * 4 * 16 * 4096**2 * 128
    both = loads["fwd+bwd b4 h16 s4096 d128"]
    assert both.cost.flops == 3.5 * full.cost.flops  # forward, then 2.5× for backward
    assert "naive (scores in memory)" in full.kernels
    # What a user of torch gets by default, and each fused backend, beside ours.
    sdpa = {"torch SDPA (default dispatch)", "torch SDPA (cuDNN)",
            "torch SDPA (flash where available)"}
    assert set(full.baselines) == sdpa and sdpa < set(both.kernels)
    assert "naive (scores in memory)" not in loads["fwd b1 h16 s16384 d128"].kernels


def test_forward_and_backward_returns_the_gradients():
    from rooflab.autograder.bench.attention import forward_and_backward
    from rooflab.kernels.attention import attention_reference, flash_attention

    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, do = (torch.randn(1, 2, 37, 64, device=device) for _ in range(4))
    ours = forward_and_backward(flash_attention, True)(q, k, v, do)
    reference = forward_and_backward(attention_reference, True)(q, k, v, do)
    tol = 1e-4 if device == "cpu" else 2e-2  # fp32 dots are TF32 on a GPU
    torch.testing.assert_close(ours, reference, rtol=tol, atol=tol)
    assert ours.numel() == 3 * q.numel()


# --- ceilings: the library's rows raise a ceiling they beat ----------------------------------

H100 = Device(kind="gpu", name="NVIDIA H100 80GB HBM3", torch_device="cpu", driver="0.0",
              l2_bytes=50 << 20)
ADD_BYTES = 3 * 4 << 26  # torch add of 2**26 fp32: 805 MB, 16× the L2


@pytest.fixture
def measured_h100(stand_in_gpu, monkeypatch):
    """The stand-in as an H100 whose cached copy bandwidth, 3.0 TB/s, is below what its
    torch add reaches (805 MB in 0.25 ms: 3.22 TB/s)."""
    ceilings = roofline.Ceilings(H100.name, "measured", 3.0e12, {"fp32": 51e12},
                                 driver="0.0", measured_at="2026-11-26T14:02:00+00:00")
    roofline.save(ceilings, H100)

    def loads(device):
        x, y = torch.randn(1000), torch.randn(1000)
        return [bench.Workload("n=67108864", torch.float32, Cost(1 << 26, ADD_BYTES),
                               lambda: (x, y),
                               {"torch add": torch.add, "twice as slow": torch.add}, torch.add)]

    stand_in_gpu.times.update({"torch add": ADD_BYTES / 3.22e12, "twice as slow":
                               2 * ADD_BYTES / 3.22e12})
    monkeypatch.setattr(bench, "current", lambda: H100)
    monkeypatch.setattr(bench.roofline, "ceilings", lambda: ceilings)
    monkeypatch.setitem(bench.BENCHES, "coalescing", loads)
    return ceilings


def test_a_library_row_beating_the_cached_ceiling_raises_it_for_every_row(measured_h100):
    base, slow = bench.run("coalescing")
    cached = roofline.load_cached(H100)
    assert cached.bandwidth == pytest.approx(3.22e12)
    assert cached.raised[0].workload == "torch add at n=67108864 float32"
    # Both rows against the raised ceiling: 100% and 50%, not 107% and 54%.
    assert (base.roofline_fraction, slow.roofline_fraction) == pytest.approx((1.0, 0.5))
    assert "was below what this card reaches: torch add at n=67108864 float32 reached " \
        "3.22 TB/s, 107% of it, so it was raised and cached" in base.note
    assert slow.note == ""


def test_the_table_and_the_json_carry_the_note(measured_h100):
    rows = bench.run("coalescing")
    text = bench.table(rows)
    head, base_line, slow_line, *notes = text.splitlines()
    assert "100% [1]" in base_line and "[" not in slow_line
    assert notes == [f"[1] torch add at n=67108864 float32: {rows[0].note}"]
    record = json.loads(json.dumps(bench.record(rows)))
    assert record["rows"][0]["note"] == rows[0].note
    assert record["ceilings"]["bandwidth"] == pytest.approx(3.22e12)


def test_a_row_above_100_percent_that_raised_nothing_says_why(stand_in_gpu):
    # Datasheet ceilings are never raised, and 12 kB at 6 TB/s is beyond any DRAM.
    stand_in_gpu.times["torch add"] = 2e-9  # 6 TB/s
    base, _ = bench.run("coalescing")
    assert base.roofline_fraction > 1.05
    assert "is above the floor" in base.note and "L2" in base.note


# --- the performance gate --------------------------------------------------------------------

def _record(ratio, kernel="twice as slow"):
    return {"rows": [{"shape": "n=1000", "dtype": "float32", "kernel": kernel,
                      "ratio_to_baseline": ratio}]}


def test_a_row_slower_than_its_record_is_timed_again_and_judged_on_its_best(stand_in_gpu):
    from rooflab.autograder.bench import gate

    rows = bench.run("coalescing")  # "twice as slow" runs at 0.5× the library
    retried = []

    def again(row):
        retried.append(row.kernel)
        return bench.Row(row.bench, row.shape, row.dtype, row.kernel, 10.0, 0, "", 0, "",
                         ratio_to_baseline=0.98)  # the slow timing was a passing neighbour

    (steady,) = gate.judge(rows, _record(1.0), 0.05, again)
    assert retried == ["twice as slow"] and steady.verdict == "steady" and steady.tries == 2
    (regressed,) = gate.judge(rows, _record(1.0), 0.05, lambda row: None)
    assert regressed.verdict == "regressed" and regressed.tries == 1  # no retry came back
    retried.clear()
    (improved,) = gate.judge(rows, _record(0.3), 0.05, again)
    assert improved.verdict == "improved" and retried == ["twice as slow"] * (gate.TRIES - 1)
    assert "REGRESSED" in gate.table([regressed], 0.05) and "-50%" in gate.table([regressed], 0.05)


def test_the_gate_fails_the_command_on_a_real_regression_only(stand_in_gpu, tmp_path, capsys,
                                                              monkeypatch):
    from rooflab.autograder import cli

    monkeypatch.setattr(cli.device, "current", lambda: stand_in_gpu.gpu)
    record = tmp_path / "card-2026-11-26-coalescing.json"
    record.write_text(json.dumps(_record(1.0)))
    assert main(["bench", "coalescing", "--baseline", str(record)]) == EXIT_FAIL
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "twice as slow" in out and "spread 0% over 3 runs" in out
    record.write_text(json.dumps(_record(0.52)))
    assert main(["bench", "coalescing", "--baseline", str(record),
                 "--tolerance", "10%"]) == EXIT_PASS
    library_only = _record(2.0, kernel="torch add")  # the library's own rows are not gated
    record.write_text(json.dumps(library_only))
    assert main(["bench", "coalescing", "--baseline", str(record)]) == EXIT_PASS
    capsys.readouterr()
    assert main(["bench", "coalescing", "--baseline", str(tmp_path / "none.json")]) == EXIT_USAGE
    assert "no such record" in capsys.readouterr().err


def test_the_newest_record_for_this_card_is_found(tmp_path):
    from rooflab.autograder.bench import gate

    for name in ("NVIDIA-H200-2026-11-20-matmul.json", "NVIDIA-H200-2026-11-26-matmul.json",
                 "NVIDIA-H200-2026-11-27-softmax.json", "NVIDIA-H100-80GB-HBM3-2026-12-01-"
                 "matmul.json"):
        (tmp_path / name).write_text("{}")
    found = gate.newest_record(tmp_path, "NVIDIA H200", "matmul")
    assert found.name == "NVIDIA-H200-2026-11-26-matmul.json"
    assert gate.newest_record(tmp_path, "NVIDIA H200", "attention") is None
