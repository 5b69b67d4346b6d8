"""The time model against a second card: the kernels of labs 05-07 (top-k, k-means, mixed
precision) measured on an NVIDIA H100 (bench/calibration/h100-2026-11-27.json), by the
method of tests/test_calibration.py (tests/calibration_support.py): each workload traced
small in the interpreter, its counts extrapolated exactly to the measured size once both
premises are checked (every count a monomial of the sizes; the same L2 misses with an L2
shrunk by the footprint's growth), then predicted within 1.5x of the measured median, and
every ladder of the labs in the measured order with gaps within 1.5x.

Each workload is traced with the launch configuration the GPU ran, not the interpreter's:
kernels/amp.py and kernels/topk.py pick larger blocks in the interpreter (its per-block
cost is flat), and topk_radix splits rows for the interpreter's toy 8 SMs. The trace here
patches ``interpreter_enabled`` to False in those modules, which picks the GPU's blocks
(the kernels' own ``INTERPRETED`` paths, fixed at import, stay), and passes topk_radix the
split and buffer the H100's 132 SMs gave.

Workloads on random labels are extrapolated within a noise of 5% (see
tests/calibration_support.py): each count a·n^e + b, checked at n, 2n and 4n.

What the method supports, and what it does not (each with the cause found, the measured
time and what the model gives, as an xfail that must fail):

* fused_adamw and fp8_quantize stream their tensors: exact, and predicted within 1.5x;
* update_atomic, with uniform labels and with half the points in cluster 0, set the time
  model's two constants for atomics (ATOMIC_COST, ATOMIC_CHAIN_S) and are held to them.
  No other point here checks those constants on its own: fp8_quantize's chain (0.31 ms)
  stays under its DRAM time, and the sorted update is missed for another reason;
* update_sorted with half the points in cluster 0 extrapolates, and the model misses it
  by 2x, presumably in the instructions it does not count (count_and_rank's all-pairs
  comparison of labels, segment_sum's prefix sums). So the ladder of the contended update
  keeps its order, with too wide a gap;
* topk_rows extrapolates exactly (no data-dependent branch); its time is its sorting
  networks', and at 4096 x 32768, k = 64 it sets the model's COMPARE_LANE_S; at
  256 x 262144, k = 256 (other networks, 16x fewer programs) it is held to it;
* the other k-means updates and steps are not extrapolable from sizes the interpreter can
  trace: at n of a few thousand a cluster holds fewer points than a block, and counts
  such as the runs of the sorted update are in another regime than at the measured size,
  or saturate; the naive steps' distances_kernel reads per wave of 132 programs. The
  fused steps would be missed anyway: their assign takes about 2.5x its tf32x3 dots;
* topk_radix's counts depend on the values (how many candidates the filter keeps), and its
  histograms are instructions the model does not count.

One count the premise check cannot see grow: read_refs (distinct sectors per wave, summed
over waves) of fused_adamw's one-element found and scale tensors is 1 at both traced
sizes (one wave each) and extrapolates to 1, where the measured size runs 7944 waves. The
time model does not use read_refs; every count it uses extrapolates exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import calibration_support as calibration
import pytest
import torch

from rooflab.autograder.model.trace import tracing
from rooflab.kernels import amp, kmeans, topk

pytestmark = pytest.mark.cpu("traces the interpreter")

RECORD = Path(__file__).parent.parent / "bench" / "calibration" / "h100-2026-11-27.json"
WITHIN = 1.5  # predicted / measured, and a ladder's gap predicted / measured
SMS = 132  # the H100's, for topk_radix's split and buffer as the GPU chose them


class OutsideTolerance(AssertionError):
    """A prediction, or a ladder's gap, more than 1.5x off the measured one."""


