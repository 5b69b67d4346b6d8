"""The pictures of the concept pages, drawn with plotly as the labs draw their charts, and
saved as SVG beside this file: `.venv/bin/python book/concepts/draw.py [name ...]`.

Run by hand after changing a picture, then commit the SVG files; the book only reads them.
Each picture is computed here from the rule its page states (no kernel runs), with the
chart code of the lab that teaches it where the lab has one. plotly.js draws them in
headless Chromium, as `make record` draws the labs' charts. roofline.svg is drawn by hand.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rooflab.autograder.course.record import ChartDrawer

HERE = Path(__file__).resolve().parent
WIDTH = 760
MARGIN = {"t": 70, "b": 50, "l": 70, "r": 20}
SECTOR = 32  # bytes


def coalescing() -> go.Figure:
    """Lab 01's picture: the sectors one warp's 32 fp32 loads touch, by stride."""
    def sectors_used(stride: int, elem_bytes: int = 4, lanes: int = 32) -> dict[int, int]:
        used: dict[int, int] = {}
        for lane in range(lanes):
            sector = lane * stride * elem_bytes // SECTOR
            used[sector] = used.get(sector, 0) + elem_bytes
        return used

    strides = [1, 2, 4, 8]
    columns = list(range(32))
    rows = [f"stride {s}" for s in strides]
    fig = go.Figure(go.Heatmap(
        z=[[sectors_used(s).get(k) for k in columns] for s in strides], x=columns, y=rows,
        zmin=0, zmax=SECTOR, colorscale="Blues", xgap=2, ygap=2,
        colorbar={"title": "bytes used", "len": 0.8}))
    for stride, row in zip(strides, rows, strict=True):
        used = sectors_used(stride)
        share = sum(used.values()) / (len(used) * SECTOR)
        fig.add_annotation(x=len(used) - 0.5, y=row, xanchor="left", showarrow=False,
                           text=f"  {len(used)} sectors moved, {share:.0%} of their bytes used")
    fig.update_layout(
        title="One warp reads 32 fp32 values, lane i at element i · stride:<br>"
              "the 32-byte sectors that move (blank: not touched)",
        xaxis_title="32-byte sector (address ÷ 32)", yaxis_autorange="reversed",
        height=300, margin=MARGIN)
    return fig


def tiling() -> go.Figure:
    """Lab 02's picture: which program computes each tile of C, row-major and grouped, with
    the first wave of a card running 8 programs at a time in orange."""
    tiles, wave = 8, 8

    def order(group_m: int) -> np.ndarray:
        programs = np.zeros((tiles, tiles), dtype=int)
        for pid in range(tiles * tiles):
            group, within = divmod(pid, group_m * tiles)
            rows = min(tiles - group * group_m, group_m)
            programs[group * group_m + within % rows, within // rows] = pid
        return programs

    titles = []
    for group_m in (1, 4):
        rows, cols = np.nonzero(order(group_m) < wave)
        a, b = len(set(rows)), len(set(cols))
        titles.append(f"GROUP_M = {group_m}: the first wave reads<br>{a} panel{'s' * (a > 1)} "
                      f"of A and {b} of B")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=titles)
    for col, group_m in enumerate((1, 4), start=1):
        programs = order(group_m)
        fig.add_trace(go.Heatmap(
            z=(programs < wave).astype(float), text=programs, texttemplate="%{text}",
            zmin=0, zmax=1, colorscale=[[0, "#e8e8e8"], [1, "#f58518"]], showscale=False,
            xgap=2, ygap=2), row=1, col=col)
    fig.update_xaxes(title_text="tile column of C")
    fig.update_yaxes(title_text="tile row of C", autorange="reversed")
    fig.update_layout(title={"text": "Which program computes each tile of C; in orange the "
                                     "first wave, 8 programs", "y": 0.97},
                      height=460, margin={**MARGIN, "t": 120})
    return fig


def online_softmax() -> go.Figure:
    """The running max and sum of a row walked in blocks of four: each time the max rises,
    the sum so far is multiplied by exp(m_old - m_new)."""
    row = np.array([1, 3, 0, 2, 5, 2, 4, 1, 3, 0, 2, 1, 8, 6, 7, 2], dtype=float)
    block = 4
    m, d, unscaled = -np.inf, 0.0, 0.0
    ms, ds, stale = [], [], []
    for start in range(0, len(row), block):
        part = row[start:start + block]
        new = max(m, part.max())
        d = d * np.exp(m - new) + np.exp(part - new).sum()
        unscaled += np.exp(part - new).sum()  # the old terms left relative to the old max
        m = new
        ms.append(m)
        ds.append(d)
        stale.append(unscaled)
    direct = np.exp(row - row.max()).sum()
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("the row, and its running max m",
                                        "the running sum d"))
    colours = ["#4c78a8", "#f58518", "#54a24b", "#b279a2"]
    for index, start in enumerate(range(0, len(row), block)):
        fig.add_bar(x=list(range(start, start + block)), y=row[start:start + block],
                    marker_color=colours[index], name=f"block {index + 1}", row=1, col=1)
    fig.add_scatter(x=[*range(-1, len(row), block)][:len(ms)] + [len(row) - 1],
                    y=[*ms, ms[-1]], mode="lines",
                    line={"shape": "hv", "color": "black", "width": 2}, name="running max m",
                    row=1, col=1)
    blocks = [f"after {i + 1}" for i in range(len(ds))]
    fig.add_scatter(x=blocks, y=ds, mode="lines+markers", name="d, rescaled (online)",
                    line={"color": "#1f77b4", "width": 3}, row=1, col=2)
    fig.add_scatter(x=blocks, y=stale, mode="lines+markers", name="d, never rescaled",
                    line={"color": "#d62728", "dash": "dot"}, row=1, col=2)
    fig.add_scatter(x=blocks, y=[direct] * len(blocks), mode="lines", name="the whole row's sum",
                    line={"color": "gray", "dash": "dash"}, row=1, col=2)
    for i in range(1, len(ms)):
        if ms[i] > ms[i - 1]:
            fig.add_annotation(x=blocks[i], y=np.log10(ds[i]), row=1, col=2, ax=0, ay=-40,
                               text=f"× e^({ms[i - 1]:g}−{ms[i]:g})", arrowhead=2)
    fig.update_xaxes(title_text="element", row=1, col=1)
    fig.update_xaxes(title_text="blocks of 4 read", row=1, col=2)
    fig.update_yaxes(title_text="x", row=1, col=1)
    fig.update_yaxes(title_text="d = Σ exp(x − m)", type="log", row=1, col=2)
    fig.update_layout(title="Online softmax: when the max rises, the sum so far is rescaled",
                      height=420, legend={"orientation": "h", "y": -0.25}, margin=MARGIN)
    return fig


def io_aware_attention() -> go.Figure:
    """Lab 04's picture: the tiles of scores each program computes in causal attention."""
    n, block_m, block_n = 512, 64, 32
    plan = np.zeros((n // block_m, n // block_n), dtype=int)
    for i in range(plan.shape[0]):
        first, last = i * block_m, (i + 1) * block_m - 1  # the block's query rows
        for j in range(plan.shape[1]):
            lo, hi = j * block_n, (j + 1) * block_n - 1  # the block's keys
            plan[i, j] = 0 if lo > last else (2 if hi <= first else 1)
    colours = [[0, "#eeeeee"], [0.33, "#eeeeee"], [0.33, "#f4a582"], [0.67, "#f4a582"],
               [0.67, "#2166ac"], [1, "#2166ac"]]
    fig = go.Figure(go.Heatmap(z=plan, zmin=-0.5, zmax=2.5, colorscale=colours, xgap=2,
                               ygap=2, showscale=False))
    fig.add_annotation(x=plan.shape[1] - 0.5, y=1.5, xanchor="right", showarrow=False,
                       align="right",
                       text="each row: one program, its 64 queries on chip,<br>walking the "
                            "key blocks left to right;<br>each score tile lives in registers "
                            "for one step")
    computed = (plan > 0).mean()
    fig.update_layout(
        title=f"Causal attention, N = {n}, blocks {block_m} × {block_n}: the N × N scores, "
              f"tile by tile<br>blue computed, orange masked (the diagonal), grey skipped;<br>"
              f"{computed:.0%} of the tiles run, and none goes to memory",
        xaxis_title="key block (BLOCK_N = 32 keys)",
        yaxis_title="query block (one program)", yaxis_autorange="reversed",
        height=420, margin={**MARGIN, "t": 110})
    return fig


def top_k() -> go.Figure:
    """Lab 05's picture: the top byte of the keys of one row of normal scores."""
    scores = np.random.default_rng(0).standard_normal(262144).astype(np.float32)
    bits = scores.view(np.uint32)
    keys = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000))
    k = 1000
    counts = np.bincount((keys >> 24).astype(np.int64), minlength=256)
    at_or_above = np.cumsum(counts[::-1])[::-1]
    bucket = int((at_or_above >= k).sum()) - 1
    used = np.flatnonzero(counts)
    colours = ["seagreen" if b > bucket else "darkorange" if b == bucket else "lightgray"
               for b in used]
    fig = go.Figure(go.Bar(x=[f"{b:#04x}" for b in used], y=counts[used], marker_color=colours,
                           marker_line_color="black", marker_line_width=0.5))
    # On a category axis an annotation is placed by the category's index.
    fig.add_annotation(x=int(np.flatnonzero(used == bucket)[0]), y=np.log10(counts[bucket]),
                       ax=-330, ay=20, arrowhead=2,
                       text=f"the threshold bucket, [2, 8): the {k:,}th largest is here;<br>"
                            f"with the buckets above it (none here) it holds "
                            f"{at_or_above[bucket]:,} scores,<br>the "
                            f"{at_or_above[bucket] / len(scores):.1%} of the row left to sort")
    fig.update_layout(
        title=f"Radix select: one row of 262 144 normal scores, k = {k:,}, counted by the top "
              "byte of the key<br>grey: out of the top k; orange: the threshold bucket",
        xaxis={"title": "top byte of the key (bucket)", "type": "category"},
        yaxis={"title": "scores", "type": "log"},
        height=400, margin={**MARGIN, "t": 90})
    return fig


