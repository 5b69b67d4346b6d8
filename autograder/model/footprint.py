"""One memory access reduced to what the traffic model needs: its footprint.

A traced access holds an address for every lane of its block. The model needs far less:
per tensor argument, the bytes requested and the 32-byte sectors each group of 32 lanes
(a warp) touched, and which sectors in all. ``trace.py`` reduces each access as it is made
when the lanes are not kept; ``traffic.py`` reads footprints either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .trace_data import Access, Launch, TensorArg

SECTOR = 32
WARP = 32
TENSOR_SHIFT = 40  # sector id = tensor index << 40 | sector within the tensor


@dataclass
class Footprint:
    """One access reduced to what the model needs. Per tensor argument (in launch order):
    the bytes requested and the transactions (distinct sectors per group of 32 lanes).
    Then the store transactions that write only part of their sector, the distinct sectors
    touched (for DRAM), and for the checks the first lane outside every tensor and the
    addresses a store wrote; for an atomic, its lanes on each sector."""

    kind: str  # "load", "store" or "atomic"
    program: int
    requested: np.ndarray  # bytes, per tensor
    transactions: np.ndarray  # per tensor
    partial: int  # store transactions that write part of their sector
    sectors: np.ndarray  # distinct sector ids (int64), tensor index in the high bits
    outside: int | None = None  # address of the first active lane outside every tensor
    stored: np.ndarray | None = None  # distinct addresses a store wrote, inside the tensors
    # An atomic's lanes per sector: (distinct sector ids, lanes on each). L2 applies the
    # atomics on one sector one lane after another: the launch's longest chain is their sum.
    atomic_lanes: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def touched(self) -> int:
        """The tensors this access reached, as a bit mask."""
        return sum(1 << int(i) for i in np.flatnonzero(self.requested))


def _contiguous_axis(addresses: np.ndarray) -> int | None:
    """The axis of a block along which addresses advance least: Triton walks threads (and
    groups them into warps) along it. None for a 0- or 1-D block."""
    if addresses.ndim <= 1:
        return None
    steps = []
    for axis in range(addresses.ndim):
        if addresses.shape[axis] < 2:
            steps.append(np.inf)
            continue
        first = np.take(addresses, 0, axis=axis).astype(np.int64)
        second = np.take(addresses, 1, axis=axis).astype(np.int64)
        step = float(np.median(np.abs(second - first)))
        steps.append(step if step > 0 else np.inf)
    return int(np.argmin(steps))


def _owners(addresses: np.ndarray, tensors: list[TensorArg]) -> np.ndarray:
    """For each lane, the index of the first tensor argument it falls in, or -1."""
    owner = np.full(addresses.shape, -1, dtype=np.int64)
    for index, tensor in enumerate(tensors):
        owner[(owner < 0) & tensor.contains(addresses)] = index
    return owner


def footprint(access: Access, tensors: list[TensorArg]) -> Footprint:
    """Reduce one access to its footprint. Sectors are counted from each tensor's base, as
    allocations are aligned."""
    count = len(tensors)
    owner = _owners(access.addresses, tensors)
    valid = access.active & (owner >= 0)
    stray = access.active & (owner < 0)
    outside = int(access.addresses[stray][0]) if stray.any() else None
    axis = _contiguous_axis(access.addresses)
    if axis is not None:  # lanes in warp order: the contiguous axis last
        addresses, owner, valid = (np.moveaxis(a, axis, -1) for a in
                                   (access.addresses, owner, valid))
    else:
        addresses = access.addresses
    addresses, owner, valid = addresses.reshape(-1), owner.reshape(-1), valid.reshape(-1)
    bases = np.array([t.base for t in tensors], dtype=np.uint64)
    mine = owner[valid]
    sector = np.full(addresses.shape, -1, dtype=np.int64)
    sector[valid] = ((addresses[valid] - bases[mine]) // SECTOR).astype(np.int64) \
        + (mine << TENSOR_SHIFT)
    distinct, lanes = _warp_transactions(sector)
    size = access.element_size
    return Footprint(
        kind=access.kind,
        program=access.program,
        requested=np.bincount(mine, minlength=count) * size,
        transactions=np.bincount(distinct >> TENSOR_SHIFT, minlength=count),
        partial=int(np.count_nonzero(lanes * size < SECTOR)) if access.kind == "store" else 0,
        sectors=sorted_distinct(distinct),
        outside=outside,
        stored=sorted_distinct(addresses[valid]) if access.kind == "store" else None,
        atomic_lanes=(np.unique(sector[valid], return_counts=True)
                      if access.kind == "atomic" else None),
    )


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values, by sorting (numpy's hashing unique is slower on the small,
    nearly sorted arrays one access makes)."""
    values = np.sort(values)
    keep = np.ones(values.shape, dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _warp_transactions(sector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group lanes 32 at a time; for each distinct sector a group touches (one
    transaction), its id and how many of the group's lanes fall in it. -1 marks a lane
    that moves nothing."""
    pad = (-len(sector)) % WARP
    groups = np.sort(np.concatenate([sector, np.full(pad, -1, np.int64)]).reshape(-1, WARP),
                     axis=1).reshape(-1)
    starts = np.ones(groups.shape, dtype=bool)
    starts[1:] = groups[1:] != groups[:-1]
    starts[::WARP] = True  # a new group starts a new run
    lanes = np.bincount(np.cumsum(starts) - 1)
    ids = groups[starts]
    moved = ids >= 0
    return ids[moved], lanes[moved]


def footprints(launch: Launch) -> list[Footprint]:
    """The launch's accesses as footprints: those recorded without lanes, or computed from
    the lanes once and kept."""
    if launch.accesses and not launch.footprints:
        launch.footprints = [footprint(a, launch.tensors) for a in launch.accesses]
    return launch.footprints
