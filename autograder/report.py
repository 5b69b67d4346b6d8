"""Show a CheckResult: a compact HTML report in Jupyter, one text line elsewhere."""

from __future__ import annotations

import html as _html

from .result import CheckResult


def in_notebook() -> bool:
    """True inside a Jupyter kernel (not a terminal IPython, not a plain script)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def show(result: CheckResult) -> None:
    if in_notebook():
        from IPython.display import HTML, display

        display(HTML(html(result)))
        figure = _roofline_figure(result)
        if figure is not None:
            display(figure)
    else:
        print(result.line)


_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "NOT IMPLEMENTED": "#9a6700",
            "NEEDS A GPU": "#0969da"}


def html(result: CheckResult) -> str:
    """A self-contained HTML fragment: verdict, causes, per-case table, performance."""
    esc = _html.escape
    colour = _COLOURS[result.verdict]
    parts = [
        f'<div style="font-family: sans-serif; font-size: 13px; border-left: 4px solid {colour};'
        ' padding: 4px 10px">',
        f'<b style="color: {colour}">{esc(result.verdict)}</b>'
        f' <code>{esc(result.problem_id)}</code>'
        f' <span style="color: #57606a">— {esc(result.mode)}</span>',
    ]
    if result.verdict == "NEEDS A GPU":
        parts.append(f"<div>{esc(result.needs_gpu)}</div>")
    if result.causes:
        items = "".join(f"<li>{esc(c)}</li>" for c in result.causes)
        parts.append(f"<ul style='margin: 4px 0'>{items}</ul>")
    if result.cases or result.skipped:
        rows = "".join(
            f"<tr><td>{'✓' if c.ok else '✗'}</td><td>{esc(c.case.label)}</td>"
            f"<td>{esc(c.summary)}{_details(c.details)}</td></tr>"
            for c in result.cases
        )
        for skipped in result.skipped:  # "label: why", as the engine writes it
            label, _, why = skipped.partition(": ")
            rows += (f"<tr style='color: #57606a'><td>–</td><td>{esc(label)}</td>"
                     f"<td>skipped: {esc(why)}</td></tr>")
        parts.append(
            "<table style='border-collapse: collapse; margin: 4px 0'>"
            "<tr><th></th><th align=left>case</th><th align=left>result</th></tr>"
            f"{rows}</table>"
        )
    perf = result.performance
    if perf is not None:
        parts.append(f"<div>{esc(perf.line)}</div>")
        parts.append(f"<div style='color: #57606a'>{esc(perf.bottleneck)}</div>")
    parts.append(f"<div style='color: #57606a'>seed {result.seed}</div></div>")
    return "\n".join(parts)


def _details(lines: list[str]) -> str:
    """A case's lines under its summary (one per rank of a multi-process case)."""
    if not lines:
        return ""
    text = _html.escape("\n".join(lines))
    return f"<pre style='margin: 2px 0 0; font-size: 12px; white-space: pre-wrap'>{text}</pre>"


def _roofline_figure(result: CheckResult):
    """The roofline with the kernel's point, when it was measured and plotly is present."""
    perf = result.performance
    if perf is None or not perf.measured or not perf.cost.flops:
        return None  # a pure copy has no place on a FLOP/s axis; the text says it all
    try:
        from .model.plot import roofline_figure
    except ImportError:
        return None
    from .device import current
    from .device.roofline import datasheet_for

    achieved = perf.cost.flops / perf.seconds if perf.cost.flops else 0.0
    point = (result.problem_id, perf.cost.intensity, achieved, perf.cost.dtype)
    return roofline_figure(perf.ceilings, dtypes=[perf.cost.dtype], points=[point],
                           beside=datasheet_for(current()))
