import re

import pytest
import torch

from rooflab.autograder.checking import result as report
from rooflab.autograder.checking.result import CheckResult, Performance
from rooflab.autograder.device import roofline
from rooflab.autograder.evidence.compare import CaseResult, Comparison
from rooflab.autograder.problem import Case, Cost

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
    from rooflab.autograder.model.plot import roofline_figure

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
    from rooflab.autograder.model.plot import roofline_figure

    fig = roofline_figure(roofline.from_datasheet("H100 SXM"), dtypes=["bf16"])
    assert len(fig.data) == 1
    assert fig.data[0].name.startswith("bf16")


def test_report_figure_only_when_measured():
    pytest.importorskip("plotly")
    assert report._roofline_figure(passing(perf=performance())) is None
    figure = report._roofline_figure(passing(GPU_MODE, measured_performance()))
    assert figure is not None
    assert sum(t.mode != "lines" for t in figure.data) == 1


# --- a fraction above 100% carries its cause ---------------------------------------------------

H200 = "NVIDIA H200"


def measured_h200(bandwidth=4.25e12, bf16=714e12, suspect=""):
    return roofline.Ceilings(H200, "measured", bandwidth, {"fp32": 51.3e12, "bf16": bf16},
                             measured_at="2026-11-26T14:02:00+00:00", suspect=suspect)


def timed(cost, ceil, seconds, method="do_bench", raised=(), l2_bytes=60 << 20):
    floor = roofline.time_floor(cost, ceil)
    fraction = roofline.roofline_fraction(floor, seconds)
    return Performance(CASES[1], cost, ceil, floor, seconds, method, fraction, "excellent",
                       raised=list(raised), l2_bytes=l2_bytes)


def test_above_100_percent_from_a_small_working_set_says_l2_and_the_cuda_graph():
    cost = Cost(0, 24e6)  # 24 MB: fits in a 60 MiB L2
    perf = timed(cost, measured_h200(), cost.bytes / 4.6e12, method="cuda graph")
    line = passing(GPU_MODE, perf).line
    assert "108% of roofline" in line
    assert "its 24 MB of compulsory traffic is under 8× the 60 MiB L2" in line
    assert "timed by replaying a CUDA graph, which does not flush L2" in line
    assert "datasheet" not in line  # 4.6 TB/s: DRAM could have done it, L2 is the evidence
    beyond = timed(cost, measured_h200(), cost.bytes / 9e12)
    assert "(9 TB/s: more than the datasheet's 4.8 TB/s from DRAM)" in beyond.line


def test_above_100_percent_and_above_the_datasheet_blames_the_cost_model_not_l2():
    cost = Cost(2 * 4096**3, 3 * 4096**2 * 2, "bf16")
    perf = timed(cost, measured_h200(), cost.flops / 1100e12)  # faster than 989 TFLOP/s
    line = perf.line
    assert "1100 TFLOP/s is above the datasheet's 989 TFLOP/s" in line
    assert "the cost model counts more FLOPs than this kernel computes" in line
    assert "L2, not memory" not in line  # the old blanket guess


def test_above_100_percent_on_suspect_ceilings_says_the_card_was_busy():
    cost = Cost(0, 4e9)
    suspect = "measured 1.2 TB/s copy bandwidth, 25% of the H200 datasheet's 4.8 TB/s"
    perf = timed(cost, measured_h200(bandwidth=1.2e12, suspect=suspect), cost.bytes / 3.5e12)
    assert "measured on a busy card (measured 1.2 TB/s" in perf.line
    assert "rooflab roofline --remeasure" in perf.line
    assert "measured on a busy card (suspect)" in perf.bottleneck


def test_a_fraction_against_a_just_raised_ceiling_says_so():
    cost = Cost(2 * 4096**3, 3 * 4096**2 * 2, "bf16")
    ceil = measured_h200(bf16=714e12)
    raised = roofline.Raise("bf16", 672e12, 714e12, "torch.matmul on m=4096", "2026-11-27")
    perf = timed(cost, ceil, cost.flops / 714e12, raised=[raised])
    assert "100% of roofline" in perf.line
    assert ("the bf16 matmul ceiling measured 2026-11-26 14:02 UTC, 672 TFLOP/s, was below "
            "what this card reaches: torch.matmul on m=4096 reached 714 TFLOP/s, 106% of it, "
            "so it was raised and cached; the fraction is against the raised ceiling") in perf.line
    assert perf.line in report.html(passing(GPU_MODE, perf))


def test_an_ordinary_fraction_has_no_note():
    cost = Cost(2 * 4096**3, 3 * 4096**2 * 2, "bf16")
    perf = timed(cost, measured_h200(), cost.flops / 600e12)
    assert perf.ceiling_note == "" and perf.line.endswith("compute-bound")


def test_the_roofline_is_drawn_through_its_ridge_exactly():
    from rooflab.autograder.model.plot import roof_line, roofline_figure

    sheet = roofline.from_datasheet("H100 SXM")
    ridge = sheet.flops["bf16"] / sheet.bandwidth  # 295 FLOP/byte, not a power of two
    figure = roofline_figure(sheet, dtypes=["bf16"])
    (line,) = figure.data
    assert ridge in line.x
    assert line.y[list(line.x).index(ridge)] * 1e12 == pytest.approx(sheet.flops["bf16"])
    xs, ys = roof_line(1e15, 1e12)  # a ridge at 1000 FLOP/byte
    assert xs[1] == 1000 and ys == [xs[0] * 1e12, 1e15, 1e15] and xs[0] < 1000 < xs[2]


def test_the_card_lists_skipped_cases_and_gives_advice_once():
    cases = [CaseResult(Case({"n": n}), Comparison(ok=False, cause=f"off at {n}"),
                        advice="the one fix") for n in (10, 20)]
    result = CheckResult("x/y", "CPU", 1, cases=cases, causes=["wrong on n=10: off; the fix"],
                         skipped=["n=30 bf16: bf16 is graded on a GPU only"])
    text = report.html(result)
    assert "n=30 bf16" in text and "skipped: bf16 is graded on a GPU only" in text
    assert text.count("the one fix") == 0  # the rows show what went wrong, not the advice
    assert "off at 10" in text and "off at 20" in text
