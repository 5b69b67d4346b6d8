import re

import pytest
import torch

from rooflab.autograder import report, roofline
from rooflab.autograder.compare import Comparison
from rooflab.autograder.problem import Case, Cost
from rooflab.autograder.result import CaseResult, CheckResult, Performance

CPU_MODE = "CPU (Triton interpreter): nothing timed, performance predicted"
GPU_MODE = "GPU: NVIDIA H100 80GB HBM3"
NOT_MEASURED = re.compile(r"\b(not|nothing) measured\b")
CASES = [Case({"n": 1000}), Case({"n": 4096}, torch.float16, scale=100.0, note="tail")]


def case_results(ok=(True, True)):
    return [
        CaseResult(case, Comparison(True, 1e-7, 2e-6) if good
                   else Comparison(False, 0.5, 0.9, (3,), cause="output: relative error 5e-01"))
        for case, good in zip(CASES, ok, strict=True)
    ]


def performance(seconds=None, fraction=None, level=None, method=""):
    case = CASES[1]
    n = case.sizes["n"]
    cost = Cost(flops=n, bytes=3 * n * 2, dtype="fp16")
    ceil = roofline.from_datasheet("H100 SXM")
    return Performance(case, cost, ceil, roofline.time_floor(cost, ceil), seconds, method,
                       fraction, level)


def measured_performance():
    perf = performance()
    seconds = perf.floor.seconds / 0.5
    return performance(seconds, roofline.roofline_fraction(perf.floor, seconds), "pass",
                       "cuda graph")


def passing(mode=CPU_MODE, perf=None):
    return CheckResult("coalescing/vector_add", mode, 1234, case_results(), perf)


def failing(causes):
    return CheckResult("coalescing/vector_add", CPU_MODE, 99, case_results((True, False)),
                       causes=causes)


# --- html ----------------------------------------------------------------------------------


def test_html_has_verdict_problem_mode_and_cases():
    text = report.html(passing(perf=performance()))
    assert "PASS" in text
    assert "coalescing/vector_add" in text
    assert CPU_MODE in text
    for case in CASES:
        assert case.label in text
    assert "seed 1234" in text
    assert NOT_MEASURED.search(text)


def test_html_fail_lists_causes():
    text = report.html(failing(["output: relative error 5e-01", "second cause"]))
    assert "FAIL" in text and "PASS" not in text
    assert "output: relative error 5e-01" in text
    assert "second cause" in text


def test_html_escapes_causes():
    text = report.html(failing(['<script>alert("x")</script> & more']))
    assert "<script>" not in text
    assert "&lt;script&gt;" in text
    assert "&amp; more" in text


def test_html_not_implemented():
    result = CheckResult("lab/ex", CPU_MODE, 1, causes=["not implemented"], not_implemented=True)
    assert "NOT IMPLEMENTED" in report.html(result)


# --- show ----------------------------------------------------------------------------------


def test_in_notebook_is_false_under_pytest():
    assert report.in_notebook() is False


def test_show_prints_the_line_outside_a_notebook(capsys):
    result = passing()
    report.show(result)
    assert capsys.readouterr().out == result.line + "\n"


def test_check_result_show_prints_the_line(capsys):
    result = failing(["boom"])
    result.show()
    assert capsys.readouterr().out.strip() == result.line


# --- result lines --------------------------------------------------------------------------


def test_cpu_performance_line_says_not_measured():
    result = passing(perf=performance())
    assert result.passed and result.verdict == "PASS"
    assert NOT_MEASURED.search(result.line)
    assert "µs median" not in result.line
    assert "2/2 cases correct" in result.line
    assert result.line.endswith(f"[{CPU_MODE}]")


def test_measured_performance_line_has_fraction_and_level():
    perf = measured_performance()
    assert perf.fraction == pytest.approx(0.5)
    line = passing(GPU_MODE, perf).line
    assert "50% of roofline" in line
    assert "[pass]" in line
    assert "µs median (cuda graph)" in line
    assert "memory-bound" in line
    assert "measured" not in line


def test_failing_line_has_first_cause_and_counts():
    result = failing(["first cause", "second cause"])
    assert not result.passed and result.verdict == "FAIL"
    assert "1/2 cases correct" in result.line
    assert "first cause" in result.line
    assert "second cause" not in result.line


def test_message_lists_every_case_and_the_seed():
    result = failing(["first cause", "second cause"])
    message = result.message()
    for case in CASES:
        assert case.label in message
    assert "seed 99" in message and "seed=99" in message
    assert "second cause" in message
    assert "FAIL " + CASES[1].label in message
    assert "ok   " + CASES[0].label in message


def test_message_includes_the_bottleneck():
    message = passing(perf=performance()).message()
    assert "memory-bound" in message
    assert "below the ridge" in message


def test_compute_bound_bottleneck():
    ceil = roofline.from_datasheet("H100 SXM")
    cost = Cost(flops=2 * 4096**3, bytes=3 * 4096**2 * 2, dtype="bf16")
    perf = Performance(CASES[0], cost, ceil, roofline.time_floor(cost, ceil))
    assert perf.bottleneck.startswith("compute-bound")
    assert "989 bf16 TFLOP/s" in perf.bottleneck


def test_worst_case_is_first_failing():
    result = failing(["x"])
    assert result.worst_case is result.cases[1]


# --- plot ----------------------------------------------------------------------------------


def test_roofline_figure_traces():
    pytest.importorskip("plotly")
    from rooflab.autograder.plot import roofline_figure

    measured = roofline.Ceilings("GPU X", "measured", 2e12, {"fp32": 5e13, "bf16": 8e14})
    beside = roofline.from_datasheet("H100 SXM")
    points = [("a", 0.25, 1e11, "fp32"), ("b", 300.0, 5e14, "bf16")]
    fig = roofline_figure(measured, points=points, beside=beside)

    lines = [t for t in fig.data if t.mode == "lines"]
    markers = [t for t in fig.data if t.mode != "lines"]
    assert len(lines) == 2 * 2  # two dtypes, two roofs
    assert len(markers) == len(points)
    assert sorted(t.line.dash for t in lines) == ["dash", "dash", "solid", "solid"]

    solid_bf16 = next(t for t in lines if t.line.dash == "solid" and t.name.startswith("bf16"))
    assert solid_bf16.y[0] == pytest.approx(2.0**-4 * 2e12 / 1e12)  # on the memory slope
    assert solid_bf16.y[-1] == pytest.approx(800.0)  # flat at the peak
    assert markers[1].x[0] == pytest.approx(300.0)
    assert markers[1].y[0] == pytest.approx(500.0)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_roofline_figure_only_selected_dtypes():
    pytest.importorskip("plotly")
    from rooflab.autograder.plot import roofline_figure

    fig = roofline_figure(roofline.from_datasheet("H100 SXM"), dtypes=["bf16"])
    assert len(fig.data) == 1
    assert fig.data[0].name.startswith("bf16")


def test_report_figure_only_when_measured():
    pytest.importorskip("plotly")
    assert report._roofline_figure(passing(perf=performance())) is None
    figure = report._roofline_figure(passing(GPU_MODE, measured_performance()))
    assert figure is not None
    assert sum(t.mode != "lines" for t in figure.data) == 1