def k_means() -> go.Figure:
    """Lloyd's algorithm on 2-D points: where the centroids go, step by step."""
    generator = np.random.default_rng(3)
    centres = np.array([[0, 0], [6, 1], [2, 6], [7, 7]], dtype=float)
    points = np.concatenate([c + generator.standard_normal((150, 2)) for c in centres])
    centroids = points[[5, 12, 160, 170]].copy()  # a poor start: two in one group
    path = [centroids.copy()]
    for _ in range(10):
        distances = ((points[:, None, :] - centroids[None]) ** 2).sum(axis=2)
        labels = distances.argmin(axis=1)
        centroids = np.array([points[labels == j].mean(axis=0) for j in range(len(centroids))])
        path.append(centroids.copy())
    path = np.array(path)  # step, centroid, (x, y)
    colours = ["#4c78a8", "#f58518", "#54a24b", "#b279a2"]
    fig = go.Figure()
    for j, colour in enumerate(colours):
        mine = points[labels == j]
        fig.add_scatter(x=mine[:, 0], y=mine[:, 1], mode="markers", showlegend=False,
                        marker={"color": colour, "size": 5, "opacity": 0.45})
    for j in range(len(colours)):
        fig.add_scatter(x=path[:, j, 0], y=path[:, j, 1], mode="lines+markers",
                        showlegend=j == 0, name="a centroid, step by step",
                        line={"color": "black", "width": 2},
                        marker={"color": "black", "size": 6})
    fig.add_scatter(x=path[0, :, 0], y=path[0, :, 1], mode="markers", name="the start",
                    marker={"symbol": "x", "size": 12, "color": "#d62728"})
    fig.update_layout(
        title="Lloyd's algorithm, 600 points, k = 4: assign each point to its nearest "
              "centroid,<br>move each centroid to the mean of its points, repeat",
        xaxis={"title": "feature 1", "zeroline": False, "range": [-4, 11]},
        yaxis={"title": "feature 2", "zeroline": False, "range": [-4, 11]},
        height=480, legend={"orientation": "h", "y": -0.15}, margin={**MARGIN, "t": 90})
    return fig


