"""Lab 08's α–β model of a ring all-reduce, fitted to the learner's own timings, and its
bus-bandwidth chart.

A ring all-reduce of S bytes on N ranks makes 2(N − 1) steps of S/N bytes:
t(S) = 2(N − 1)·α + 2(N − 1)/N·S/β. ``fit_alpha_beta`` fits α and 1/β to the fastest of
the repeats at each size; ``held_out_report`` holds the sizes left out of the fit against
the line, each with its figures, and says a size is near the line only when it is within
``NEAR`` of it. ``busbw``, ``rate_label`` and ``busbw_chart`` draw the ring beside the
published figures, every label inside the figure.

Why the fastest repeat: on gloo on a CPU the ranks share their cores with each other and
with whatever else the machine runs. Another process can only add time to a run, never
take it away, so the fastest repeat is the one least disturbed, the nearest to what the
ring itself costs; a mean or a median carries the disturbance into α and β.

numpy only; plotly is imported by ``busbw_chart`` when it draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..course.record import CHART_WIDTH

NEAR = 1.5  # a held-out size is near the line if measured / predicted is in [1/1.5, 1.5]


def slowest_rank_runs(per_rank: Sequence) -> np.ndarray:
    """Each rank's times, (sizes, repeats) seconds, -> each run's time, its slowest rank's:
    a collective ends when its last rank does."""
    return np.stack([np.asarray(times, dtype=np.float64) for times in per_rank]).max(0)


@dataclass(frozen=True)
class AlphaBeta:
    """t(S) = steps·α + per_byte·S/β on ``world`` ranks, fitted to ``fitted_on`` sizes."""

    world: int
    alpha: float  # seconds a step
    inv_beta: float  # seconds a byte
    fitted_on: int  # sizes

    @property
    def steps(self) -> int:
        return 2 * (self.world - 1)

    @property
    def per_byte(self) -> float:
        return 2 * (self.world - 1) / self.world

    @property
    def beta(self) -> float:
        return 1 / self.inv_beta

    @property
    def crossover(self) -> float:
        """The size in bytes at which the two terms are equal: S = N·α·β."""
        return self.world * self.alpha * self.beta

    def predict(self, size: float | np.ndarray) -> float | np.ndarray:
        """Seconds for an all-reduce of ``size`` bytes a rank."""
        return self.steps * self.alpha + self.per_byte * np.asarray(size) * self.inv_beta

    def __str__(self) -> str:
        return (f"fit on the fastest repeat of {self.fitted_on} sizes: α = "
                f"{self.alpha * 1e6:.0f} µs a step, β = {rate_label(self.beta)}; the terms "
                f"are equal at S = N·α·β = {size_label(self.crossover)}")


def fit_alpha_beta(sizes: Sequence[float], runs: np.ndarray, world: int) -> AlphaBeta:
    """α and 1/β from ``runs`` (sizes, repeats) seconds of all-reduces of ``sizes`` bytes a
    rank: least squares on the fastest repeat at each size, in relative error (the times
    span orders of magnitude, and an absolute fit would serve the largest size alone).
    Neither term is negative: if the best line wants one, the other is fitted alone."""
    s = np.asarray(sizes, dtype=np.float64)
    best = np.asarray(runs, dtype=np.float64).min(axis=1)
    steps, per_byte = 2 * (world - 1), 2 * (world - 1) / world
    a = np.stack([np.full(len(s), float(steps)), per_byte * s], 1) / best[:, None]
    ones = np.ones(len(s))
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, ones, rcond=None)
    if alpha < 0 or inv_beta <= 0:
        # One term alone: x = (a·1)/(a·a) minimises |a·x − 1|² over one column.
        lone = [(a[:, k] @ ones) / (a[:, k] @ a[:, k]) for k in (0, 1)]
        residual = [np.sum((a[:, k] * lone[k] - 1) ** 2) for k in (0, 1)]
        alpha, inv_beta = (lone[0], 0.0) if residual[0] <= residual[1] else (0.0, lone[1])
    return AlphaBeta(world, float(alpha), max(float(inv_beta), 1e-15), len(s))


# --- what was measured against what was predicted --------------------------------------


def size_label(size: float) -> str:
    """Bytes in binary units, as the sizes are powers of two: 1 KiB, 32 MiB, 1.15 MiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return f"{size:.0f} B"


