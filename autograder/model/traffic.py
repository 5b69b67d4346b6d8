"""What a traced kernel costs the memory system, and where it would land on a real card.

From the accesses ``trace.py`` records, per launch:

* requested bytes: active lanes × element size, for loads and stores;
* transactions: lanes grouped 32 at a time along the block's contiguous axis (as Triton's
  layouts group threads into warps), each group costing the distinct 32-byte sectors it
  touches; sector efficiency = requested bytes / (sectors × 32). A store transaction that
  writes only part of its sector is *partial*: L2 has to merge it into the sector. Atomic
  transactions are counted apart, and the longest chain of atomic lanes on one sector: L2
  applies those one after another;
* DRAM traffic, three ways: no reuse between programs (each program's distinct sectors,
  summed), a perfect cache (the grid's distinct sectors), and an estimate from an L2 of the
  target card's size, with programs resident in waves of its SM count, in launch order;
* the dependent steps ("rounds") each program takes: a load of a tensor that the current
  round has already loaded starts the next round, as each iteration of a loop does;
* the lanes of sorting networks' compare-and-swaps (``trace.py`` says which it counts);
* out-of-bounds accesses (an active lane outside every tensor argument) and races (two
  programs storing to one address without an atomic).

Each access is first reduced to a ``Footprint``: its sectors and byte counts without its
lanes. The analysis is numpy work per access, never Python work per lane, and a long trace
taken with ``tracing(keep_lanes=False)`` holds only footprints. ``predict`` turns the
counts into a time on a card with ``time_model``.

What it leaves out: caches other than L2 (L1, shared memory), the layouts the compiler
actually picks, vector widths, register pressure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..device.datasheet import Card
from . import time_model
from .footprint import SECTOR, TENSOR_SHIFT, Footprint, footprints, sorted_distinct
from .matrix_units import DEFAULT_NUM_STAGES, DEFAULT_NUM_WARPS, main_dot
from .time_model import L2_OVER_DRAM, LaunchTime  # noqa: F401  (L2_OVER_DRAM: for the labs)
from .trace_data import Dot, Launch

# --- One launch -------------------------------------------------------------------------


@dataclass
class TensorTraffic:
    name: str
    base: int = 0  # the address of its element 0: the same tensor in another launch
    requested: int = 0  # bytes
    sectors: int = 0  # transactions, summed over warp groups
    read_refs: int = 0  # distinct sectors read per wave of programs, summed over waves
    read_distinct: int = 0  # distinct sectors read by the launch
    read_misses: int = 0  # sectors read from DRAM, with the L2 model
    written: int = 0  # distinct sectors written: each is written back to DRAM once

    @property
    def efficiency(self) -> float:
        return self.requested / (self.sectors * SECTOR) if self.sectors else 1.0


@dataclass
class TrafficReport:
    kernel: str
    grid: tuple[int, int, int]
    requested_load: int = 0
    requested_store: int = 0
    load_sectors: int = 0
    store_sectors: int = 0
    partial_store_sectors: int = 0  # store transactions that write part of their sector
    atomic_transactions: int = 0  # atomic transactions (also counted in store_sectors)
    atomic_chain: int = 0  # the most atomic lanes on any one sector
    dram_no_reuse: int = 0  # bytes
    dram_perfect_cache: int = 0  # bytes
    per_program: np.ndarray = field(default_factory=lambda: np.zeros(0))  # DRAM bytes, no reuse
    per_tensor: dict[str, TensorTraffic] = field(default_factory=dict)
    out_of_bounds: list[str] = field(default_factory=list)
    races: list[str] = field(default_factory=list)
    l2_bytes: int = 0
    sm_count: int = 0
    rounds: int = 0  # dependent steps, summed over programs
    flops: float = 0.0  # of the launch's tl.dot calls
    compare_lanes: int = 0  # lanes of compare-and-swaps: sorting networks' steps
    dot: Dot | None = None  # the tile every program multiplies (matrix_units.main_dot)
    num_warps: int = 4
    num_stages: int = 3

    @property
    def programs(self) -> int:
        x, y, z = self.grid
        return x * y * z

    @property
    def requested(self) -> int:
        return self.requested_load + self.requested_store

    @property
    def read_misses(self) -> int:
        return sum(t.read_misses for t in self.per_tensor.values())

    @property
    def written_sectors(self) -> int:
        return sum(t.written for t in self.per_tensor.values())

    @property
    def dram_estimate(self) -> int:
        """DRAM bytes with the L2 model: sectors read from DRAM, and every distinct sector
        written, written back once."""
        return (self.read_misses + self.written_sectors) * SECTOR

    @property
    def sector_efficiency(self) -> float:
        sectors = self.load_sectors + self.store_sectors
        return self.requested / (sectors * SECTOR) if sectors else 1.0

    def lines(self) -> list[str]:
        """The report as a few lines of text."""
        x, y, z = self.grid
        out = [
            f"{self.kernel}: grid {x}×{y}×{z}, requested {self.requested_load:,} B loaded + "
            f"{self.requested_store:,} B stored",
            f"  sector efficiency {self.sector_efficiency:.1%} "
            f"({self.load_sectors + self.store_sectors:,} sectors of 32 B)",
        ]
        for t in self.per_tensor.values():
            out.append(f"    {t.name}: {t.requested:,} B in {t.sectors:,} sectors, "
                       f"{t.efficiency:.1%} used")
        if self.partial_store_sectors:
            out.append(f"  {self.partial_store_sectors:,} of the stored sectors only partly "
                       "written: L2 merges each one separately")
        out.append(f"  DRAM bytes: {self.dram_estimate:,} estimated with a "
                   f"{_size(self.l2_bytes)} L2 and {self.sm_count} SMs "
                   f"(between {self.dram_perfect_cache:,} with a perfect cache and "
                   f"{self.dram_no_reuse:,} with no reuse between programs)")
        out += [f"  OUT OF BOUNDS: {m}" for m in self.out_of_bounds]
        out += [f"  RACE: {m}" for m in self.races]
        return out


def analyze(launch: Launch, card: Card, l2_bytes: int | None = None,
            sm_count: int | None = None) -> TrafficReport:
    """The traffic report of one launch on ``card`` (its L2 size and SM count, unless
    given: a small L2 shows at CPU sizes what a real one shows at GPU sizes). Each launch
    starts with a cold L2."""
    l2 = l2_bytes if l2_bytes is not None else card.l2_bytes
    sms = sm_count if sm_count is not None else card.sm_count
    prints = footprints(launch)
    report = TrafficReport(
        launch.kernel, launch.grid, l2_bytes=l2, sm_count=sms,
        per_tensor={t.name: TensorTraffic(t.name, t.base) for t in launch.tensors},
        rounds=_rounds(prints), flops=sum(2.0 * d.m * d.n * d.k for d in launch.dots),
        compare_lanes=launch.compare_lanes,
        dot=main_dot(launch), num_warps=launch.options.get("num_warps", DEFAULT_NUM_WARPS),
        num_stages=launch.options.get("num_stages", DEFAULT_NUM_STAGES))
    report.out_of_bounds, report.races = _violations(launch, prints)
    _count_requests(report, launch, prints)
    _count_dram(report, launch, prints, max(l2 // SECTOR, 1), max(sms, 1))
    return report


def _count_requests(report: TrafficReport, launch: Launch, prints: list[Footprint]) -> None:
    """Requested bytes and transactions, by loads and stores and by tensor."""
    count = len(launch.tensors)
    requested, transactions = np.zeros((2, count), np.int64), np.zeros((2, count), np.int64)
    for f in prints:
        writes = int(f.kind != "load")  # stores and atomics write
        requested[writes] += f.requested
        transactions[writes] += f.transactions
        report.partial_store_sectors += f.partial
    atomics = [f for f in prints if f.atomic_lanes is not None]
    if atomics:
        report.atomic_transactions = int(sum(f.transactions.sum() for f in atomics))
        sectors = np.concatenate([f.atomic_lanes[0] for f in atomics])
        lanes = np.concatenate([f.atomic_lanes[1] for f in atomics])
        _, on_one = np.unique(sectors, return_inverse=True)
        report.atomic_chain = int(np.bincount(on_one, weights=lanes).max(initial=0))
    report.requested_load, report.requested_store = (int(r) for r in requested.sum(axis=1))
    report.load_sectors, report.store_sectors = (int(t) for t in transactions.sum(axis=1))
    for index, tensor in enumerate(report.per_tensor.values()):
        tensor.requested = int(requested[:, index].sum())
        tensor.sectors = int(transactions[:, index].sum())


def _count_dram(report: TrafficReport, launch: Launch, prints: list[Footprint],
                capacity: int, sms: int) -> None:
    """DRAM traffic with no reuse, a perfect cache, and an L2 of ``capacity`` sectors that
    programs fill in waves of ``sms``: reads miss in its LRU; every distinct sector written
    is written back once. A sector read and a sector written are separate transfers."""
    z, y, x = launch.grid[2], launch.grid[1], launch.grid[0]
    report.per_program = np.zeros((z, y, x))
    sizes = np.fromiter((f.sectors.size for f in prints), np.int64, len(prints))
    if not sizes.sum():
        return
    sector = np.concatenate([f.sectors for f in prints])
    program = np.repeat(np.fromiter((f.program for f in prints), np.int64, len(prints)), sizes)
    write = np.repeat(np.fromiter((f.kind != "load" for f in prints), bool, len(prints)), sizes)
    distinct, dense = np.unique(sector, return_inverse=True)
    keyed = dense * 2 + write
    span = 2 * len(distinct)
    pairs = sorted_distinct(program * span + keyed)  # (program, sector, read or write), once each
    report.dram_no_reuse = pairs.size * SECTOR
    report.per_program = (np.bincount(pairs // span, minlength=launch.programs)
                          * SECTOR).reshape(z, y, x)
    report.dram_perfect_cache = sorted_distinct(keyed).size * SECTOR
    # Reads, wave by wave: each wave's distinct sectors, in sector order, through the LRU.
    reads = ~write
    refs = sorted_distinct(program[reads] // sms * len(distinct) + dense[reads]) % len(distinct)
    miss = _lru_misses(refs, capacity)
    owner = distinct >> TENSOR_SHIFT

    def per_tensor(sectors: np.ndarray) -> list[int]:
        return np.bincount(owner[sectors], minlength=len(launch.tensors)).tolist()

    counts = {"read_refs": per_tensor(refs), "read_distinct": per_tensor(sorted_distinct(refs)),
              "read_misses": per_tensor(refs[miss]),
              "written": per_tensor(sorted_distinct(dense[write]))}
    for index, tensor in enumerate(report.per_tensor.values()):
        for name, values in counts.items():
            setattr(tensor, name, values[index])


def _rounds(prints: list[Footprint]) -> int:
    """Dependent steps, summed over programs. A program's loads join one round until a load
    reaches a tensor the round has already loaded: that is the next iteration of a loop,
    which waits for this one (a stencil loading one tensor several times per step counts
    more rounds than it takes)."""
    rounds, program, loaded = 0, None, 0
    for f in prints:
        if f.program != program:  # programs run one after another in the interpreter
            program, loaded = f.program, 0
        if f.kind != "load":
            continue
        touched = f.touched
        if not loaded or loaded & touched:
            rounds += 1
            loaded = touched
        else:
            loaded |= touched
    return rounds


# --- The L2 model -----------------------------------------------------------------------


def _lru_misses(refs: np.ndarray, capacity: int) -> np.ndarray:
    """Which references miss in an LRU cache of ``capacity`` sectors (a boolean per
    reference, ``refs`` in the order made).

    A reference hits when fewer than ``capacity`` other sectors were referenced since the
    same sector last was (its stack distance), so no cache is simulated: the distance of
    every re-reference is counted with array operations. Most are settled by two bounds,
    the first references in between (each is a distinct sector) and all references in
    between; only those in the band between them need the exact count."""
    n = refs.size
    order = np.argsort(refs, kind="stable")
    again = refs[order[1:]] == refs[order[:-1]]
    prev = np.full(n, -1, dtype=np.int64)
    prev[order[1:][again]] = order[:-1][again]  # the sector's previous reference
    first = prev < 0
    if np.count_nonzero(first) <= capacity:  # it all fits: only first references miss
        return first
    miss = first.copy()
    reref = np.flatnonzero(~first)
    if not reref.size:
        return miss
    last = prev[reref]
    firsts_seen = np.cumsum(first)
    firsts_between = firsts_seen[reref - 1] - firsts_seen[last]
    unsure = (reref - last - 1 >= capacity) & (firsts_between < capacity)
    miss[reref] = firsts_between >= capacity
    if unsure.any():
        # Distinct sectors between = first references between + re-references between
        # whose sector was last referenced before ``last``; the latter are those counted by
        # _smaller_before, less the re-references up to ``last`` (all of them qualify).
        distance = (firsts_between + _smaller_before(last)
                    - np.searchsorted(reref, last, side="right"))
        miss[reref[unsure]] = distance[unsure] >= capacity
    return miss


def _smaller_before(values: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements are smaller: a bottom-up merge sort
    that counts, for each element of a right half, the smaller ones in its left half."""
    n = values.size
    counts = np.zeros(n, dtype=np.int64)
    position = np.arange(n)  # where each element of the sorted runs came from
    runs = values - values.min()
    span = int(runs.max()) + 1
    index = np.arange(n)
    width = 1
    while width < n:
        block = index // (2 * width)
        right = (index // width) % 2 == 1
        keys = block * span + runs  # sorted within each half; blocks in order
        left = keys[~right]
        counts[position[right]] += (np.searchsorted(left, keys[right])
                                    - np.searchsorted(left, block[right] * span))
        merged = np.argsort(keys, kind="stable")
        runs, position = runs[merged], position[merged]
        width *= 2
    return counts


# --- Checks -----------------------------------------------------------------------------


def violations(launch: Launch) -> tuple[list[str], list[str]]:
    """Out-of-bounds accesses and races, in words."""
    return _violations(launch, footprints(launch))


def _violations(launch: Launch, prints: list[Footprint]) -> tuple[list[str], list[str]]:
    out_of_bounds = [_describe_oob(f, launch) for f in prints if f.outside is not None][:3]
    return out_of_bounds, _races(launch, prints)


def _program_index(p: int, grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """A linear program id as (program_id(0), program_id(1), program_id(2)), x fastest."""
    nx, ny, _ = grid
    return (p % nx, (p // nx) % ny, p // (nx * ny))


def _describe_oob(f: Footprint, launch: Launch) -> str:
    program = _program_index(f.program, launch.grid)
    address = f.outside
    below = [t for t in launch.tensors if t.base <= address]
    tensor = max(below, key=lambda t: t.base) if below else min(launch.tensors,
                                                                   key=lambda t: t.base)
    offset = (int(address) - tensor.base) // tensor.element_size
    size = tensor.extent // tensor.element_size
    if not -size <= offset < 2 * size + 4096:  # nowhere near any tensor: a wild pointer
        return (f"program {program} {f.kind}s at an address far outside every tensor "
                "argument: check the offsets (strides swapped? a pointer added twice?)")
    where = "past its end" if offset >= size else "before its start"
    elements = "element" if size == 1 else "elements"
    return (f"program {program} {f.kind}s {tensor.name}[{offset}], {where} "
            f"({tensor.name} has {size} {elements}): a missing or wrong mask")


def _writes(launch: Launch, prints: list[Footprint]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """Every plain store's (address, program, bits stored) and the addresses atomics
    wrote. Bits are None where the trace holds no values (a launch traced by hand)."""
    if launch.writes:
        plain = [(a, p, b) for p, a, b in launch.writes if b is not None]
        atomic = [a for _, a, b in launch.writes if b is None]
        bits = np.concatenate([b for _, _, b in plain]) if plain else np.zeros(0, np.uint64)
    else:
        plain = [(f.stored, f.program, None) for f in prints if f.stored is not None]
        atomic, bits = [], None
    addresses = np.concatenate([a for a, _, _ in plain]) if plain else np.zeros(0, np.uint64)
    programs = np.repeat(np.fromiter((p for _, p, _ in plain), np.int64, len(plain)),
                         [a.size for a, _, _ in plain])
    touched = np.concatenate(atomic) if atomic else np.zeros(0, np.uint64)
    return addresses, programs, bits, touched


def _races(launch: Launch, prints: list[Footprint]) -> list[str]:
    """Addresses that two programs store to, unless every store there wrote the same bits
    and no atomic touched it (a flag raised by whichever programs find something, say):
    then the order the programs run in changes nothing. Sorted by address, an address
    stored by two programs has two neighbours from different programs."""
    addresses, programs, bits, atomic = _writes(launch, prints)
    if not addresses.size:
        return []
    order = np.argsort(addresses, kind="stable")
    addresses, programs = addresses[order], programs[order]
    clash = (addresses[1:] == addresses[:-1]) & (programs[1:] != programs[:-1])
    shared = sorted_distinct(addresses[1:][clash])
    differ = np.ones(shared.size, dtype=bool)
    if bits is not None and shared.size:
        bits = np.append(bits[order], np.uint64(0))  # a sentinel: reduceat's last index
        first = np.searchsorted(addresses, shared, side="left")
        last = np.searchsorted(addresses, shared, side="right")
        runs = np.stack([first, last], axis=1).ravel()  # each address's stores, alone
        same = np.minimum.reduceat(bits, runs)[::2] == np.maximum.reduceat(bits, runs)[::2]
        differ = ~same | np.isin(shared, atomic)
    plain_only = ~np.isin(shared, atomic) if bits is not None else np.zeros(shared.size, bool)
    shared, plain_only = shared[differ], plain_only[differ]
    messages = []
    for addr, plain in zip(shared[:3].tolist(), plain_only[:3].tolist(), strict=False):
        who = sorted(set(programs[addresses == addr].tolist()))
        tensor = next((t for t in launch.tensors if t.contains(np.array([addr], np.uint64))[0]),
                      None)
        where = (f"{tensor.name}[{(addr - tensor.base) // tensor.element_size}]" if tensor
                 else hex(addr))
        first, second = (_program_index(p, launch.grid) for p in who[:2])
        if plain and tensor is not None and tensor.extent == tensor.element_size:
            messages.append(_one_element_race(tensor.name, where, first, second))
            continue
        values = ", different values," if bits is not None else ""
        messages.append(f"programs {first} and {second} both store to {where}{values} and "
                        "each element must be written by one program (or by several with "
                        "one value): the store offsets of at least one are wrong (rows and "
                        "columns the wrong way round? blocks that overlap?), or the value "
                        "needs an atomic")
    if len(shared) > 3:
        messages.append(f"... {len(shared)} addresses in all")
    return messages


def _size(count: int) -> str:
    """Bytes in binary units: 16 KiB, 0.5 MiB, 50 MiB."""
    return f"{count / 2**10:.3g} KiB" if count < 2**19 else f"{count / 2**20:.3g} MiB"


def _one_element_race(name: str, where: str, first: tuple, second: tuple) -> str:
    """Plain stores of different values into a one-element tensor: no tile is misplaced
    there; it is a flag or a total that every program reports into."""
    return (f"programs {first} and {second} both store to {where}, different values, with "
            f"plain stores: {name} is one element (a flag, a total), and the program that "
            "stores last decides, so one that found nothing can overwrite what another "
            "found (a flag's 0.0 over its 1.0). Store only where a program has something "
            "to report (every such store the same value), or use an atomic: tl.atomic_max "
            "for a flag, tl.atomic_add for a total")


# --- Where it would land ----------------------------------------------------------------


@dataclass
class Prediction:
    """Where a kernel would land on a card, from its traced traffic: a model, not a
    measurement, and always labelled so."""

    target: str  # e.g. "H100 SXM, datasheet (not measured)"
    case: str  # the case that was traced
    reports: list[TrafficReport]
    compulsory: float  # bytes, from the problem's cost model
    flops: float
    times: list[LaunchTime]  # per launch, from time_model
    floor_s: float  # the roofline floor of the compulsory work
    work_s: float = 0.0  # the work's FLOPs at the peak: no launch sequence runs faster

    @property
    def launch_s(self) -> float:
        """The fixed cost of the launches, whatever they do."""
        return sum(t.launch for t in self.times)

    @property
    def running_s(self) -> float:
        """The launches once running: their memory, compute, latency, atomic chains and
        sorting networks."""
        return max(sum(t.body for t in self.times), self.work_s)

    @property
    def seconds(self) -> float:
        """Predicted time."""
        return self.launch_s + self.running_s

    @property
    def bound(self) -> str:
        """What sets the running time: "memory", "L2 transaction", "compute", "latency",
        "atomic chain" or "sorting network" (of the longest launch)."""
        if not self.times or self.work_s > sum(t.body for t in self.times):
            return "compute"
        return max(self.times, key=lambda t: t.body).bound

    def _few_programs(self, traffic_only: bool) -> TrafficReport | None:
        """The launch whose FLOPs set a compute bound, when it runs fewer programs than
        the card has SMs: one program per SM, the others idle. None when the bound is
        the work's own FLOPs at the peak, or the launch fills the chip."""
        size = (lambda t: max(t.memory, t.compute)) if traffic_only else (lambda t: t.body)
        if not self.times or self.work_s > sum(size(t) for t in self.times):
            return None
        report, time = max(zip(self.reports, self.times, strict=True),
                           key=lambda pair: size(pair[1]))
        if time.compute < max(time.memory, 0 if traffic_only else time.latency):
            return None
        return report if report.programs < report.sm_count else None

    def _bound_words(self, bound: str, traffic_only: bool = False) -> str:
        """``bound`` as a line says it: a compute bound set by too few programs for the
        chip says on how many SMs."""
        few = self._few_programs(traffic_only) if bound == "compute" else None
        if few is None:
            named = {"atomic chain": "atomic-chain", "sorting network": "sorting-network"}
            return f"{named.get(bound, bound)}-bound"
        return f"compute-bound on {few.programs} of {few.sm_count} SMs"

    @property
    def traffic_s(self) -> float:
        """What the bytes and FLOPs alone take: no launch cost, no waiting on latency, and
        neither atomic chains nor sorting networks (which ``seconds`` includes). A grade on
        a CPU reads this: what the kernel's accesses decide, whatever the case's size."""
        return max(sum(max(t.memory, t.compute) for t in self.times), self.work_s)

    @property
    def traffic_fraction(self) -> float:
        return self.floor_s / self.traffic_s if self.traffic_s else 1.0

    @property
    def traffic_bound(self) -> str:
        """What sets the time of the bytes and FLOPs alone."""
        longest = max(self.times, key=lambda t: max(t.memory, t.compute), default=None)
        if longest is None or self.work_s > sum(max(t.memory, t.compute) for t in self.times) \
                or longest.compute > longest.memory:
            return "compute"
        return "memory" if longest.dram >= longest.l2 else "L2 transaction"

    @property
    def launch_bound(self) -> bool:
        """The launches' fixed cost outweighs what they do: a size too small to say much
        about a GPU's time, only about the traffic."""
        return self.launch_s > self.running_s

    @property
    def dram(self) -> int:
        return sum(r.dram_estimate for r in self.reports)

    @property
    def sector_efficiency(self) -> float:
        requested = sum(r.requested for r in self.reports)
        sectors = sum(r.load_sectors + r.store_sectors for r in self.reports)
        return requested / (sectors * SECTOR) if sectors else 1.0

    @property
    def transactions(self) -> int:
        """Bytes moved between L2 and the SMs: every sector touched, 32 bytes each."""
        return sum(r.load_sectors + r.store_sectors for r in self.reports) * SECTOR

    @property
    def fraction(self) -> float:
        return self.floor_s / self.seconds if self.seconds else 1.0

    @property
    def worst_tensor(self) -> TensorTraffic | None:
        tensors = [t for r in self.reports for t in r.per_tensor.values() if t.sectors]
        return min(tensors, key=lambda t: t.efficiency, default=None)

    @property
    def bottleneck(self) -> str:
        worst = self.worst_tensor
        if self.sector_efficiency < 0.8 and worst is not None:
            if worst.efficiency >= 0.5:  # strided access wastes more: this is edges
                return (f"partly used sectors: {self.sector_efficiency:.0%} of the bytes "
                        f"moved are used ({worst.name}: {worst.efficiency:.1%}), as at the "
                        "ragged edges of small tiles or rows that do not start on a 32-byte "
                        "boundary; it fades at full size")
            return (f"uncoalesced: only {self.sector_efficiency:.0%} of the bytes in the "
                    f"32-byte sectors moved are used ({worst.name}: {worst.efficiency:.1%})")
        ratio = self.dram / self.compulsory if self.compulsory else 1.0
        if ratio > 1.5:
            return self._excess_traffic(ratio)
        if self.bound == "latency":
            return ("latency-bound: each program waits for its loads before it computes "
                    "(in a loop without tl.dot, at every step: such a loop is not "
                    "pipelined), and too few programs are in flight to hide the wait; more "
                    "programs in flight, or more work per load, would hide it")
        if self.bound == "atomic chain":
            hot = max(self.reports, key=lambda r: r.atomic_chain)
            return (f"atomic-chain-bound: {hot.atomic_chain:,} atomic lanes of {hot.kernel} "
                    "land on one 32-byte sector, and L2 applies those one after another, "
                    "whatever the rest of the chip does (contention: many programs adding "
                    "into one address). Combine them first (a sum per block, or sort by "
                    "address and add each run once), then one atomic per run")
        if self.bound == "sorting network":
            return ("sorting-network-bound: the compare-and-swaps of its sorting networks "
                    "take longer than its bytes. A network does work in n·log²(n) for each "
                    "block it sorts: fewer or smaller networks (a smaller k, selecting before "
                    "sorting) cut it")
        if self.bound == "L2 transaction" and self.compulsory:
            return (f"L2-bound: {self.transactions / self.compulsory:.1f}× the compulsory "
                    "bytes cross between L2 and the multiprocessors (data read again from "
                    "L2, or sectors written a few bytes at a time)")
        few = self._few_programs(traffic_only=False) if self.bound == "compute" else None
        if few is not None:
            idle = few.sm_count - few.programs
            return (f"{self._bound_words('compute')}: {few.kernel} runs {few.programs} "
                    f"program{'s' if few.programs != 1 else ''}, one per SM, whose tl.dot "
                    f"FLOPs take longer than the bytes while the other {idle} SMs stay idle; "
                    "it fades at sizes with a program for every SM")
        return f"{self.bound}-bound, close to what the work requires"

    def _excess_traffic(self, ratio: float) -> str:
        """Why DRAM traffic is ``ratio`` times the compulsory bytes, as far as the trace
        shows: data a launch read again after the L2 evicted it (its working set does not
        fit), data an earlier launch already read or wrote (every launch is modelled from
        an empty L2), or neither."""
        excess = self.dram - self.compulsory
        head = f"DRAM traffic is {ratio:.1f}× the compulsory bytes"
        evicted = sum((t.read_misses - t.read_distinct) * SECTOR for r in self.reports
                      for t in r.per_tensor.values())
        l2 = _size(self.reports[0].l2_bytes)
        if evicted * 2 >= excess:
            return (f"re-reads: {head}: {evicted:,} B are data read again by later programs "
                    f"after the {l2} L2 had evicted it (between two reads of the same data, "
                    "the programs read more than the L2 holds)")
        again, names = self._read_by_earlier_launches()
        if again * 2 < excess:
            return (f"{head}: more is read or written than the inputs and outputs once each "
                    "(scratch, or data read twice)")
        held = self._working_set()
        where = (f"{_size(held)} in all, which the {l2} L2 could hold: on a GPU much of it "
                 "may still be there, at L2 cost rather than DRAM's, but every launch still "
                 "reads it again" if held <= self.reports[0].l2_bytes else
                 f"{_size(held)} in all, more than the {l2} L2: each launch fetches it from "
                 "DRAM again")
        return (f"re-reads: {head}, over {len(self.reports)} launches: {again:,} B of it are "
                f"launches reading {', '.join(names)} again after an earlier launch read or "
                f"wrote them. The model starts every launch with an empty L2; the data is "
                f"{where}")

    def _read_by_earlier_launches(self) -> tuple[int, list[str]]:
        """Bytes that launches read from tensors an earlier launch already read or wrote,
        and those tensors' names (as the later launches call them)."""
        seen: set[int] = set()
        again, names = 0, []
        for report in self.reports:
            for t in report.per_tensor.values():
                if t.base in seen and t.read_distinct:
                    again += t.read_distinct * SECTOR
                    names += [t.name] if t.name not in names else []
            seen |= {t.base for t in report.per_tensor.values() if t.read_distinct or t.written}
        return again, names

    def _working_set(self) -> int:
        """Bytes of every tensor the launches touch, each counted once (its largest
        footprint in any one launch)."""
        largest: dict[int, int] = {}
        for report in self.reports:
            for t in report.per_tensor.values():
                touched = max(t.read_distinct, t.written) * SECTOR
                largest[t.base] = max(largest.get(t.base, 0), touched)
        return sum(largest.values())

    @property
    def line(self) -> str:
        ratio = self.dram / self.compulsory if self.compulsory else float("nan")
        l2 = self.reports[0].l2_bytes if self.reports else 0
        with_l2 = f" with a {_size(l2)} L2" if l2 else ""
        traffic = (f"(sector efficiency {self.sector_efficiency:.0%}, "
                   f"DRAM {ratio:.2f}× compulsory{with_l2})")
        where = f"predicted for {self.target} at {self.case}"
        if not self.launch_bound:
            return (f"{where}: {self.fraction:.0%} of roofline, {self._bound_words(self.bound)} "
                    f"{traffic}")
        launches = "a launch" if len(self.times) == 1 else f"{len(self.times)} launches"
        return (f"{where}: {self.traffic_fraction:.0%} of roofline in its traffic, "
                f"{self._bound_words(self.traffic_bound, traffic_only=True)} {traffic}; "
                f"at this size the fixed "
                f"{self.launch_s * 1e6:.0f} µs of {launches} outweigh"
                f"{'s' if len(self.times) == 1 else ''} it ({self.fraction:.0%} of roofline "
                "in all)")


def predict(launches: list[Launch], flops: float, compulsory: float, dtype: str,
            ceilings, card: Card, case: str = "", l2_bytes: int | None = None,
            sm_count: int | None = None) -> Prediction:
    """Analyse each launch on ``card`` (or an L2 / SM count given instead) and predict the
    time on ``ceilings``. ``flops`` and ``compulsory`` are the work (FLOPs in ``dtype``,
    bytes) that sets the roofline floor."""
    reports = [analyze(launch, card, l2_bytes, sm_count) for launch in launches]
    return prediction(reports, flops, compulsory, dtype, ceilings, card, case)


def prediction(reports: list[TrafficReport], flops: float, compulsory: float, dtype: str,
               ceilings, card: Card, case: str = "") -> Prediction:
    """The prediction from analysed launches (see ``time_model`` for how)."""
    times = [time_model.estimate(report, ceilings, card) for report in reports]
    work_s = flops / ceilings.peak_flops(dtype) if flops else 0.0
    floor_s = max(work_s, compulsory / ceilings.bandwidth)
    return Prediction(ceilings.label, case, reports, compulsory, flops, times, floor_s, work_s)
