"""What a check found: as data, as one text line, as a failure message, and as the card a
notebook shows (HTML in Jupyter, the one line elsewhere). What one case found is a
``CaseResult`` (``evidence/compare.py``): a problem's own grading makes those too."""

from __future__ import annotations

import html as _html
from dataclasses import dataclass, field

from ..device.roofline import Ceilings, Floor, Raise, fraction_note
from ..evidence.compare import CaseResult
from ..model.traffic import Prediction
from ..problem import Case, Cost


@dataclass
class Performance:
    """Where the kernel lands on the roofline. ``seconds`` is None when nothing was
    measured (on a CPU): then only the bound, from the cost model, is known."""

    case: Case
    cost: Cost
    ceilings: Ceilings
    floor: Floor
    seconds: float | None = None
    method: str = ""
    fraction: float | None = None
    level: str | None = None
    not_measured: str = ""  # why nothing was measured: "no GPU", "measure=False", ...
    prediction: Prediction | None = None  # from the interpreter's traced traffic
    predicted_case: Case | None = None
    notes: list[str] = field(default_factory=list)  # how to read a prediction
    baseline_name: str = ""  # the library call timed on the same inputs, if any
    baseline_seconds: float | None = None
    raised: list[Raise] = field(default_factory=list)  # ceilings this timing raised
    l2_bytes: int = 0  # the device's L2, to judge whether the data could have come from it

    @property
    def vs_baseline(self) -> float | None:
        """Baseline time / this time: 1.0 = as fast as the library, 0.5 = half its speed."""
        if self.seconds is None or self.baseline_seconds is None:
            return None
        return self.baseline_seconds / self.seconds

    @property
    def measured(self) -> bool:
        return self.seconds is not None

    @property
    def bottleneck(self) -> str:
        """The bound in words, with the numbers that make it so."""
        if not self.measured and self.prediction is not None:
            p = self.prediction
            return (f"predicted, not measured: {p.bottleneck}; DRAM {p.dram:,} B for "
                    f"{p.compulsory:,.0f} B compulsory, sector efficiency "
                    f"{p.sector_efficiency:.0%}")
        cost, ceil = self.cost, self.ceilings
        if self.floor.bound == "memory":
            return (f"memory-bound: {cost.bytes / 1e6:.3g} MB at "
                    f"{ceil.bandwidth / 1e9:.0f} GB/s ({ceil.label}) takes at least "
                    f"{self.floor.memory_s * 1e6:.3g} µs; intensity {cost.intensity:.3g} FLOP/B "
                    f"is below the ridge of {ceil.ridge(cost.dtype):.0f}")
        return (f"compute-bound: {cost.flops / 1e9:.3g} GFLOP at "
                f"{ceil.peak_flops(cost.dtype) / 1e12:.0f} {cost.dtype} TFLOP/s ({ceil.label}) "
                f"takes at least {self.floor.compute_s * 1e6:.3g} µs")

    @property
    def line(self) -> str:
        if not self.measured and self.prediction is not None:
            notes = "".join(f"; {note}" for note in self.notes)
            return (f"nothing measured ({self.not_measured or 'no GPU'}); "
                    f"{self.prediction.line}{notes}")
        if not self.measured:
            return (f"nothing measured ({self.not_measured or 'no GPU'}); at {self.case.label} "
                    f"the {self.ceilings.device} datasheet floor is "
                    f"{self.floor.seconds * 1e6:.3g} µs ({self.floor.bound}-bound)")
        assert self.fraction is not None
        line = (f"{self.seconds * 1e6:.1f} µs median ({self.method}), {self.fraction:.0%} of "
                f"roofline [{self.level}], {self.floor.bound}-bound")
        if self.vs_baseline is not None:
            line += f", {self.vs_baseline:.2f}× {self.baseline_name}'s speed"
        if self.ceiling_note:
            line += f" ({self.ceiling_note})"
        return line

    @property
    def ceiling_note(self) -> str:
        """A ceiling this timing raised, or why the fraction is above 100%; "" if neither."""
        if self.seconds is None or self.fraction is None:
            return ""
        return fraction_note(self.fraction, self.cost, self.seconds, self.ceilings,
                             raised=self.raised, l2_bytes=self.l2_bytes, method=self.method)


