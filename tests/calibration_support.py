"""The calibration tests' method, shared by tests/test_calibration.py (the H200) and
tests/test_calibration_h100.py (the H100): trace a workload at a small size, extrapolate
its counts exactly to the measured size, check the two premises that make that exact, and
predict its time.

Exact extrapolation needs every count the model uses to be a monomial in the sizes, and
the L2 to give the same hits and misses at both sizes. Both are checked, not assumed:
each group of sizes is traced again doubled, and every count must grow by an exact power
of two (``power``); and each launch's misses must be the same with an L2 shrunk by the
factor its footprint grows by (``same_misses_with_a_smaller_l2``). A count that breaks
either premise raises ``NotExtrapolable``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from rooflab.autograder.device import roofline
from rooflab.autograder.model import traffic
from rooflab.autograder.model.time_model import dot_dtype

COUNTS = ("requested_load", "requested_store", "load_sectors", "store_sectors",
          "partial_store_sectors", "rounds", "flops")
TENSOR_COUNTS = ("requested", "sectors", "read_refs", "read_distinct", "read_misses",
                 "written")
SAME = ("kernel", "num_warps", "num_stages", "dot")


def read_record(path: Path) -> dict:
    """A calibration record (bench/calibration/<card>-<date>.json)."""
    return json.loads(path.read_text())


def record_target(path: Path):
    """The record's measured ceilings, and its card's datasheet geometry, which must agree
    with what the card reported."""
    ceilings, card = roofline.target(str(path))
    geometry = read_record(path)["geometry"]
    assert (card.sm_count, card.l2_bytes) == (geometry["sm_count"], geometry["l2_bytes"])
    return ceilings, card


class NotExtrapolable(AssertionError):
    """A count that does not grow by an exact power of two when its sizes double: it is
    no monomial of the sizes (data-dependent traffic, say), and extrapolating it would
    be a guess."""


def counts(report: traffic.TrafficReport) -> dict[str, float]:
    """Every count of a launch's report that extrapolation scales, by name."""
    found = {"programs": report.programs, **{c: getattr(report, c) for c in COUNTS}}
    for tensor in report.per_tensor.values():
        found |= {f"{tensor.name}.{c}": getattr(tensor, c) for c in TENSOR_COUNTS}
    return found


def power(base: float, grown: float, where: str) -> int:
    """The exponent e with grown == base · 2^e exactly: a count that is not a monomial of
    the doubled sizes would extrapolate wrongly."""
    if base == 0:
        if grown != 0:
            raise NotExtrapolable(f"{where}: 0 at the traced size, {grown} doubled")
        return 0
    e = round(math.log2(grown / base)) if grown > 0 else -1
    if not (e >= 0 and grown == base * 2**e):
        raise NotExtrapolable(f"{where}: {base} → {grown} is not base·2^e")
    return e


def extrapolate(base: traffic.TrafficReport, grown: list[traffic.TrafficReport],
                factors: list[float]) -> traffic.TrafficReport:
    """The report at the measured size: each count times Π factor^e, e its exact exponent
    in each group of sizes (``grown[i]``: group i doubled)."""
    found = counts(base)
    scaled = dict(found)
    for report, factor in zip(grown, factors, strict=True):
        assert all(getattr(report, a) == getattr(base, a) for a in SAME), report.kernel
        doubled = counts(report)
        for name, value in found.items():
            scaled[name] *= factor ** power(value, doubled[name], f"{base.kernel} {name}")
    tensors = {name: dataclasses.replace(
        t, **{c: scaled[f"{name}.{c}"] for c in TENSOR_COUNTS})
        for name, t in base.per_tensor.items()}
    return dataclasses.replace(base, grid=(round(scaled["programs"]), 1, 1),
                               per_tensor=tensors, **{c: scaled[c] for c in COUNTS})


def same_misses_with_a_smaller_l2(launch, report, full, card) -> None:
    """The L2 premise: the traced launch misses the same with an L2 shrunk by the factor
    its footprint grows by, so the real L2 against the measured footprint does too."""
    traced = sum(t.read_distinct for t in report.per_tensor.values())
    if not traced:
        return
    grow = sum(t.read_distinct for t in full.per_tensor.values()) / traced
    shrunk = traffic.analyze(launch, card, l2_bytes=int(card.l2_bytes / grow))
    if [t.read_misses for t in shrunk.per_tensor.values()] != \
            [t.read_misses for t in report.per_tensor.values()]:
        raise NotExtrapolable(f"{launch.kernel}: other L2 misses with an L2 shrunk "
                              f"{grow:g}x")


def predicted_at_measured_size(trace: Callable[[dict], list], base: dict[str, int],
                               grows: tuple[tuple[str, ...], ...], full_sizes: dict,
                               ceilings, card, case: str
                               ) -> tuple[traffic.Prediction, dict]:
    """The prediction at ``full_sizes``, from ``trace(sizes)`` (the launches of the
    workload at those sizes) at ``base`` and at each group of sizes doubled; with the
    trace and extrapolation's wall time."""
    start = time.perf_counter()
    launches = trace(base)
    reports = [traffic.analyze(launch, card) for launch in launches]
    grown, factors = [], []
    for group in grows:
        sizes = {**base, **{d: 2 * base[d] for d in group}}
        doubled = [traffic.analyze(launch, card) for launch in trace(sizes)]
        if [r.kernel for r in doubled] != [r.kernel for r in reports]:
            raise NotExtrapolable(f"{case}: other launches when {group} double")
        grown.append(doubled)
        ratio = {full_sizes[d] / base[d] for d in group}
        assert len(ratio) == 1, f"{group} must grow by one factor"
        factors.append(ratio.pop())
    full = [extrapolate(r, [g[i] for g in grown], factors) for i, r in enumerate(reports)]
    for launch, report, at_size in zip(launches, reports, full, strict=True):
        same_misses_with_a_smaller_l2(launch, report, at_size, card)
    flops = sum(r.flops for r in full)
    dtype = next((dot_dtype(r.dot) for r in full if r.dot), "fp32")
    prediction = traffic.prediction(full, flops, 0, dtype, ceilings, card, case)
    return prediction, {"seconds": time.perf_counter() - start}
