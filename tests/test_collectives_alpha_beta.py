"""Lab 08's α–β cell and bus-bandwidth chart (rooflab.autograder.model.alpha_beta): the fit
uses the fastest repeat at each size; a held-out size off the line is said to be off it,
with its figures; the ring's busbw label for 32 MiB on a loaded machine is a figure, not
0.0; every label of the chart lies inside the figure (estimated from the layout, and
measured in Chromium where there is one)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from rooflab.autograder.model.alpha_beta import (
    NEAR,
    AlphaBeta,
    BarLayout,
    bar_layout,
    busbw,
    busbw_chart,
    fit_alpha_beta,
    held_out,
    held_out_report,
    rate_label,
    size_label,
    slowest_rank_runs,
)

WORLD = 4
MIB = 1 << 20
SIZES = np.array([4 << k for k in range(8, 23)], dtype=np.float64)  # 1 KiB to 16 MiB
ALPHA, INV_BETA = 1.2e-3, 1 / 0.25e9  # 1.2 ms a step, 0.25 GB/s
PUBLISHED = {
    "gloo, one machine (torchft PR 199)": 2.4e9,
    "8×H100, NCCL ring (nccl-tests #212)": 370e9,
    "8×H100, NVLink line rate": 450e9,
    "8×H100, NCCL NVLS (nccl-tests #212)": 480e9,
}


def exact(sizes):
    return AlphaBeta(WORLD, ALPHA, INV_BETA, 0).predict(sizes)


def test_each_run_takes_as_long_as_its_slowest_rank():
    ranks = [[[1.0, 5.0]], [[3.0, 2.0]], [[2.0, 4.0]]]  # 3 ranks, 1 size, 2 repeats
    assert slowest_rank_runs(ranks).tolist() == [[3.0, 5.0]]


def test_the_fit_uses_the_fastest_repeat_at_each_size():
    rng = np.random.default_rng(0)
    # Five repeats a size: one undisturbed, four slowed by other work (up to 2.5×), the
    # large sizes the most, as on a loaded machine.
    slowdown = 1 + rng.uniform(0, 1.5, (len(SIZES), 5)) * np.linspace(0.2, 1, len(SIZES))[:, None]
    slowdown[np.arange(len(SIZES)), rng.integers(0, 5, len(SIZES))] = 1.0
    runs = exact(SIZES)[:, None] * slowdown
    fit = fit_alpha_beta(SIZES, runs, WORLD)
    assert fit.alpha == pytest.approx(ALPHA, rel=1e-9)
    assert fit.inv_beta == pytest.approx(INV_BETA, rel=1e-9)
    assert fit.fitted_on == len(SIZES)
    # The same fit on the mean of the repeats carries the disturbance into β.
    on_mean = fit_alpha_beta(SIZES, runs.mean(1, keepdims=True), WORLD)
    assert on_mean.inv_beta > 1.3 * INV_BETA
    assert "fit on the fastest repeat of 15 sizes" in str(fit)
    assert "β = 0.25 GB/s" in str(fit) and "α = 1200 µs a step" in str(fit)


def test_neither_term_of_the_fit_is_negative():
    # Times that fall with the size want a negative 1/β: α alone is fitted instead.
    sizes = np.array([1e3, 1e6, 1e7])
    fit = fit_alpha_beta(sizes, np.array([[3e-2], [2e-2], [1e-2]]), WORLD)
    assert fit.alpha > 0 and 0 < fit.inv_beta <= 1e-15


def test_a_held_out_size_off_the_line_is_said_to_be_off_it_with_its_figures():
    # The learner's loaded machine: 16 MiB took 811 to 1343 ms against 400 ms predicted.
    line = AlphaBeta(WORLD, ALPHA, (0.400 - 6 * ALPHA) / (1.5 * 16 * MIB), 8)
    assert line.predict(16 * MIB) == pytest.approx(0.400)
    runs = np.array([[0.811, 1.343, 0.952, 1.104, 0.870]])
    [point] = held_out([16 * MIB], runs, line)
    assert point.best == 0.811 and point.slowest == 1.343 and point.repeats == 5
    assert point.ratio == pytest.approx(2.03, abs=0.005) and not point.near()
    report = held_out_report([16 * MIB], runs, line)
    assert ("16 MiB: measured min 811 ms (of 5 repeats, up to 1343), predicted 400 ms: "
            "2.03× the line, above it") in report
    assert "near it" not in report and "All" not in report
    assert "None of the 1 held-out sizes falls within 1.5× of the line" in report


def test_held_out_sizes_are_called_near_the_line_only_within_the_tolerance():
    sizes = np.array([2 * MIB, 8 * MIB, 32 * MIB])
    predicted = exact(sizes)
    # 1.2× above, 0.8× below: near. 2.3× above: off it (the recorded run's 32 MiB).
    runs = predicted[:, None] * np.array([[1.2, 1.5], [0.8, 0.9], [2.3, 2.6]])
    report = held_out_report(sizes, runs, AlphaBeta(WORLD, ALPHA, INV_BETA, 8))
    lines = report.splitlines()
    assert f"within {NEAR:g}× of the line, either way" in lines[0]
    assert lines[1].endswith("1.20× the line, near it") and lines[1].lstrip().startswith("2 MiB")
    assert lines[2].endswith("0.80× the line, near it")
    assert lines[3].endswith("2.30× the line, above it")
    assert lines[4] == "2 of 3 held-out sizes fall within 1.5× of the line; off it: 32 MiB (2.30×)."
    near_all = held_out_report(sizes[:2], runs[:2], AlphaBeta(WORLD, ALPHA, INV_BETA, 8))
    assert near_all.splitlines()[-1].startswith("All 2 held-out sizes fall within 1.5×")
    below = held_out_report(sizes[:1], predicted[:1, None] * 0.5,
                            AlphaBeta(WORLD, ALPHA, INV_BETA, 8))
    assert "0.50× the line, below it" in below


def test_sizes_and_times_are_labelled_in_the_units_measured():
    assert size_label(1024) == "1 KiB" and size_label(32 * MIB) == "32 MiB"
    assert size_label(3 * MIB // 2) == "1.5 MiB" and size_label(1023.6 * 1024) == "1024 KiB"
    assert size_label(1.15e6) == "1.1 MiB" and size_label(100) == "100 B"


def test_the_ring_busbw_for_32_mib_on_a_loaded_machine_is_a_figure_not_zero():
    # 32 MiB (the chart's "34 MB", 33.6e6 bytes) in 2.0 s on 4 ranks: 25 MB/s of busbw,
    # which one decimal of GB/s printed as "0.0 GB/s".
    rate = busbw(32 * MIB, 2.0, WORLD)
    assert rate == pytest.approx(32 * MIB / 2.0 * 2 * 3 / 4)
    assert f"{rate / 1e9:.1f} GB/s" == "0.0 GB/s"  # the old label
    assert rate_label(rate) == "0.025 GB/s"
    assert rate_label(busbw(32 * MIB, 0.483, WORLD)) == "0.10 GB/s"
    assert rate_label(2.4e9) == "2.4 GB/s" and rate_label(480e9) == "480 GB/s"
    assert rate_label(busbw(32 * MIB, 2e3, WORLD)) == "0.000025 GB/s"
    for missing in (math.nan, 0.0, -1.0, math.inf):
        assert math.isnan(busbw(32 * MIB, missing, WORLD))
    assert rate_label(math.nan) == rate_label(None) == "not measured"


RINGS = [1e5, 25e6, 0.1e9, 5e9, 600e9, None]  # bytes/s: the ring's busbw, or not measured


def _bars(ring):
    return {"your ring, 32 MiB": ring, **PUBLISHED}


@pytest.mark.parametrize("ring", RINGS)
def test_every_label_of_the_bus_bandwidth_chart_lies_inside_the_figure(ring):
    layout = bar_layout(_bars(ring))
    right = layout.width - layout.margin["r"]
    for i, text in enumerate(layout.texts):
        assert layout.text_right_px(i) <= right, (text, layout.text_right_px(i), right)
    for i, label in enumerate(layout.labels):
        assert layout.label_left_px(i) >= 0, label
    if ring is None:
        assert "your ring, 32 MiB: not measured" in layout.labels
    fig = busbw_chart(_bars(ring), "busbw")
    assert fig.layout.width == layout.width and fig.layout.margin.l == layout.margin["l"]
    assert tuple(fig.layout.xaxis.range) == layout.x_range
    assert fig.data[0].textposition == "outside" and fig.data[0].cliponaxis is False
    assert list(fig.data[0].y)[-1].startswith("your ring")  # the first bar on top
    assert list(fig.data[0].text)[-1] == ("" if ring is None else rate_label(ring))


def test_the_old_chart_drew_its_largest_value_past_the_figure():
    # The old chart: margins 260 and 60, the x range plotly's autorange (the bars' span and
    # about 5% more), "480.0 GB/s" drawn beyond the bar: past the plot, clipped.
    old = bar_layout(_bars(0.1e9))
    lo, hi = math.log10(100e6), math.log10(480e9)
    old = BarLayout(760, 320, {"t": 60, "b": 40, "l": 260, "r": 60},
                    (lo, hi + 0.05 * (hi - lo)), old.labels, old.values,
                    [f"{v / 1e9:.1f} GB/s" for v in old.values])
    assert old.text_right_px(old.texts.index("480.0 GB/s")) > old.width - old.margin["r"]


def _chromium_missing() -> str | None:
    chromium = os.environ.get("ROOFLAB_CHROMIUM", "/usr/bin/chromium")
    if not os.access(chromium, os.X_OK):
        return f"no Chromium at {chromium}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no playwright"
    return None


@pytest.mark.browser
@pytest.mark.skipif(_chromium_missing() is not None, reason=str(_chromium_missing()))
def test_drawn_by_plotly_js_every_text_of_the_chart_is_inside_the_figure():
    import plotly
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ.get("ROOFLAB_CHROMIUM", "/usr/bin/chromium"),
            headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.set_content("<!DOCTYPE html><html><body><div id=g></div></body></html>")
        page.add_script_tag(path=str(Path(plotly.__file__).parent / "package_data"
                                     / "plotly.min.js"))
        for ring in RINGS:
            figure = json.loads(busbw_chart(_bars(ring), "All-reduce bus bandwidth").to_json())
            texts = page.evaluate("""async (f) => {
                const g = document.getElementById('g');
                await Plotly.newPlot(g, f.data, f.layout);
                const r = g.getBoundingClientRect();
                return Array.from(g.querySelectorAll('text')).filter(t => t.textContent)
                  .map(t => { const b = t.getBoundingClientRect();
                    return [t.textContent, b.left - r.left, b.right - r.left,
                            b.top - r.top, b.bottom - r.top]; });
            }""", figure)
            width, height = figure["layout"]["width"], figure["layout"]["height"]
            drawn = {text for text, *_ in texts}
            assert set(bar_layout(_bars(ring)).texts) - {""} <= drawn
            for text, left, right, top, bottom in texts:
                assert 0 <= left and right <= width and 0 <= top and bottom <= height, text
        browser.close()
