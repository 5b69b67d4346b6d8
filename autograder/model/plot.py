"""Roofline pictures with plotly. Imported lazily: plotly is a lab extra, not a need."""

from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go

from ..device.roofline import Ceilings

Point = tuple[str, float, float, str]  # (label, FLOP/byte, achieved FLOP/s, dtype)


def roofline_figure(
    ceilings: Ceilings,
    dtypes: Iterable[str] | None = None,
    points: Iterable[Point] = (),
    beside: Ceilings | None = None,
) -> go.Figure:
    """Log-log roofline: attainable FLOP/s = min(peak, intensity × bandwidth) per dtype.

    ``beside`` (usually the datasheet) is drawn dashed so measured and promised can be
    compared at a glance.
    """
    dtypes = list(dtypes or ceilings.flops)
    fig = go.Figure()
    for roof, dash in ((ceilings, "solid"), (beside, "dash")):
        if roof is None:
            continue
        for dtype in dtypes:
            if dtype not in roof.flops:
                continue
            xs, ys = roof_line(roof.flops[dtype], roof.bandwidth)
            fig.add_scatter(x=xs, y=[y / 1e12 for y in ys], mode="lines", line={"dash": dash},
                            name=f"{dtype} — {roof.label}")
    for label, intensity, achieved, dtype in points:
        fig.add_scatter(x=[intensity], y=[achieved / 1e12], mode="markers+text", text=[label],
                        textposition="top center", marker={"size": 10},
                        name=f"{label} ({dtype})")
    fig.update_layout(
        title=f"Roofline — {ceilings.label}",
        xaxis={"type": "log", "title": "arithmetic intensity (FLOP / byte)"},
        yaxis={"type": "log", "title": "TFLOP/s"},
        height=420,
        margin={"t": 40, "b": 40, "l": 60, "r": 20},
    )
    return fig


def roof_line(peak: float, bandwidth: float, lowest: float = 1 / 16,
              highest: float = 4096) -> tuple[list[float], list[float]]:
    """The roof of one ceiling as three points: the slope from ``lowest`` FLOP/byte, the
    ridge at exactly peak / bandwidth (the corner the lesson is about), and the flat roof
    to ``highest``; the range widens to keep the ridge well inside it."""
    ridge = peak / bandwidth
    lowest, highest = min(lowest, ridge / 16), max(highest, ridge * 16)
    return [lowest, ridge, highest], [lowest * bandwidth, peak, peak]


def program_heatmap(report) -> go.Figure:
    """DRAM bytes each program moves (no reuse between programs), laid out as the grid."""
    z, y, x = report.per_program.shape
    grid = report.per_program[0] if z == 1 else report.per_program.sum(axis=0)
    fig = go.Figure(go.Heatmap(z=grid / 1024, colorscale="Viridis",
                               colorbar={"title": "KiB"},
                               hovertemplate="program (%{x}, %{y}): %{z:.1f} KiB<extra></extra>"))
    fig.update_layout(
        title=f"{report.kernel}: bytes moved per program ({x}×{y} grid)",
        xaxis={"title": "program_id(0)"}, yaxis={"title": "program_id(1)", "autorange": "reversed"},
        height=360, margin={"t": 50, "b": 40, "l": 60, "r": 20})
    return fig


def access_pattern(launch, program: int, tensor: str) -> go.Figure:
    """Which elements of one tensor one program loads and stores, drawn over the tensor.
    Each cell is an element; colour says loaded, stored, or untouched."""
    import numpy as np

    arg = next(t for t in launch.tensors if t.name == tensor)
    shape = arg.shape if len(arg.shape) == 2 else (1, int(np.prod(arg.shape)))
    stride = arg.stride if len(arg.stride) == 2 else (0, 1)
    offsets = (np.arange(shape[0])[:, None] * stride[0]
               + np.arange(shape[1])[None, :] * stride[1]) * arg.element_size + arg.base
    marks = np.zeros(shape)
    for access in launch.accesses:
        if access.program != program:
            continue
        touched = access.addresses[access.active]
        hit = np.isin(offsets.astype(np.uint64), touched)
        marks[hit] = np.maximum(marks[hit], 2 if access.kind != "load" else 1)
    fig = go.Figure(go.Heatmap(
        z=marks, zmin=0, zmax=2, showscale=False,
        colorscale=[[0, "#f0f0f0"], [0.5, "#4c78a8"], [1, "#e45756"]],
        hovertemplate="element (%{y}, %{x})<extra></extra>"))
    fig.update_layout(
        title=f"{launch.kernel}, program {program}: elements of {tensor} loaded (blue) "
              "and stored (red)",
        xaxis={"title": "column"}, yaxis={"title": "row", "autorange": "reversed"},
        height=360, margin={"t": 50, "b": 40, "l": 60, "r": 20})
    return fig
