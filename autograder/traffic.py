"""What a traced kernel costs the memory system, and where it would land on a real card.

From the accesses ``trace.py`` records, per launch:

* requested bytes: active lanes × element size, for loads and stores;
* transactions: lanes grouped 32 at a time along the block's contiguous axis (as Triton's
  layouts group threads into warps), each group costing the distinct 32-byte sectors it
  touches; sector efficiency = requested bytes / (sectors × 32);
* DRAM traffic, three ways: no reuse between programs (each program's distinct sectors,
  summed), a perfect cache (the grid's distinct sectors), and an estimate from an L2 of the
  target card's size, with programs resident in waves of its SM count, in launch order;
* out-of-bounds accesses (an active lane outside every tensor argument) and races (two
  programs storing to one address without an atomic).

What it leaves out: caches other than L2 (L1, shared memory), the layouts the compiler
actually picks, vector widths, latency and occupancy. It is a model of bytes, not a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .datasheet import Card
from .trace import Access, Launch

SECTOR = 32
WARP = 32
# Bytes move between L2 and the SMs in sectors; that path is faster than DRAM but not
# free. Published microbenchmarks put L2 bandwidth at roughly 2-3x DRAM bandwidth on
# Ampere and Hopper: we take 2.5x, so a kernel that wastes most of every sector it touches
# is slow even when L2 merges its traffic before DRAM sees it.
L2_OVER_DRAM = 2.5


@dataclass
class TensorTraffic:
    name: str
    requested: int = 0  # bytes
    sectors: int = 0  # transactions, summed over warp groups

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
    dram_no_reuse: int = 0  # bytes
    dram_perfect_cache: int = 0  # bytes
    dram_estimate: int = 0  # bytes, with the L2 model
    per_program: np.ndarray = field(default_factory=lambda: np.zeros(0))  # DRAM bytes, no reuse
    per_tensor: dict[str, TensorTraffic] = field(default_factory=dict)
    out_of_bounds: list[str] = field(default_factory=list)
    races: list[str] = field(default_factory=list)
    l2_bytes: int = 0
    sm_count: int = 0

    @property
    def requested(self) -> int:
        return self.requested_load + self.requested_store

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
        out.append(f"  DRAM bytes: {self.dram_estimate:,} estimated with a "
                   f"{self.l2_bytes / 2**20:g} MiB L2 and {self.sm_count} SMs "
                   f"(between {self.dram_perfect_cache:,} with a perfect cache and "
                   f"{self.dram_no_reuse:,} with no reuse between programs)")
        out += [f"  OUT OF BOUNDS: {m}" for m in self.out_of_bounds]
        out += [f"  RACE: {m}" for m in self.races]
        return out


def _contiguous_last(addresses: np.ndarray, active: np.ndarray):
    """Reorder a block so its contiguous axis is last: Triton walks threads along it."""
    if addresses.ndim <= 1:
        return addresses.reshape(-1), active.reshape(-1)
    steps = []
    for axis in range(addresses.ndim):
        if addresses.shape[axis] < 2:
            steps.append(np.inf)
            continue
        first = np.take(addresses, 0, axis=axis).astype(np.int64)
        second = np.take(addresses, 1, axis=axis).astype(np.int64)
        step = float(np.median(np.abs(second - first)))
        steps.append(step if step > 0 else np.inf)
    fastest = int(np.argmin(steps))
    return (np.moveaxis(addresses, fastest, -1).reshape(-1),
            np.moveaxis(active, fastest, -1).reshape(-1))


def _transactions(sectors: np.ndarray, active: np.ndarray) -> int:
    """Distinct sectors per group of 32 lanes, summed."""
    pad = (-len(sectors)) % WARP
    ids = np.where(active, sectors, -1)
    ids = np.concatenate([ids, np.full(pad, -1, dtype=ids.dtype)]).reshape(-1, WARP)
    ids.sort(axis=1)
    distinct = (ids[:, 1:] != ids[:, :-1]).sum(axis=1) + 1
    distinct -= (ids[:, 0] == -1)  # the inactive marker is not a sector
    return int(distinct.sum())


def _place(access: Access, launch: Launch):
    """For each lane: which tensor it falls in (-1: none) and its sector id (unique across
    tensors; sectors are counted from each tensor's base, as allocations are aligned)."""
    addresses, active = _contiguous_last(access.addresses, access.active)
    owner = np.full(addresses.shape, -1, dtype=np.int64)
    sector = np.zeros(addresses.shape, dtype=np.int64)
    for index, tensor in enumerate(launch.tensors):
        inside = tensor.contains(addresses) & (owner < 0)
        owner[inside] = index
        sector[inside] = ((addresses[inside] - np.uint64(tensor.base)).astype(np.int64)
                          // SECTOR) + (index << 40)
    return addresses, active, owner, sector


def _describe_oob(access: Access, launch: Launch, address: int, grid) -> str:
    nx, ny, _ = grid
    p = access.program
    program = (p % nx, (p // nx) % ny, p // (nx * ny))
    below = [t for t in launch.tensors if t.base <= address]
    tensor = max(below, key=lambda t: t.base) if below else min(launch.tensors,
                                                                   key=lambda t: t.base)
    offset = (int(address) - tensor.base) // tensor.element_size
    size = tensor.extent // tensor.element_size
    if not -size <= offset < 2 * size + 4096:  # nowhere near any tensor: a wild pointer
        return (f"program {program} {access.kind}s at an address far outside every tensor "
                "argument: check the offsets (strides swapped? a pointer added twice?)")
    where = "past its end" if offset >= size else "before its start"
    elements = "element" if size == 1 else "elements"
    return (f"program {program} {access.kind}s {tensor.name}[{offset}], {where} "
            f"({tensor.name} has {size} {elements}): a missing or wrong mask")


def _lru_misses(waves: list[np.ndarray], capacity: int) -> int:
    if len(np.unique(np.concatenate(waves))) <= capacity if waves else True:
        return len(np.unique(np.concatenate(waves))) if waves else 0  # it all fits: no eviction
    cache: OrderedDict[int, None] = OrderedDict()
    misses = 0
    for wave in waves:
        for sector in wave.tolist():
            if sector in cache:
                cache.move_to_end(sector)
            else:
                misses += 1
                cache[sector] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return misses


def analyze(launch: Launch, card: Card, l2_bytes: int | None = None,
            sm_count: int | None = None) -> TrafficReport:
    """The traffic report of one launch on ``card`` (its L2 size and SM count, unless
    given: a small L2 shows at CPU sizes what a real one shows at GPU sizes)."""
    l2 = l2_bytes if l2_bytes is not None else card.l2_bytes
    sms = sm_count if sm_count is not None else card.sm_count
    report = TrafficReport(launch.kernel, launch.grid, l2_bytes=l2, sm_count=sms,
                           per_tensor={t.name: TensorTraffic(t.name) for t in launch.tensors})
    report.out_of_bounds, report.races = violations(launch)
    programs, sectors, writes = [], [], []
    for access in launch.accesses:
        addresses, active, owner, sector = _place(access, launch)
        active = active & (owner >= 0)
        requested = int(active.sum()) * access.element_size
        transactions = _transactions(sector, active)
        if access.kind == "load":
            report.requested_load += requested
            report.load_sectors += transactions
        else:  # stores and atomics write
            report.requested_store += requested
            report.store_sectors += transactions
        for index, tensor in enumerate(launch.tensors):
            mine = active & (owner == index)
            if mine.any():
                report.per_tensor[tensor.name].requested += int(mine.sum()) * access.element_size
                report.per_tensor[tensor.name].sectors += _transactions(sector, mine)
        lanes = sector[active]
        programs.append(np.full(lanes.shape, access.program, dtype=np.int64))
        sectors.append(lanes)
        writes.append(np.full(lanes.shape, access.kind != "load"))

    if sectors:
        program, sector, write = (np.concatenate(programs), np.concatenate(sectors),
                                  np.concatenate(writes))
        # A sector read and a sector written are separate DRAM transfers.
        keyed = sector * 2 + write
        per_program = np.unique(np.stack([program, keyed]), axis=1)
        report.dram_no_reuse = per_program.shape[1] * SECTOR
        report.per_program = np.bincount(per_program[0], minlength=launch.programs) * SECTOR
        report.dram_perfect_cache = len(np.unique(keyed)) * SECTOR
        # The L2 estimate: reads miss in an LRU of the card's L2, waves of `sms` programs;
        # every distinct written sector is written back once.
        reads = ~write
        wave_of = program // max(sms, 1)
        waves = [np.unique(sector[reads & (wave_of == w)]) for w in np.unique(wave_of[reads])]
        read_misses = _lru_misses(waves, max(l2 // SECTOR, 1))
        report.dram_estimate = (read_misses + len(np.unique(sector[write]))) * SECTOR
    report.per_program = report.per_program.reshape(launch.grid[2], launch.grid[1],
                                                    launch.grid[0]) if sectors else \
        np.zeros((launch.grid[2], launch.grid[1], launch.grid[0]))
    return report


def violations(launch: Launch) -> tuple[list[str], list[str]]:
    """Out-of-bounds accesses and races, in words (cheap: no cache model)."""
    out_of_bounds = []
    stores: list[tuple[np.ndarray, np.ndarray]] = []
    for access in launch.accesses:
        addresses = access.addresses.reshape(-1)
        active = access.active.reshape(-1)
        inside = np.zeros(addresses.shape, dtype=bool)
        for tensor in launch.tensors:
            inside |= tensor.contains(addresses)
        outside = active & ~inside
        if outside.any() and len(out_of_bounds) < 3:
            out_of_bounds.append(_describe_oob(access, launch, addresses[outside][0],
                                               launch.grid))
        if access.kind == "store":
            mine = active & inside
            stores.append((addresses[mine], np.full(int(mine.sum()), access.program)))
    return out_of_bounds, _races(stores, launch)


def _races(stores: list[tuple[np.ndarray, np.ndarray]], launch: Launch) -> list[str]:
    if not stores:
        return []
    addresses = np.concatenate([a for a, _ in stores])
    programs = np.concatenate([p for _, p in stores])
    pairs = np.unique(np.stack([addresses.astype(np.int64), programs]), axis=1)
    address, count = np.unique(pairs[0], return_counts=True)
    shared = address[count > 1]
    messages = []
    for addr in shared[:3].tolist():
        who = sorted(pairs[1][pairs[0] == addr].tolist())
        tensor = next((t for t in launch.tensors if t.contains(np.array([addr], np.uint64))[0]),
                      None)
        where = (f"{tensor.name}[{(addr - tensor.base) // tensor.element_size}]" if tensor
                 else hex(addr))
        messages.append(f"programs {who[0]} and {who[1]} both store to {where}: the result "
                        "depends on which runs last. Check the offsets each program computes "
                        "(does each cover its own block?); if sharing is intended, use an "
                        "atomic")
    if len(shared) > 3:
        messages.append(f"... {len(shared)} addresses in all")
    return messages


@dataclass
class Prediction:
    """Where a kernel would land on a card, from its traced traffic: a model, not a
    measurement, and always labelled so."""

    target: str  # e.g. "H100 SXM, datasheet (not measured)"
    case: str  # the case that was traced
    reports: list[TrafficReport]
    compulsory: float  # bytes, from the problem's cost model
    flops: float
    seconds: float  # predicted time
    floor_s: float  # the roofline floor of the compulsory work
    bound: str

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
            return (f"re-reads: DRAM traffic is {ratio:.1f}× the compulsory bytes "
                    "(data is fetched again by program after program)")
        return f"{self.bound}-bound, close to what the work requires"

    @property
    def line(self) -> str:
        ratio = self.dram / self.compulsory if self.compulsory else float("nan")
        l2 = self.reports[0].l2_bytes if self.reports else 0
        with_l2 = f" with a {l2 / 2**20:g} MiB L2" if l2 else ""
        return (f"predicted for {self.target} at {self.case}: {self.fraction:.0%} of roofline, "
                f"{self.bound}-bound (sector efficiency {self.sector_efficiency:.0%}, "
                f"DRAM {ratio:.2f}× compulsory{with_l2})")


def predict(launches: list[Launch], flops: float, compulsory: float, dtype: str,
            ceilings, card: Card, case: str = "", l2_bytes: int | None = None,
            sm_count: int | None = None) -> Prediction:
    """Predicted time = max(flops / peak, DRAM bytes / bandwidth, L2 sector traffic /
    (L2_OVER_DRAM × bandwidth))."""
    reports = [analyze(launch, card, l2_bytes, sm_count) for launch in launches]
    prediction = Prediction(ceilings.label, case, reports, compulsory, flops, 0.0, 0.0, "")
    times = {
        "compute": flops / ceilings.peak_flops(dtype) if flops else 0.0,
        "memory": prediction.dram / ceilings.bandwidth,
        "L2 transaction": prediction.transactions / (L2_OVER_DRAM * ceilings.bandwidth),
    }
    prediction.bound = max(times, key=times.get)
    prediction.seconds = times[prediction.bound]
    prediction.floor_s = max(times["compute"], compulsory / ceilings.bandwidth)
    return prediction
