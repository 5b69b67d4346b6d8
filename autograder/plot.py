"""Roofline pictures with plotly. Imported lazily: plotly is a lab extra, not a need."""

from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go

from .roofline import Ceilings

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
    intensities = [2.0**e for e in range(-4, 13)]
    for roof, dash in ((ceilings, "solid"), (beside, "dash")):
        if roof is None:
            continue
        for dtype in dtypes:
            if dtype not in roof.flops:
                continue
            peak = roof.flops[dtype]
            ys = [min(peak, i * roof.bandwidth) / 1e12 for i in intensities]
            fig.add_scatter(x=intensities, y=ys, mode="lines", line={"dash": dash},
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