@dataclass(frozen=True)
class Traced:
    """How a workload is traced: the call for given sizes, the sizes traced, the groups
    of sizes that grow together to the measured ones, and why it is expected to fail
    (None: it is held to the 1.5x rule)."""

    call: Callable[[dict], Callable[[], object]]
    base: dict[str, int]
    grows: tuple[tuple[str, ...], ...]
    xfail: tuple[type[AssertionError], str] | None = None
    noise: float = 0.0  # random data: each count a monomial within this (see the module)


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _on_the_gpu_config(*modules):
    """Patch ``interpreter_enabled`` to False in ``modules`` while a call runs: the blocks
    the GPU ran."""
    def wrap(run: Callable[[], object]) -> Callable[[], object]:
        def patched():
            with ExitStack() as stack:
                for module in modules:
                    stack.enter_context(mock.patch.object(module, "interpreter_enabled",
                                                          lambda: False))
                return run()
        return patched
    return wrap


# --- the workloads, as autograder/bench/{amp,kmeans,topk}.py call them -------------------


def _adamw(s: dict):
    """fp32 weights, an fp16 gradient of a loss scaled by 2**16, both moments, the bf16
    copy (bench/amp.py's adamw_inputs), step 10, lr 1e-5."""
    n, g = s["n"], _generator()
    param = torch.randn(n, generator=g)
    grad = (torch.randn(n, generator=g) * 1e-3 * 2**16).half()
    exp_avg = torch.randn(n, generator=g) * 1e-4
    exp_avg_sq = torch.rand(n, generator=g) * 1e-6
    bf16, scale = param.to(torch.bfloat16), torch.tensor([2.0**16])
    return _on_the_gpu_config(amp)(lambda: amp.fused_adamw(
        param, grad, exp_avg, exp_avg_sq, bf16, scale, 10, lr=1e-5))


def _fp8(s: dict):
    """bf16 activations and the scale of an earlier amax of 3 (bench/amp.py)."""
    x = torch.randn(s["n"], generator=_generator()).to(torch.bfloat16)
    scale = torch.tensor([448.0 / 3.0])
    return _on_the_gpu_config(amp)(lambda: amp.fp8_quantize(x, scale))


def _labels(n: int, k: int, skewed: bool, g: torch.Generator) -> torch.Tensor:
    labels = torch.randint(k, (n,), generator=g)
    if skewed:  # half of all points in cluster 0, as bench/kmeans.py's _update_inputs
        labels = torch.where(torch.rand(n, generator=g) < 0.5, 0, labels)
    return labels


def _update(fn, skewed: bool):
    def call(s: dict):
        g = _generator()
        x = torch.randn(s["n"], s["d"], generator=g)
        labels = _labels(s["n"], s["k"], skewed, g)
        return lambda: fn(x, labels, s["k"])
    return call


def _step(assign, update):
    """One Lloyd step. bench/kmeans.py starts from k of the points; here the k centroids
    are drawn apart, from the same distribution, and the same at every traced size: the
    labels then come from one distribution as n grows (new centroids at each size change
    how the points divide among them), and no point is its own centroid, as almost none
    is among the 2^20 measured."""
    def call(s: dict):
        c = torch.randn(s["k"], s["d"], generator=torch.Generator().manual_seed(1))
        x = torch.randn(s["n"], s["d"], generator=_generator())
        return lambda: update(x, assign(x, c), s["k"])
    return call


def _rows(s: dict):
    """topk_rows with the GPU's block of 1024 (the interpreter's default is 16384)."""
    x = torch.randn(s["m"], s["n"], generator=_generator())
    return lambda: topk.topk_rows(x, s["k"], block=1024)