def mixed_precision() -> go.Figure:
    """Lab 07's picture: the range of each format, subnormals to largest, on log2 axes."""
    from rooflab.kernels.amp import FORMATS, format_limits

    fig = go.Figure()
    for name in FORMATS:
        limits = format_limits(name)
        low, normal, high = (np.log2(limits[k]) for k in ("min_subnormal", "min_normal", "max"))
        fig.add_bar(y=[name], x=[normal - low], base=[low], orientation="h",
                    marker_color="lightsteelblue", showlegend=name == "fp32",
                    name="subnormals: fewer significant bits")
        fig.add_bar(y=[name], x=[high - normal], base=[normal], orientation="h",
                    marker_color="steelblue", showlegend=name == "fp32",
                    name="normal numbers", text=[f"spacing 2^-{FORMATS[name][1]} near 1"],
                    textposition="inside")
    fig.add_vrect(x0=-40, x1=-24, fillcolor="#d62728", opacity=0.12, line_width=0)
    fig.add_annotation(x=-44, y="fp8 e5m2", xanchor="right", align="right", showarrow=False,
                       font={"color": "#d62728"},
                       text="below fp16's smallest number (shaded):<br>many gradients of a "
                            "large batch,<br>lost unless the loss is scaled up")
    fig.update_layout(
        title="What each format can hold: log2 |x| from the smallest subnormal to the largest",
        barmode="overlay", height=420, xaxis={"title": "log2 |x|", "range": [-155, 135]},
        uniformtext={"minsize": 10, "mode": "hide"},
        yaxis={"autorange": "reversed"}, legend={"orientation": "h", "y": -0.22},
        margin={**MARGIN, "l": 80})
    return fig


