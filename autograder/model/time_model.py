"""How long a traced launch would take on a card: the time model behind every prediction.

The traffic model (``traffic.py``) counts what a launch asks of the memory system: DRAM
bytes through an L2 of the card's size, sectors moved between L2 and the multiprocessors,
stores that fill only part of a sector, the dependent steps each program takes, and the
FLOPs of its ``tl.dot`` calls. This module turns those counts into seconds::

    launch  = LAUNCH_S + max(memory, compute, latency, chain, network)
    memory  = DRAM bytes / bandwidth                          misses and write-backs
            + L2-hit sectors x 32 B / (L2_OVER_DRAM x bandwidth)
            + partly written sectors x PARTIAL_STORE_COST x (the same time per sector)
            + atomic transactions x ATOMIC_COST x (the same time per sector)
    compute = ceil(programs / SMs) x one program's tl.dot FLOPs x passes / (peak / SMs)
    latency = ceil(programs / resident programs) x one program's dependent steps
              x ROUND_TRIP_S                                  loops without tl.dot only
    chain   = the most atomic lanes on one sector x ATOMIC_CHAIN_S
    network = ceil(programs / SMs) x one program's compare-and-swap lanes
              x COMPARE_LANE_S                                sorting networks

A kernel's time is the sum over its launches. Memory, compute, latency, atomic chains and
sorting networks overlap (a launch takes the longest of them), but the parts of memory
add up: a sector comes either from DRAM or from L2, and the two streams do not hide each
other. On the H200 the online softmax, whose second read of each row hits L2, took 1.3x
as long as the fused kernel that reads each row once; with the larger of the two taken,
that read would be free.

The constants were calibrated on an NVIDIA H200 against eleven measured workloads (the
record is ``bench/calibration/h200-2026-11-26.json``; ``tests/test_calibration.py`` holds
the model to it), the three for atomics and sorting networks on an H100
(``bench/calibration/h100-2026-11-27.json``, ``tests/test_calibration_h100.py``). Each
one's comment says what it stands for and where its value comes from. What the model
leaves out: L1 and shared memory as caches, the layouts the compiler picks, register
pressure and instruction issue, except for the compare-and-swaps of sorting networks (so
histograms, scans and the CUDA-core work around a tl.dot are not counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..device.datasheet import Card
from .matrix_units import rules_for

# Bytes move between L2 and the SMs in 32-byte sectors; that path is faster than DRAM but
# not free. Published microbenchmarks put Hopper's and Ampere's L2 bandwidth at roughly
# 2-3x DRAM bandwidth: we take 2.5x (10.6 TB/s on the H200, whose 64x64-tile matmul moved
# its tile loads at 10.1-11 TB/s).
L2_OVER_DRAM = 2.5

# Every launch costs a fixed time on top of its traffic: the launch itself, the first wave
# ramping up and the last one draining. On the H200 the streaming kernels ran this much
# longer than their DRAM bytes at the measured copy bandwidth: vector_add 5.5 µs,
# softmax_naive 5.8 per launch (three launches), softmax_fused 6.1, transpose 7.0,
# strided_copy 7.6. It dominates any kernel of a few MB.
LAUNCH_S = 6e-6

# A store that writes only part of a sector (a warp writing one element per row, as a
# transpose that walks columns does) is a separate L2 write of a few bytes, which L2 merges
# into the sector: it costs this many full sectors' worth of L2 time. Calibrated on the
# H200's transpose_rows: 16.8 M one-lane stores took 277 µs beyond the kernel's DRAM time,
# 16.5 ns each, 5.5x the 3.0 ns of a full sector at 2.5x the copy bandwidth.
PARTIAL_STORE_COST = 5.5

# A loop without tl.dot is not software-pipelined by Triton: each iteration's loads wait
# for the last one's arithmetic, so a program takes one round trip per step, and only the
# programs resident at once overlap. The effective round trip, calibrated on the H200's
# matmul_rows (1024 steps per program, 8 residency waves, 740 µs): 90 ns, ~180 cycles.
# For scale, microbenchmarks of Hopper put an L2 hit at a few hundred cycles and an L1 hit
# at a few tens; in that kernel many loads hit L1, which the model leaves out.
ROUND_TRIP_S = 90e-9

# An atomic is a read-modify-write that L2's atomic units apply, far slower than moving a
# sector. Calibrated on the H100's k-means update_atomic with uniform labels: 2^22 points
# x 64 features, 2^25 transactions of sums[label] plus 2.7 M of counts[label], took
# 1220 µs beyond the kernel's DRAM time: 34 ps each, 8 sectors' worth of L2 time.
ATOMIC_COST = 8.0

# Atomics on one sector cannot overlap: L2 applies them one lane after another. Calibrated
# on the same update with half the points in cluster 0: 16.8 M lanes (2.1 M transactions
# of 8) on each sector of sums[0] took 10.1 ms, 0.60 ns a lane, about one per clock. A
# CUDA C kernel of atomics took the same 10.1 ms in that run (torch's index_add 10.8 ms):
# the card's floor, not the kernel's. Counted per lane, not per transaction: at 4.8 ns
# per transaction (10.1 ms over 2.1 M), fp8_quantize's 524 288 one-lane atomic_max on one
# address would take 2.5 ms, where the whole kernel took 1.33 ms.
ATOMIC_CHAIN_S = 0.60e-9

# A sorting network is instruction work, not memory traffic: each layer compares and swaps
# every element with a partner, most of them in another thread, so the data moves through
# shuffles and shared memory as well. The trace counts the lanes each layer compares: of
# tl.minimum and tl.maximum of the two halves of one tl.split, as a network written with
# them compares (the course's top-k in the interpreter; on a GPU it calls tl.topk, the
# same network), and of each layer of tl.sort and tl.topk.
# Calibrated on the H100's topk_rows at 4096 x 32768, k = 64: 32.1 M such lanes per SM (32
# programs of 1.0 M) took 4156 µs, 129 ps a lane per SM, about 4.4 lanes per clock against
# 128 fp32 lanes: a compare-and-swap of 64-bit (key, position) words and its exchange cost
# some thirty instructions.
COMPARE_LANE_S = 129e-12


@dataclass(frozen=True)
class LaunchTime:
    """The predicted time of one launch, term by term, in seconds."""

    kernel: str
    launch: float  # fixed cost of the launch
    dram: float  # DRAM bytes at the bandwidth
    l2: float  # L2 hits and partly written sectors, at the L2 rate
    compute: float  # tl.dot FLOPs, in waves of programs over the SMs
    latency: float  # dependent steps of loops without tl.dot
    chain: float = 0.0  # the longest run of atomics on one sector, one after another
    network: float = 0.0  # compare-and-swaps of sorting networks, in waves over the SMs

    @property
    def memory(self) -> float:
        return self.dram + self.l2

    @property
    def body(self) -> float:
        """The launch once running: memory, compute, latency, atomic chains and sorting
        networks overlap."""
        return max(self.memory, self.compute, self.latency, self.chain, self.network)

    @property
    def seconds(self) -> float:
        return self.launch + self.body

    @property
    def bound(self) -> str:
        """What sets the running time: "memory" (DRAM), "L2 transaction", "compute",
        "latency", "atomic chain" (atomics waiting on one another at one sector) or
        "sorting network" (compare-and-swaps)."""
        if self.network > max(self.memory, self.compute, self.latency, self.chain):
            return "sorting network"
        if self.chain > max(self.memory, self.compute, self.latency):
            return "atomic chain"
        if self.compute >= self.memory and self.compute >= self.latency:
            return "compute" if self.compute else "memory"
        if self.latency > self.memory:
            return "latency"
        return "memory" if self.dram >= self.l2 else "L2 transaction"


def dot_dtype(dot) -> str:
    """The ceiling a ``tl.dot`` runs against: its 16-bit operand type, or TF32 (or plain
    fp32 with ``input_precision="ieee"``) for fp32 operands."""
    if dot.operand in ("fp16", "bf16"):
        return dot.operand
    return "fp32" if dot.input_precision == "ieee" else "tf32"


def dot_passes(dot) -> int:
    """Matrix products a ``tl.dot`` takes: three for fp32 operands at "tf32x3" (the high
    and low TF32 halves: hi·hi + hi·lo + lo·hi, for fp32's accuracy), else one."""
    return 3 if dot.operand == "fp32" and dot.input_precision == "tf32x3" else 1


def _peak(ceilings, dtype: str) -> float:
    """The ceiling for ``dtype``; plain fp32 where the card has no such matrix unit (T4:
    no TF32, its fp32 dots run on the CUDA cores)."""
    try:
        return ceilings.peak_flops(dtype)
    except KeyError:
        return ceilings.peak_flops("fp32")


def resident_programs(report, card) -> int:
    """Programs of this launch one SM holds at once: warps, the SM's program limit and,
    for a tl.dot kernel, the shared memory its pipeline stages take."""
    limits = card if isinstance(card, Card) else Card("unknown", 0.0)
    per_sm = min(max(limits.warps_per_sm // max(report.num_warps, 1), 1),
                 limits.programs_per_sm)
    if report.dot is not None:
        rules = rules_for(card)
        shared = rules.shared_bytes(report.dot, report.num_stages)
        if shared:
            per_sm = min(per_sm, max(rules.shared_memory // shared, 1))
    return per_sm


def estimate(report, ceilings, card) -> LaunchTime:
    """The time of the launch ``report`` describes, on ``ceilings`` (bandwidth, FLOP/s) and
    the geometry the report was analysed with (SMs), with ``card``'s limits per SM."""
    bandwidth = ceilings.bandwidth
    sector_s = 32 / (L2_OVER_DRAM * bandwidth)  # one full sector through L2
    hits = max(report.load_sectors - report.read_misses, 0)
    programs = max(report.programs, 1)
    sms = max(report.sm_count or getattr(card, "sm_count", 0) or 1, 1)
    compute = 0.0
    latency = 0.0
    if report.flops:
        per_sm = _peak(ceilings, dot_dtype(report.dot)) / sms
        compute = (math.ceil(programs / sms) * (report.flops / programs)
                   * dot_passes(report.dot) / per_sm)
    elif report.rounds:
        slots = sms * resident_programs(report, card)
        latency = math.ceil(programs / slots) * (report.rounds / programs) * ROUND_TRIP_S
    network = (math.ceil(programs / sms) * (report.compare_lanes / programs)
               * COMPARE_LANE_S)
    return LaunchTime(
        kernel=report.kernel,
        launch=LAUNCH_S,
        dram=report.dram_estimate / bandwidth,
        l2=(hits + PARTIAL_STORE_COST * report.partial_store_sectors
            + ATOMIC_COST * report.atomic_transactions) * sector_s,
        compute=compute,
        latency=latency,
        chain=report.atomic_chain * ATOMIC_CHAIN_S,
        network=network,
    )