def ms_label(seconds: float) -> str:
    """Milliseconds to three significant figures (no fewer than the units): 7.25, 811, 1343."""
    return _sig(seconds * 1e3, 3)


def _sig(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant figures, never in scientific notation."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{round(x, decimals):.{decimals}f}"


@dataclass(frozen=True)
class HeldOut:
    """One size left out of the fit: its repeats against the line."""

    size: float  # bytes a rank
    best: float  # seconds: the fastest repeat, what the fit would have used
    slowest: float  # seconds: the slowest repeat
    repeats: int
    predicted: float  # seconds

    @property
    def ratio(self) -> float:
        """Measured (fastest repeat) over predicted: 1.0 is on the line."""
        return self.best / self.predicted

    def near(self, tolerance: float = NEAR) -> bool:
        return 1 / tolerance <= self.ratio <= tolerance

    def line(self, tolerance: float = NEAR) -> str:
        verdict = "near it" if self.near(tolerance) else (
            "above it" if self.ratio > 1 else "below it")
        return (f"{size_label(self.size)}: measured min {ms_label(self.best)} ms (of "
                f"{self.repeats} repeats, up to {ms_label(self.slowest)}), predicted "
                f"{ms_label(self.predicted)} ms: {self.ratio:.2f}× the line, {verdict}")


def held_out(sizes: Sequence[float], runs: np.ndarray, model: AlphaBeta) -> list[HeldOut]:
    """Each of ``sizes`` (bytes) with its ``runs`` (sizes, repeats) against ``model``."""
    runs = np.asarray(runs, dtype=np.float64)
    return [HeldOut(float(size), float(times.min()), float(times.max()), len(times),
                    float(model.predict(size)))
            for size, times in zip(sizes, runs, strict=True)]


def held_out_report(sizes: Sequence[float], runs: np.ndarray, model: AlphaBeta,
                    tolerance: float = NEAR) -> str:
    """A line for each held-out size (measured, predicted, how far off), then how many
    lie within ``tolerance``× of the line either way, and which do not."""
    points = held_out(sizes, runs, model)
    lines = [f"held out of the fit, predicted, then measured (near: within {tolerance:g}× of "
             f"the line, either way):"]
    lines += [f"  {point.line(tolerance)}" for point in points]
    off = [point for point in points if not point.near(tolerance)]
    if not off:
        lines.append(f"All {len(points)} held-out sizes fall within {tolerance:g}× of the "
                     f"line: α and β describe these timings.")
    elif len(off) == len(points):
        lines.append(f"None of the {len(points)} held-out sizes falls within {tolerance:g}× "
                     f"of the line: on this run the model does not describe the timings "
                     f"(other work on the cores? run the cell again).")
    else:
        lines.append(f"{len(points) - len(off)} of {len(points)} held-out sizes fall within "
                     f"{tolerance:g}× of the line; off it: "
                     + ", ".join(f"{size_label(point.size)} ({point.ratio:.2f}×)"
                                 for point in off) + ".")
    return "\n".join(lines)


# --- the bus bandwidth -------------------------------------------------------------------


def busbw(size: float, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth, bytes/s: algbw = S/t times 2(N − 1)/N. NaN where the
    time is not a positive finite number (not measured)."""
    if not (math.isfinite(seconds) and seconds > 0):
        return math.nan
    return size / seconds * 2 * (world - 1) / world


def rate_label(bytes_per_second: float | None) -> str:
    """GB/s to two significant figures, however small: 480 GB/s, 2.4 GB/s, 0.025 GB/s;
    'not measured' for a missing rate."""
    if bytes_per_second is None or not (math.isfinite(bytes_per_second)
                                         and bytes_per_second > 0):
        return "not measured"
    return f"{_sig(bytes_per_second / 1e9, 2)} GB/s"


# Text drawn at FONT_PX is estimated at CHAR_EM font sizes a character: above the average
# width of plotly's default font (Open Sans), so an estimate that fits, fits when drawn.
FONT_PX = 12
CHAR_EM = 0.62
TEXT_PAD_PX = 8  # between a bar's end and its label (plotly leaves about 3)
TICK_PAD_PX = 12  # between a category label and the axis


def text_px(text: str, font_px: float = FONT_PX) -> float:
    return len(text) * CHAR_EM * font_px


@dataclass(frozen=True)
class BarLayout:
    """Where everything of the bar chart goes, in pixels of a figure ``width`` wide."""

    width: int
    height: int
    margin: dict[str, int]
    x_range: tuple[float, float]  # log10 of bytes/s
    labels: list[str]  # categories, bottom to top as plotly draws them
    values: list[float | None]  # bytes/s, None where not measured
    texts: list[str]  # drawn beyond each bar's end ("" for a bar not measured)

    @property
    def plot_width(self) -> int:
        return self.width - self.margin["l"] - self.margin["r"]

    def bar_end_px(self, value: float) -> float:
        lo, hi = self.x_range
        return self.margin["l"] + (math.log10(value) - lo) / (hi - lo) * self.plot_width

    def text_right_px(self, i: int) -> float:
        """The right end of bar i's label, measured from the figure's left edge."""
        value = self.values[i]
        if value is None:
            return self.margin["l"]
        return self.bar_end_px(value) + TEXT_PAD_PX + text_px(self.texts[i])

    def label_left_px(self, i: int) -> float:
        """The left end of category i's label (right-aligned at the axis)."""
        return self.margin["l"] - TICK_PAD_PX - text_px(self.labels[i])


def bar_layout(bars: Mapping[str, float | None], width: int = CHART_WIDTH,
               height: int = 320) -> BarLayout:
    """Margins and an x range for horizontal bars on a log axis such that every category
    label and every value drawn beyond a bar's end lies inside the plot area, with the
    smallest bar still long enough to see."""
    values = [v if v is not None and math.isfinite(v) and v > 0 else None
              for v in bars.values()]
    # A bar not measured has no length to draw its value beyond: its label says so.
    labels = [label if v is not None else f"{label}: {rate_label(v)}"
              for label, v in zip(bars, values, strict=True)]
    texts = [rate_label(v) if v is not None else "" for v in values]
    left = int(math.ceil(max(text_px(label) for label in labels))) + TICK_PAD_PX + 8
    margin = {"t": 60, "b": 50, "l": left, "r": 30}
    plot = width - left - margin["r"]
    measured = [math.log10(v) for v in values if v is not None]
    lo = (min(measured) if measured else 9.0) - 0.5
    # A bar ends at (log10 v − lo)/(hi − lo) of the plot's width; its label needs text_w
    # more pixels: (log10 v − lo)/(hi − lo)·plot + text_w <= plot.
    hi = lo + 1.0
    for v, text in zip(values, texts, strict=True):
        room = plot - TEXT_PAD_PX - text_px(text)
        if v is not None:
            hi = max(hi, lo + (math.log10(v) - lo) * plot / room)
    return BarLayout(width, height, margin, (lo, hi), labels, values, texts)


def busbw_chart(bars: Mapping[str, float | None], title: str, width: int = CHART_WIDTH):
    """Horizontal bars of bus bandwidth (bytes/s, log axis), each labelled with its value
    (``rate_label``), the first bar at the top."""
    import plotly.graph_objects as go

    # plotly draws categories bottom to top: reverse, so the first is at the top.
    layout = bar_layout(dict(reversed(list(bars.items()))), width)
    fig = go.Figure(go.Bar(
        x=layout.values, y=layout.labels,
        orientation="h", text=layout.texts, textposition="outside", cliponaxis=False,
        textfont={"size": FONT_PX}))
    fig.update_layout(
        title=title, width=layout.width, height=layout.height, margin=layout.margin,
        font={"size": FONT_PX}, xaxis={"type": "log", "range": list(layout.x_range),
                                       "title": "busbw, bytes/s"},
        yaxis={"automargin": True, "tickfont": {"size": FONT_PX}})
    return fig