def collectives() -> go.Figure:
    """A ring all-reduce on 4 ranks: the chunk each rank sends at each step, and how many
    ranks' parts it already sums."""
    ranks = 4
    chunk = "ABCD"
    steps = [f"reduce-scatter {s + 1}" for s in range(ranks - 1)]
    steps += [f"all-gather {s + 1}" for s in range(ranks - 1)]
    summed = np.zeros((ranks, len(steps)))
    text = [["" for _ in steps] for _ in range(ranks)]
    for r in range(ranks):
        for s in range(ranks - 1):
            sent = (r - s) % ranks
            summed[r, s] = s + 1
            text[r][s] = f"{chunk[sent]}: {s + 1} of {ranks}"
            sent = (r + 1 - s) % ranks
            summed[r, ranks - 1 + s] = ranks
            text[r][ranks - 1 + s] = f"{chunk[sent]}: whole"
    fig = go.Figure(go.Heatmap(
        z=summed, x=steps, y=[f"rank {r} → {(r + 1) % ranks}" for r in range(ranks)],
        text=text, texttemplate="%{text}", zmin=0, zmax=ranks, xgap=3, ygap=3,
        colorscale=[[0, "#fdf2e3"], [0.75, "#f5a35c"], [1, "#2e86c1"]],
        colorbar={"title": "ranks summed", "len": 0.8}))
    fig.update_layout(
        title="Ring all-reduce on 4 ranks: what each rank sends to the next at each step<br>"
              "6 steps of a quarter of the tensor: 2 · 3/4 of it sent by each rank",
        xaxis={"side": "top", "tickangle": 0}, yaxis_autorange="reversed",
        height=330, margin={**MARGIN, "t": 110})
    return fig


def sharding() -> go.Figure:
    """FSDP's forward on one rank, 4 layers: all-gather a layer's weights, compute it, free
    them; with prefetch the next gather runs under this layer's compute."""
    layers, gather, compute = 4, 1.0, 1.5

    def forward(prefetch: bool) -> tuple[list[float], list[float], float]:
        """When each layer's all-gather and compute start, and when the forward ends."""
        gathers, computes, issue, done = [], [], 0.0, 0.0
        for _ in range(layers):
            issue = issue if prefetch else done
            gathers.append(issue)
            start = max(issue + gather, done)  # its weights are here, the last layer is done
            computes.append(start)
            issue, done = start, start + compute  # the next gather is issued as this starts
        return gathers, computes, done

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.2,
                        subplot_titles=("without prefetch", "with prefetch"))
    for row, prefetch in ((1, False), (2, True)):
        gathers, computes, done = forward(prefetch)
        for kind, starts, length, colour in (("all-gather", gathers, gather, "#f39c12"),
                                             ("compute", computes, compute, "#2e86c1")):
            fig.add_bar(orientation="h", y=[kind] * layers, base=starts, x=[length] * layers,
                        text=[f"layer {i}" for i in range(layers)], textposition="inside",
                        marker_color=colour, marker_line_color="white", marker_line_width=2,
                        showlegend=False, row=row, col=1)
        fig.add_annotation(x=done, y="compute", xanchor="left", showarrow=False,
                           text=f"  done at {done:g} ms", row=row, col=1)
    fig.update_xaxes(title_text="ms from the step's start (all-gather 1 ms, a layer's "
                                "compute 1.5 ms)", row=2, col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title="FSDP forward, one rank, 4 layers: gather a layer's weights, "
                            "compute, free them", barmode="overlay", height=400,
                      margin=MARGIN)
    return fig


