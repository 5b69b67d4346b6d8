"""What a check run in the candidate's process reports, as the grader's process words it.

``rooflab check`` (a child process) and ``rooflab grade`` (a notebook's kernel) run the
candidate's code in a process it can rewrite: its report is the candidate's word. The
grader's process checks every answer again itself, so the verdict is its own; the line
that states it is written here, from fields it checked (the problem, the verdict, how
many cases it judged) and from figures it formats itself (numbers, never text). What
only the candidate's process could see (which ops ran, the traced traffic, the measured
time) is shown below that line, indented and labelled as that process's report, so no
text the candidate's code writes can stand as the verdict.
"""

from __future__ import annotations

import math
import re

VERDICTS = ("PASS", "FAIL", "NOT IMPLEMENTED", "NEEDS A GPU")
REPORT_HEAD = "The check's report, from the candidate's process (its word, not checked here):"
REPORT_LINES = 200  # the most lines of a report shown; a longer one is cut, and says so


def verdict_of(report: dict) -> str:
    """The report's verdict if it is one of the four, else FAIL."""
    verdict = report.get("verdict")
    return verdict if verdict in VERDICTS else "FAIL"


def pass_line(problem_id: str, cases: int, figures: object, setting: str) -> str:
    """The verdict line of an answer the grader's process checked again and found right."""
    counted = f"all {cases} cases" if cases > 1 else "its case" if cases == 1 else "every case"
    perf = figures_words(figures)
    return (f"PASS {problem_id}: {counted} right, checked again outside the candidate's "
            f"process{f'; {perf}' if perf else ''}  [{setting}]")


def figures_words(figures: object) -> str:
    """The performance figures a check reported, as words of the grader's own: only
    finite numbers are read, and a prediction is labelled as one."""
    if not isinstance(figures, dict):
        return ""

    def number(key: str) -> float | None:
        value = figures.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) and value >= 0 else None

    seconds, fraction = number("seconds"), number("roofline_fraction")
    if figures.get("measured") is True and seconds is not None and fraction is not None:
        words = f"measured {seconds * 1e6:.1f} µs median, {fraction:.0%} of roofline"
        ratio = number("vs_baseline")
        return words + (f", {ratio:.2f}× the library's speed" if ratio is not None else "")
    predicted = number("predicted_roofline_fraction")
    if predicted is None:
        return ""
    target = figures.get("predicted_for")
    named = isinstance(target, str) and re.fullmatch(r"[\w .,()-]{1,60}", target)
    words = f"predicted{f' for {target}' if named else ''}: "
    traffic = number("predicted_traffic_fraction")
    if traffic is not None:
        words += f"{traffic:.0%} of roofline in its traffic, "
    return words + f"{predicted:.0%} in all, nothing measured"


def quoted(message: object) -> str:
    """The candidate process's own report, indented under its label (so none of its lines
    reads as a verdict line), cut at ``REPORT_LINES``; "" if it said nothing."""
    if not isinstance(message, str) or not message.strip():
        return ""
    lines = message.splitlines()
    shown = [f"    {line}" for line in lines[:REPORT_LINES]]
    if len(lines) > REPORT_LINES:
        shown.append(f"    ... ({len(lines) - REPORT_LINES} more lines cut)")
    return "\n".join([REPORT_HEAD, *shown])


def fail_text(problem_id: str, verdict: str, message: object) -> str:
    """A check that did not pass, as the grader states it: the verdict line's verdict and
    problem are the grader's, its cause the first line of the report's (a candidate can
    only hurt itself by writing a wrong one), and the report's next lines follow, up to
    ``REPORT_LINES``."""
    lines = message.strip().splitlines() if isinstance(message, str) else []
    first = lines[0] if lines else "the check gave no reason"
    prefix = f"{verdict} {problem_id}: "
    cause = first[len(prefix):] if first.startswith(prefix) else first
    return "\n".join([f"{prefix}{cause[:500]}", *lines[1:REPORT_LINES]])
