"""What a traced run did to one tensor, for the checks that grade *how* a kernel works.

A right answer can come from the wrong algorithm: three passes where the exercise teaches
one, a second kernel for an epilogue that should be fused, row-major order where it
teaches grouped. In the interpreter every load and store is traced (``model/trace.py``); these
helpers read the trace for one tensor argument, so a problem's ``trace_check`` can say in
a line what the kernel did.
"""

from __future__ import annotations

import numpy as np
import torch

from ..model.trace_data import Launch


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes from the tensor's first element to just past its last: the view's own
    extent, not its storage's (a guarded input is a view inside a larger buffer, and
    what lies past its end belongs to someone else)."""
    if not tensor.numel():
        return tensor.data_ptr(), tensor.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(),
                                                             strict=True))
    start = tensor.data_ptr() + min(0, last) * tensor.element_size()
    return start, tensor.data_ptr() + (max(0, last) + 1) * tensor.element_size()


def bytes_moved(launches: list[Launch], tensor: torch.Tensor, kind: str) -> int:
    """Bytes the launches loaded from (``kind="load"``) or stored to (``"store"``) the
    memory of ``tensor``, active lanes only."""
    start, end = _span(tensor)
    total = 0
    for launch in launches:
        for access in launch.accesses:
            if (access.kind == "load") == (kind == "load"):
                inside = (access.addresses >= start) & (access.addresses < end) & access.active
                total += int(inside.sum()) * access.element_size
    return total


def widest_load(launches: list[Launch], tensor: torch.Tensor) -> int:
    """The most elements of ``tensor`` one load instruction of one program touched."""
    start, end = _span(tensor)
    widest = 0
    for launch in launches:
        for access in launch.accesses:
            if access.kind == "load":
                inside = (access.addresses >= start) & (access.addresses < end) & access.active
                widest = max(widest, int(inside.sum()))
    return widest


def requested(launches: list[Launch], kind: str = "") -> int:
    """Bytes requested by the launches' loads and stores (``kind`` "load" or "store": only
    those), active lanes only, whatever tensor they fall in."""
    return sum(int(access.active.sum()) * access.element_size
               for launch in launches for access in launch.accesses
               if not kind or (access.kind == "load") == (kind == "load"))


def tiles_in_launch_order(launch: Launch, out: torch.Tensor) -> list[tuple[int, int]]:
    """For each program of ``launch``, in launch order, the (row, column) of the tile of
    the 2-D ``out`` it stored: its first stored element's row and column divided by the
    tile's height and width (read from the stores themselves)."""
    start, end = _span(out)
    corner: dict[int, int] = {}  # program -> lowest address it stored into out
    for access in launch.accesses:
        if access.kind == "load":
            continue
        inside = (access.addresses >= start) & (access.addresses < end) & access.active
        if inside.any():
            low = int(access.addresses[inside].min())
            corner[access.program] = min(low, corner.get(access.program, low))
    stride_m, stride_n = out.stride()
    rows, cols = {}, {}
    for program, address in corner.items():
        element = (address - start) // out.element_size()
        rows[program], cols[program] = element // stride_m, element % stride_m // stride_n
    height, width = _step(rows.values()), _step(cols.values())
    return [(rows[p] // height, cols[p] // width) for p in sorted(corner)]


def _step(starts) -> int:
    """The tile size along one axis: the smallest gap between distinct tile starts."""
    distinct = np.unique(np.fromiter(starts, dtype=np.int64))
    return int(np.diff(distinct).min()) if len(distinct) > 1 else 1


def grouped_order(pid: int, tiles_m: int, tiles_n: int, group: int) -> tuple[int, int]:
    """The tile program ``pid`` takes in grouped order: ``group`` rows of tiles walked
    down before moving one column right, the last group maybe shorter (group 1:
    row-major; group = tiles_m: column-major)."""
    per_group = group * tiles_n
    first_m = pid // per_group * group
    height = min(tiles_m - first_m, group)
    return first_m + pid % per_group % height, pid % per_group // height


def group_of(tiles: list[tuple[int, int]]) -> int | None:
    """The group height whose grouped order the tiles follow, or None if none does."""
    if not tiles:
        return None
    tiles_m = 1 + max(m for m, _ in tiles)
    tiles_n = 1 + max(n for _, n in tiles)
    for group in range(1, tiles_m + 1):
        if all(grouped_order(pid, tiles_m, tiles_n, group) == tile
               for pid, tile in enumerate(tiles)):
            return group
    return None
