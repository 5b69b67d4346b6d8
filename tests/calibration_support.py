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

A workload on random data (labels drawn at random, say) has counts that are exact only
up to sampling noise (which sectors a random label touches changes from draw to draw),
and some that are a monomial plus a constant (n / 64 blocks, plus a run more at each of
the k cluster boundaries). For such a workload a noise is declared, and its sizes are
traced doubled and doubled again: every count must be a·s^e + b, its increment growing
by 2^e from one doubling to the next within that noise, and is extrapolated by that fit.
A count of another shape (one that grows with the waves of programs, say) is refused.
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
          "partial_store_sectors", "atomic_transactions", "atomic_chain", "compare_lanes",
          "rounds", "flops")
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


def affine_within(counts: tuple[float, float, float], factor: float, noise: float,
                  where: str) -> float:
    """A count traced at a size s, 2s and 4s, at ``factor`` · s: the count must be
    a·s^e + b, its two increments growing by 2^e within ``noise`` (relative), and the
    value is that fit's. (A constant part b: what does not grow with the sizes, such as
    the runs that the k cluster boundaries add to n / 64 blocks.)"""
    c1, c2, c4 = counts
    rise, again = c2 - c1, c4 - c2
    if rise == 0 and again == 0:
        return c4
    e = round(math.log2(again / rise)) if again > 0 and rise > 0 else -1
    if e < 0 or abs(again / (rise * 2**e) - 1) > noise:
        raise NotExtrapolable(f"{where}: {c1} → {c2} → {c4} does not grow as a·s^e + b "
                              f"within {noise:.0%}")
    if e == 0:
        raise NotExtrapolable(f"{where}: {c1} → {c2} → {c4} grows as log(s), not a·s^e + b")
    return c4 + again / (4**e - 2**e) * (factor**e - 4**e)


def extrapolate(base: traffic.TrafficReport, grown: list[list[traffic.TrafficReport]],
                factors: list[float], noise: float = 0.0) -> traffic.TrafficReport:
    """The report at the measured size: each count times Π factor^e, e its exact exponent
    in each group of sizes (``grown[i]``: group i doubled). With a ``noise`` (one group,
    traced doubled and doubled again), each count is ``affine_within``'s fit."""
    found = counts(base)
    scaled = dict(found)
    for reports, factor in zip(grown, factors, strict=True):
        assert all(getattr(r, a) == getattr(base, a) for r in reports for a in SAME), \
            base.kernel
        doubled = counts(reports[0])
        if noise:
            # One group: a·s^e + b is no product of one fit per group (b would multiply).
            assert len(grown) == 1, "a fit within noise grows one group of sizes"
            quadrupled = counts(reports[1])
            for name, value in found.items():
                scaled[name] = affine_within((value, doubled[name], quadrupled[name]),
                                             factor, noise, f"{base.kernel} {name}")
            continue
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
                               ceilings, card, case: str, noise: float = 0.0
                               ) -> tuple[traffic.Prediction, dict]:
    """The prediction at ``full_sizes``, from ``trace(sizes)`` (the launches of the
    workload at those sizes) at ``base`` and at each group of sizes doubled (and with a
    ``noise``, doubled again); with the trace and extrapolation's wall time."""
    start = time.perf_counter()
    launches = trace(base)
    reports = [traffic.analyze(launch, card) for launch in launches]
    grown, factors = [], []
    for group in grows:
        traced = []
        for times in (2, 4) if noise else (2,):
            sizes = {**base, **{d: times * base[d] for d in group}}
            traced.append([traffic.analyze(launch, card) for launch in trace(sizes)])
            if [r.kernel for r in traced[-1]] != [r.kernel for r in reports]:
                raise NotExtrapolable(f"{case}: other launches when {group} grow {times}x")
        grown.append(traced)
        ratio = {full_sizes[d] / base[d] for d in group}
        assert len(ratio) == 1, f"{group} must grow by one factor"
        factors.append(ratio.pop())
    full = [extrapolate(r, [[t[i] for t in g] for g in grown], factors, noise)
            for i, r in enumerate(reports)]
    for launch, report, at_size in zip(launches, reports, full, strict=True):
        same_misses_with_a_smaller_l2(launch, report, at_size, card)
    flops = sum(r.flops for r in full)
    dtype = next((dot_dtype(r.dot) for r in full if r.dot), "fp32")
    prediction = traffic.prediction(full, flops, 0, dtype, ceilings, card, case)
    return prediction, {"seconds": time.perf_counter() - start}