def _radix(full: dict):
    """topk_radix as the H100 ran it: blocks of 2048, each row split for 4 programs per SM
    over 132 SMs, and the buffer those gave (at the measured sizes)."""
    m, n, k = full["m"], full["n"], full["k"]
    split = max(1, min(-(-4 * SMS // m), -(-n // 2048)))
    k_pad = max(2, 1 << (k - 1).bit_length())
    cap = max(8 * k_pad, (1 << (n - 1).bit_length()) // 32 if m >= SMS else 0)

    def call(s: dict):
        x = torch.randn(s["m"], s["n"], generator=_generator())
        return _on_the_gpu_config(topk)(lambda: topk.topk_radix(x, s["k"], split=split,
                                                                cap=cap))
    return call


RANDOM = 0.05  # the noise a workload on random labels or values is extrapolated within


def _refused(what: str, why: str = ""):
    return (calibration.NotExtrapolable,
            f"not extrapolable: {what}, so the fit within {RANDOM:.0%} is refused{why}")


SORTED = ("the model misses it: 644.0 µs predicted against 1259.9 µs measured. It counts "
          "the kernels' bytes (422 µs of DRAM, 190 µs of L2) and their atomics (a chain of "
          "160 µs on the sector of sums[0]), not their instructions, which presumably make "
          "the rest: count_and_rank compares every pair of labels in a block (4096 lanes "
          "for 64 points), segment_sum takes a prefix sum down each block of 64 x 64")
REGIME = ("segment_sum_kernel's atomics per sector (its chain): at the traced sizes a "
          "cluster's 16 points lie in one block of 64, and the chain stays at 24-32 lanes "
          "(24 → 24 → 32 at n = 4096, 8192, 16384); at the measured size a cluster's 16384 "
          "points span 256 blocks. Tracing that regime needs n >= 2^16 in the interpreter")
BOUNDARIES = ("segment_sum_kernel's atomics: a run ends at each of the n / 64 blocks and at "
              "each cluster boundary inside one. At n = 1024-4096 the k = {k} boundaries "
              "dominate ({counts}); at the measured size the blocks do: another regime")
SATURATES = ("count_and_rank_kernel's writes to counts fill its 128 sectors (written 121 → "
             "126 → 127 at n = 1024, 2048, 4096): a count that saturates is no a·s^e + b, "
             "and at the measured size every sector is written")
ASSIGN_WIDE = ("; were it extrapolable, the model would still miss the step by about 2x: the "
               "card measured it at 4386.7 µs and the update alone, on uniform labels, at "
               "1652.9 µs, so assign took about 2700 µs, where its tf32x3 dots are 1110 µs at "
               "three TF32 passes. The rest is presumably assign's work on the CUDA cores "
               "(each tile's argmin with its index, the centroid norms, tf32x3's splitting of "
               "both operands), which the model does not count")
ASSIGN_SMALL = ("; its tf32x3 dots alone are 2246.7 µs at three TF32 passes, of the 4693.7 "
                "µs measured for the step")
WAVES = ("distances_kernel's reads of x and c per wave (its 2-D grid of 64 x 64 tiles "
         "falls into waves of 132 SMs differently as n grows)")
WAVES_C = (calibration.NotExtrapolable,
           "not extrapolable: distances_kernel's reads of c per wave (its 16 x 16 programs "
           "at n = 1024 fall into waves of 132 SMs otherwise at n = 2048: read_refs 17408 → "
           "19456), so the counts do not double exactly. Traced at two sizes, exactly, not "
           "fitted within noise: a third trace, at n = 4096 with k = 1024, would cost half a "
           "minute of every test run to refuse it all the same")
RADIX = (calibration.NotExtrapolable,
         "not extrapolable: how many candidates topk_radix's filter copies into each row's "
         "buffer (its atomics and stores) and the finish sorts depend on the values, so "
         "those counts do not double exactly with the sizes (nor grow as a·n + b: at "
         "n = 12288, 24576, 49152 the filter's stores at 256 x 262144 go 2416 → 4784 → "
         "37552). The model would likely miss it too: it counts the finish's sorting "
         "network, not tl.histogram's instructions, which lab 05 names as radix select's "
         "limit on the H100")

STEP_SMALL = {"n": 1024, "d": 128, "k": 1024}
STEP_WIDE = {"n": 1024, "d": 64, "k": 256}
UPDATE = {"n": 4096, "d": 64, "k": 256}
TRACED: dict[str, Traced] = {
    "fused_adamw 2^30 fp16 grads": Traced(_adamw, {"n": 1 << 16}, (("n",),)),
    "fp8_quantize 2^30 bf16": Traced(_fp8, {"n": 1 << 16}, (("n",),)),
    # Sets ATOMIC_COST (autograder/model/time_model.py).
    "update_atomic 2^22 d=64 k=256 uniform": Traced(
        _update(kmeans.update_atomic, False), UPDATE, (("n",),), noise=RANDOM),
    "update_sorted 2^22 d=64 k=256 uniform": Traced(
        _update(kmeans.update_sorted, False), UPDATE, (("n",),), _refused(REGIME),
        noise=RANDOM),
    # Sets ATOMIC_CHAIN_S.
    "update_atomic 2^22 d=64 k=256 half in cluster 0": Traced(
        _update(kmeans.update_atomic, True), UPDATE, (("n",),), noise=RANDOM),
    "update_sorted 2^22 d=64 k=256 half in cluster 0": Traced(
        _update(kmeans.update_sorted, True), UPDATE, (("n",),), (OutsideTolerance, SORTED),
        noise=RANDOM),
    "step assign + update_sorted 2^20 d=128 k=1024": Traced(
        _step(kmeans.assign, kmeans.update_sorted), STEP_SMALL, (("n",),),
        _refused(SATURATES, ASSIGN_SMALL), noise=RANDOM),
    "step assign_naive + update_atomic 2^20 d=128 k=1024": Traced(
        _step(kmeans.assign_naive, kmeans.update_atomic), STEP_SMALL, (("n",),), WAVES_C),
    "step assign + update_sorted 2^22 d=64 k=256": Traced(
        _step(kmeans.assign, kmeans.update_sorted), STEP_WIDE, (("n",),),
        _refused(BOUNDARIES.format(k=256, counts="requested_store 95232 → 112128 → 129024"),
                 ASSIGN_WIDE), noise=RANDOM),
    "step assign_naive + update_atomic 2^22 d=64 k=256": Traced(
        _step(kmeans.assign_naive, kmeans.update_atomic), STEP_WIDE, (("n",),),
        _refused(WAVES), noise=RANDOM),
    # Sets COMPARE_LANE_S.
    "topk_rows 4096x32768 k=64": Traced(_rows, {"m": 1, "n": 2048, "k": 64}, (("m",), ("n",))),
    "topk_radix 4096x32768 k=64": Traced(
        _radix({"m": 4096, "n": 32768, "k": 64}), {"m": 1, "n": 4096, "k": 64},
        (("m",), ("n",)), RADIX),
    "topk_rows 256x262144 k=256": Traced(
        _rows, {"m": 1, "n": 2048, "k": 256}, (("m",), ("n",))),
    "topk_radix 256x262144 k=256": Traced(
        _radix({"m": 256, "n": 262144, "k": 256}), {"m": 1, "n": 12288, "k": 256},
        (("m",), ("n",)), RADIX),
}


def record() -> dict:
    return calibration.read_record(RECORD)


def target():
    """The H100's measured ceilings and datasheet geometry."""
    return calibration.record_target(RECORD)


def trace(workload: str, sizes: dict) -> list:
    call = TRACED[workload].call(sizes)
    with tracing(keep_lanes=False) as tracer:
        call()
    return tracer.launches


def predicted_at_measured_size(point: dict):
    ceilings, card = target()
    plan = TRACED[point["workload"]]
    return calibration.predicted_at_measured_size(
        lambda sizes: trace(point["workload"], sizes), plan.base, plan.grows,
        point["sizes"], ceilings, card, point["workload"], plan.noise)


@pytest.fixture(scope="module")
def predictions() -> Callable[[str], float]:
    """Predicted µs at the measured size of a workload, traced once; a workload the
    method cannot extrapolate raises NotExtrapolable each time it is asked for."""
    done: dict[str, float | AssertionError] = {}
    points = {p["workload"]: p for p in record()["points"]}

    def predicted(workload: str) -> float:
        if workload not in done:
            try:
                done[workload] = predicted_at_measured_size(points[workload])[0].seconds * 1e6
            except calibration.NotExtrapolable as failed:
                done[workload] = failed
        if isinstance(done[workload], AssertionError):
            raise done[workload]
        return done[workload]
    return predicted


def _marks(workload: str):
    plan = TRACED[workload]
    if plan.xfail is None:
        return ()
    raises, reason = plan.xfail
    return pytest.mark.xfail(strict=True, raises=raises, reason=reason)


def test_the_record_says_where_it_came_from():
    data = record()
    assert data["card"] == "NVIDIA H100 80GB HBM3" and data["date"] and data["source"]
    assert {"torch", "triton"} <= set(data["versions"])
    assert {p["workload"] for p in data["points"]} == set(TRACED)
    ceilings, card = target()
    assert card.name == "H100 SXM"
    assert ceilings.source == "measured" and ceilings.bandwidth == pytest.approx(3.0206e12)


@pytest.mark.parametrize("workload", [pytest.param(w, marks=_marks(w), id=w) for w in TRACED])
def test_each_workload_is_predicted_within_1_5x(predictions, workload):
    measured = next(p["measured_us"] for p in record()["points"] if p["workload"] == workload)
    ratio = predictions(workload) / measured
    if not 1 / WITHIN <= ratio <= WITHIN:
        raise OutsideTolerance(
            f"{workload}: predicted {predictions(workload):.1f} µs, measured {measured} µs")


# A ladder whose points both extrapolate is held to the rule; where the model misses one of
# them, the gap is off too, and the test says why. The others fail on a point's premise
# (its own test says which), and would fail on the model too where it says so.
LADDER_MISSES = {
    ("update_atomic 2^22 d=64 k=256 half in cluster 0",
     "update_sorted 2^22 d=64 k=256 half in cluster 0"): "10265 / 644 µs predicted, 15.9x, "
    "where the card measured 8.0x: the contended update fits its measured time (it sets "
    "ATOMIC_CHAIN_S), the sorted update is missed without its instructions (see its own "
    "test)",
}
LADDER_GAPS = {
    ("step assign_naive + update_atomic 2^20 d=128 k=1024",
     "step assign + update_sorted 2^20 d=128 k=1024"): "the card measured 1.55x",
    ("step assign_naive + update_atomic 2^22 d=64 k=256",
     "step assign + update_sorted 2^22 d=64 k=256"): "the card measured 1.61x; the fused "
    "step's assign, which the model underestimates 2.5x, would make the gap too wide",
    ("topk_rows 4096x32768 k=64", "topk_radix 4096x32768 k=64"): "the card measured 2.2x; "
    "topk_rows fits its measured time (it sets COMPARE_LANE_S)",
    ("topk_rows 256x262144 k=256", "topk_radix 256x262144 k=256"): "the card measured "
    "4.7x; topk_rows is predicted at 0.89x of its measured time",
}


def _ladder_steps() -> list:
    steps = []
    for ladder in record()["ladders"]:
        names = ladder["slower_to_faster"]
        for slower, faster in zip(names, names[1:], strict=False):
            failing = [w for w in (slower, faster)
                       if TRACED[w].xfail and TRACED[w].xfail[0] is calibration.NotExtrapolable]
            marks = ()
            if (slower, faster) in LADDER_MISSES:
                marks = pytest.mark.xfail(strict=True, raises=OutsideTolerance,
                                          reason=LADDER_MISSES[slower, faster])
            elif failing:
                reason = (f"{failing[0]} is not extrapolable (see its own test); "
                          f"{LADDER_GAPS[slower, faster]}")
                marks = pytest.mark.xfail(strict=True, raises=calibration.NotExtrapolable,
                                          reason=reason)
            steps.append(pytest.param(slower, faster, marks=marks, id=f"{slower} > {faster}"))
    return steps


@pytest.mark.parametrize(("slower", "faster"), _ladder_steps())
def test_ladders_keep_the_measured_order_and_gap(predictions, slower, faster):
    measured = {p["workload"]: p["measured_us"] for p in record()["points"]}
    gap = predictions(slower) / predictions(faster)
    measured_gap = measured[slower] / measured[faster]
    if not (gap > 1 and 1 / WITHIN <= gap / measured_gap <= WITHIN):
        raise OutsideTolerance(f"{slower} > {faster}: gap predicted {gap:.2f}×, measured "
                               f"{measured_gap:.2f}×")