@dataclass
class CheckResult:
    """The outcome of ``check(problem, candidate)``. ``passed`` is the verdict."""

    problem_id: str
    mode: str  # the device, as ``Device.mode`` says it
    seed: int
    cases: list[CaseResult] = field(default_factory=list)
    performance: Performance | None = None
    library_calls: list[str] = field(default_factory=list)
    # The grader's own functions a plain-Python candidate called (evidence/grader_calls.py).
    grader_calls: list[str] = field(default_factory=list)
    triton_launches: dict[str, int] = field(default_factory=dict)
    autotuned: dict[str, int] = field(default_factory=dict)  # launches via @triton.autotune
    cuda_launches: dict[str, int] = field(default_factory=dict)
    causes: list[str] = field(default_factory=list)  # reasons for failing, in words
    skipped: list[str] = field(default_factory=list)  # cases not run here, and why
    not_implemented: bool = False
    # Set when nothing could fail here but nothing could run either (CUDA C on a CPU):
    # what was checked instead. Such a result is neither passed nor failed.
    needs_gpu: str = ""
    # Each case's answer by case index, when check(..., keep_outputs=True) asked for them.
    outputs: dict[int, object] = field(default_factory=dict, repr=False)
    # The problem's kind of kernel ("triton", "cupy", "ranks"), None for plain Python: the
    # card then says nothing of an interpreter or a prediction.
    kernel: str | None = "triton"

    @property
    def passed(self) -> bool:
        return not self.causes and not self.needs_gpu

    @property
    def failed(self) -> bool:
        return bool(self.causes)

    @property
    def verdict(self) -> str:
        if self.not_implemented:
            return "NOT IMPLEMENTED"
        if self.needs_gpu and not self.causes:
            return "NEEDS A GPU"
        return "PASS" if self.passed else "FAIL"

    @property
    def seconds(self) -> float | None:
        """Measured median time of the largest case; None when nothing was measured."""
        return self.performance.seconds if self.performance else None

    @property
    def fraction(self) -> float | None:
        """Roofline fraction of the largest case; None when nothing was measured."""
        return self.performance.fraction if self.performance else None

    @property
    def bound(self) -> str | None:
        """"memory" or "compute", from the cost model and the ceilings."""
        return self.performance.floor.bound if self.performance else None

    @property
    def setting(self) -> str:
        """Where the check ran, as the card says it. A plain-Python exercise has no kernel
        for the interpreter to run, nor one to time or predict: only its answers count."""
        if self.kernel is None:
            where = "GPU" if self.mode.startswith("GPU") else "CPU"
            return f"{where}: plain Python, checked for correctness"
        return self.mode

    @property
    def worst_case(self) -> CaseResult | None:
        """The failing case that says most: the first whose failure names its cause (see
        ``_names_a_cause``) over one whose values are just off; the first failing case
        when none does. If all pass, the one with the largest error."""
        failing = [c for c in self.cases if not c.ok]
        if failing:
            return next((c for c in failing if _names_a_cause(c)), failing[0])
        compared = [c for c in self.cases if c.comparison is not None]
        return max(compared, key=lambda c: c.comparison.rel_error, default=None)

    @property
    def line(self) -> str:
        """One line for a terminal or a log."""
        if self.not_implemented or (self.failed and not self.cases):
            return f"{self.verdict} {self.problem_id}: {self.causes[0]}  [{self.setting}]"
        if self.verdict == "NEEDS A GPU":
            return f"{self.verdict} {self.problem_id}: {self.needs_gpu}  [{self.setting}]"
        ok = sum(c.ok for c in self.cases)
        head = f"{self.verdict} {self.problem_id}: {ok}/{len(self.cases)} cases correct"
        if not self.passed:
            return f"{head}; {self.causes[0]}  [{self.setting}]"
        perf = f"; {self.performance.line}" if self.performance else ""
        return f"{head}{perf}  [{self.setting}]"

    def message(self) -> str:
        """The full explanation, as an AssertionError carries it."""
        lines = [self.line]
        lines += [f"  - {cause}" for cause in self.causes[1:]]
        first_with: dict[str, str] = {}  # a failure said once, with its first case
        for case in self.cases:
            if not case.ok and case.summary in first_with:
                lines.append(f"  FAIL {case.label}: the same as on {first_with[case.summary]}")
                continue
            mark = "ok  " if case.ok else "FAIL"
            lines.append(f"  {mark} {case.label}: {case.summary}")
            lines += [f"         {detail}" for detail in case.details]
            if not case.ok:
                first_with[case.summary] = case.label
        lines += [f"  skip {reason}" for reason in self.skipped]
        if self.performance:
            lines.append(f"  {self.performance.bottleneck}")
        lines.append(f"  (inputs seed {self.seed}: check(..., seed={self.seed}) repeats them)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<CheckResult {self.line}>"

    def show(self) -> None:
        """Display the report: HTML in Jupyter, the one line elsewhere."""
        show(self)


def _names_a_cause(case: CaseResult) -> bool:
    """Whether a failing case says why, not only which values are off: its answer was
    never compared (an exception, a race, a write outside its tensors), it carries
    advice, or its problem's own comparison marked its words as a diagnosis (a ``str``
    whose ``diagnosed`` attribute is true: a slip reproduced, not just the figures). A
    right answer found to be computed the wrong way (its traffic, say) does not jump
    ahead of a wrong one."""
    if case.advice or (case.error and case.comparison is None):
        return True
    return case.comparison is not None and bool(getattr(case.comparison.cause, "diagnosed",
                                                         False))


# --- The card ---------------------------------------------------------------------------


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
        f' <span style="color: #57606a">— {esc(result.setting)}</span>',
    ]
    if result.verdict == "NEEDS A GPU":
        parts.append(f"<div>{esc(result.needs_gpu)}</div>")
    if result.causes:
        items = "".join(f"<li>{esc(c)}</li>" for c in result.causes)
        parts.append(f"<ul style='margin: 4px 0'>{items}</ul>")
    if result.cases or result.skipped:
        rows = "".join(
            f"<tr><td>{'✓' if c.ok else '✗'}</td><td>{esc(c.label)}</td>"
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
        from ..model.plot import roofline_figure
    except ImportError:
        return None
    from ..device import current
    from ..device.roofline import datasheet_for

    achieved = perf.cost.flops / perf.seconds if perf.cost.flops else 0.0
    point = (result.problem_id, perf.cost.intensity, achieved, perf.cost.dtype)
    return roofline_figure(perf.ceilings, dtypes=[perf.cost.dtype], points=[point],
                           beside=datasheet_for(current()))
