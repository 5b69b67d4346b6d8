"""The performance gate of `rooflab bench`: its exit codes, a baseline or tolerance refused
before anything is timed, and verdicts that allow for the spread of a row's runs. No GPU
and no gloo rank: a stand-in device, made-up rows and a made-up `again`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rooflab.autograder import bench, cli
from rooflab.autograder import device as device_layer
from rooflab.autograder.bench import collectives as bench_collectives
from rooflab.autograder.bench import gate
from rooflab.autograder.cli import EXIT_FAIL, EXIT_NEEDS_GPU, EXIT_PASS, EXIT_USAGE, main
from rooflab.autograder.device import Device

CARD = "Stand-in H100"
SHAPE, COURSE, LIBRARY = "n=1823", "course add", "torch add"


def _row(kernel: str, ratio: float) -> bench.Row:
    return bench.Row("coalescing", SHAPE, "float32", kernel, 10.0, 1.0, "GB/s", 0.5,
                     "memory", ratio_to_baseline=ratio, library=kernel == LIBRARY)


def _retries(*ratios: float):
    """An ``again`` whose runs come back at ``ratios`` in turn, counting its calls."""
    left = list(ratios)

    def again(row):
        again.calls += 1
        return _row(row.kernel, left.pop(0))

    again.calls = 0
    return again


def _record(ratio: float, **row) -> dict:
    return {"card": CARD, "rows": [{"shape": SHAPE, "dtype": "float32", "kernel": COURSE,
                                    "ratio_to_baseline": ratio, **row}]}


# --- the verdicts ----------------------------------------------------------------------------

def test_a_steady_row_is_measured_once():
    again = _retries()
    (steady,) = gate.judge([_row(COURSE, 1.03)], _record(1.0), 0.05, again)
    assert steady.verdict == "steady" and steady.tries == 1 and again.calls == 0


def test_a_slow_run_that_a_second_look_clears_costs_one_retry():
    again = _retries(0.99)
    (steady,) = gate.judge([_row(COURSE, 0.5)], _record(1.0), 0.05, again)
    assert steady.verdict == "steady" and again.calls == 1


def test_a_noisy_row_does_not_fail_a_5_percent_gate_and_the_table_says_why():
    # Best 0.9, 10% below the record: a 5% gate would fail it, but its runs spread 25%.
    again = _retries(0.9, 0.8)
    (noisy,) = gate.judge([_row(COURSE, 0.7)], _record(1.0), 0.05, again)
    assert noisy.verdict == "noisy" and again.calls == gate.TRIES - 1
    assert noisy.spread == pytest.approx(0.25)
    text = gate.table([noisy], 0.05)
    assert "NOISY" in text and "spread 25% over 3 runs (0.70–0.90×)" in text
    assert not gate.regressed([noisy])


def test_the_spread_on_record_widens_the_margin_too():
    tight = [_row(COURSE, 0.85)]
    (alone,) = gate.judge(tight, _record(1.0), 0.05, _retries(0.85, 0.85))
    (allowed,) = gate.judge(tight, _record(1.0, spread=0.2), 0.05, _retries(0.85, 0.85))
    assert (alone.verdict, allowed.verdict) == ("regressed", "noisy")
    assert "20% on record" in gate.table([allowed], 0.05)


def test_a_real_regression_fails_and_an_improvement_is_reported():
    (regressed,) = gate.judge([_row(COURSE, 0.6)], _record(1.0), 0.05, _retries(0.61, 0.59))
    assert regressed.verdict == "regressed" and regressed.spread < 0.05
    (improved,) = gate.judge([_row(COURSE, 1.0)], _record(0.5), 0.05, _retries(1.02, 0.98))
    assert improved.verdict == "improved"
    text = gate.table([improved, regressed], 0.05)
    assert text.index("REGRESSED") < text.index("IMPROVED") and "-39%" in text


# --- the command -----------------------------------------------------------------------------

@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """`rooflab bench coalescing` on a stand-in GPU: one library row, one course row whose
    first ratio and retries a test sets; ``runs`` counts the benchmark's runs."""
    stand_in = SimpleNamespace(first=1.0, retries=[], runs=0)

    def run(name):
        stand_in.runs += 1
        return [_row(LIBRARY, 1.0), _row(COURSE, stand_in.first)]

    monkeypatch.setattr(cli.device, "current", lambda: Device("gpu", CARD, "cpu", "0.0"))
    monkeypatch.setattr(device_layer, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(bench, "run", run)
    monkeypatch.setattr(bench, "remeasure",
                        lambda name, row: _row(row.kernel, stand_in.retries.pop(0)))
    monkeypatch.setattr(bench, "record", lambda rows: {"card": CARD, "rows": [
        vars(row).copy() for row in rows]})
    monkeypatch.chdir(tmp_path)
    return stand_in


def _file(tmp_path, content, name="record.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_a_gpu_bench_on_a_cpu_exits_3_and_times_nothing(monkeypatch, capsys):
    monkeypatch.setattr(cli.device, "current", lambda: Device("cpu", "a CPU", "cpu"))
    monkeypatch.setattr(bench, "run", lambda name: pytest.fail("timed on a CPU"))
    assert main(["bench", "matmul", "--baseline", "newest"]) == EXIT_NEEDS_GPU
    assert "benchmarks need a GPU; nothing was timed" in capsys.readouterr().err


WRONG_BASELINES = {
    "missing": (None, "no such record"),
    "a folder": ("", "not a file"),
    "not JSON": ("{'rows': [", "not JSON"),
    "no rows": ({"card": CARD, "measured": {}}, "not a benchmark record"),
    "rows without a kernel": ({"rows": [{"shape": SHAPE}]}, "not a benchmark record"),
    "another bench's, by its word": ({"bench": "matmul", "rows": []}, "`rooflab bench matmul`"),
    "another bench's, by its rows": ({"rows": [{**_record(1.0)["rows"][0], "bench": "softmax"}]},
                                     "`rooflab bench softmax`"),
    "another card's": ({**_record(1.0), "card": "NVIDIA L4"}, "measured on NVIDIA L4"),
}


@pytest.mark.parametrize("case", WRONG_BASELINES)
def test_a_wrong_baseline_is_refused_before_anything_is_timed(case, gpu, tmp_path, capsys):
    content, words = WRONG_BASELINES[case]
    path = tmp_path / "none.json" if content is None else tmp_path if content == "" \
        else _file(tmp_path, content)
    assert main(["bench", "coalescing", "--baseline", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--baseline {path}" in err and words in err
    assert gpu.runs == 0


def test_a_record_of_another_bench_is_known_by_its_file_name(gpu, tmp_path, capsys):
    path = _file(tmp_path, {"rows": []}, name="Stand-in-H100-2026-01-02-matmul.json")
    assert main(["bench", "coalescing", "--baseline", str(path)]) == EXIT_USAGE
    assert "`rooflab bench matmul`, not of coalescing" in capsys.readouterr().err


@pytest.mark.parametrize("tolerance, words", [
    ("-5%", "at least 0"), ("nan", "at least 0"), ("nan%", "at least 0"),
    ("100%", "below 100%"), ("inf", "below 100%"), ("5", "did you mean 5%?"),
    ("five", "not a fraction"),
])
def test_a_wrong_tolerance_is_refused_before_anything_is_timed(tolerance, words, gpu,
                                                               capsys):
    assert main(["bench", "coalescing", f"--tolerance={tolerance}"]) == EXIT_USAGE
    assert words in capsys.readouterr().err and gpu.runs == 0
    assert gate.fraction("5%") == gate.fraction("0.05") == pytest.approx(0.05)


def test_a_bench_on_ranks_checks_its_options_before_any_rank_starts(monkeypatch, tmp_path,
                                                                    capsys):
    monkeypatch.setattr(bench_collectives, "run", lambda *a, **k: pytest.fail("ranks started"))
    elsewhere = _file(tmp_path, {"bench": "allreduce", "card": "Some Other CPU", "rows": []})
    assert main(["bench", "allreduce", "--baseline", str(elsewhere)]) == EXIT_USAGE
    assert "measured on Some Other CPU" in capsys.readouterr().err
    assert main(["bench", "allreduce", "--baseline", "newest", "--tolerance=-1%"]) \
        == EXIT_USAGE


def test_the_command_fails_a_real_regression_only(gpu, tmp_path, capsys):
    path = _file(tmp_path, _record(1.0))
    gpu.first, gpu.retries = 0.6, [0.61, 0.59]  # 40% below, every run: real
    assert main(["bench", "coalescing", "--baseline", str(path)]) == EXIT_FAIL
    assert "REGRESSED" in capsys.readouterr().out
    gpu.first, gpu.retries = 0.7, [0.9, 0.8]  # below, but within the spread of its runs
    assert main(["bench", "coalescing", "--baseline", str(path)]) == EXIT_PASS
    assert "spread 25% over 3 runs" in capsys.readouterr().out
    gpu.first, gpu.retries = 1.3, [1.32, 1.31]
    assert main(["bench", "coalescing", "--baseline", str(path)]) == EXIT_PASS
    assert "IMPROVED" in capsys.readouterr().out
    assert gpu.runs == 3


def test_a_record_written_after_the_gate_carries_its_bench_and_spreads(gpu, tmp_path):
    path = _file(tmp_path, _record(1.0))
    gpu.first, gpu.retries = 0.7, [0.9, 0.8]
    assert main(["bench", "coalescing", "--baseline", str(path), "--json", "out/"]) \
        == EXIT_PASS
    (written,) = (tmp_path / "out").glob("Stand-in-H100-*-coalescing.json")
    record = json.loads(written.read_text())
    course = next(row for row in record["rows"] if row["kernel"] == COURSE)
    assert record["bench"] == "coalescing"
    assert (course["spread"], course["tries"]) == (pytest.approx(0.25), 3)


def test_newest_with_no_record_has_nothing_to_gate_against(gpu, capsys):
    assert main(["bench", "coalescing", "--baseline", "newest"]) == EXIT_PASS
    assert "nothing to gate against" in capsys.readouterr().out and gpu.runs == 1