def parallelism() -> go.Figure:
    """Lab 09's counting carried on: per GPU, the memory and the bytes sent a step of data,
    fully sharded data, tensor, and tensor with sequence parallelism, 8 GPUs, one model."""
    h, layers, seq, gpus, sequences = 4096, 32, 4096, 8, 8  # one sequence a micro-batch
    params = 12 * h * h * layers  # attention 4h², MLP 8h², each layer
    sbh = seq * h
    ring = (gpus - 1) / gpus  # what a ring collective sends from each GPU, per byte
    # Korthikanti et al. (2022): bytes of 16-bit activations a layer, the attention
    # scores not stored (FlashAttention): 34·sbh; tensor parallel over t splits all but
    # 10·sbh; with sequence parallelism, all of it.
    strategies = {
        "data (DP)": (16 * params, 34 * sbh * layers, ring * 2 * 2 * params),
        "fully sharded (FSDP)": (16 * params / gpus, 34 * sbh * layers,
                                 3 * ring * 2 * params),
        # 4 all-reduces a layer (2 forward, 2 backward) of a sequence's 2·sbh bytes, each
        # 2·(t − 1)/t of it sent (a reduce-scatter, then an all-gather), every sequence.
        "tensor (TP)": (16 * params / gpus, (10 + 24 / gpus) * sbh * layers,
                        sequences * layers * 4 * 2 * ring * 2 * sbh),
        "tensor + sequence (TP+SP)": (16 * params / gpus, 34 / gpus * sbh * layers,
                                      sequences * layers * 4 * 2 * ring * 2 * sbh),
    }
    names = list(strategies)
    gb = [[value / 1e9 for value in strategies[name]] for name in names]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("memory a GPU holds (GB)",
                                        "bytes a GPU sends a step (GB)"))
    fig.add_bar(x=names, y=[g[0] for g in gb], name="weights, gradients, optimizer (16Ψ/N)",
                marker_color="#2e86c1", row=1, col=1)
    fig.add_bar(x=names, y=[g[1] for g in gb], name="activations of one sequence",
                marker_color="#f39c12", row=1, col=1)
    fig.add_hline(y=80, line_dash="dot", line_color="firebrick", row=1, col=1,
                  annotation_text="an H100's 80 GB", annotation_position="top right")
    fig.add_bar(x=names, y=[g[2] for g in gb], name="sent (all-reduce, all-gather, "
                "reduce-scatter)", marker_color="#7d3c98", text=[f"{g[2]:.0f}" for g in gb],
                textposition="outside", row=1, col=2)
    fig.update_layout(title=f"A {params / 1e9:.1f}B-parameter transformer (h {h}, {layers} "
                            f"layers) on {gpus} GPUs,<br>a step of {sequences} sequences of "
                            f"{seq} tokens", barmode="stack", height=480,
                      legend={"orientation": "h", "y": -0.35}, margin={**MARGIN, "t": 115})
    return fig


PICTURES: dict[str, Callable[[], go.Figure]] = {
    "coalescing": coalescing,
    "tiling": tiling,
    "online-softmax": online_softmax,
    "io-aware-attention": io_aware_attention,
    "top-k": top_k,
    "k-means": k_means,
    "mixed-precision": mixed_precision,
    "collectives": collectives,
    "sharding": sharding,
    "parallelism": parallelism,
}


def main(names: list[str]) -> None:
    with ChartDrawer() as draw:
        for name in names or PICTURES:
            figure = PICTURES[name]()
            figure.update_layout(width=WIDTH, template="plotly_white")
            svg = draw(json.loads(figure.to_json()))
            (HERE / f"{name}.svg").write_text(svg)
            print(f"{name}.svg: {len(svg) / 1024:.0f} KiB")


if __name__ == "__main__":
    main(sys.argv[1:])
