"""Lab 06 — k-means. The assignment is a GEMM fused with an argmin, graded on labels (a
label may differ from float64's only where two distances tie within 1e-5); the update is
a segmented reduction, graded on centroids and counts, with a stated policy for empty
clusters; the whole loop is graded on what it converges to."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from ..evidence.compare import compare as compare_tensor
from ..evidence.compare import form_cause, unwritten_cause
from ..problem import DEFAULT_TOLERANCES, EXACT, Case, Cost, Levels, Problem, register
from . import traced

# --- the inputs ------------------------------------------------------------------------------

FAR = "far from the origin: every coordinate offset by 1000"
NEAR_TIES = "near-ties: each point 0.01% to 0.1% closer to one of two centroids"
DUPLICATES = "duplicate points and duplicate centroids"
TRAFFIC = "traced for traffic"
SKEWED = "half of the points in cluster 0"
EMPTY = "a third of the clusters have no points"
OFFSET = 1000.0

# Ties within this relative distance may go either way: float64 and fp32 disagree there.
TIE = 1e-5


def _randn(shape, gen, device) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32, device=device)


def _randint(high: int, shape, gen, device) -> torch.Tensor:
    return torch.randint(high, tuple(shape), generator=gen, device=device)


def _as_case(t: torch.Tensor, case: Case, name: str) -> torch.Tensor:
    """``t`` in the case's dtype; a column-major view if the case transposes ``name``."""
    t = t.to(case.dtype)
    return t.T.contiguous().T if name in case.transposed else t


def _near_ties(n: int, d: int, k: int, gen, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Centroids in close pairs (a, b), and points near the middle of a pair, each closer
    to one of the two by a relative margin of 1e-4 to 1e-3 of the distance: right for any
    fp32 arithmetic, beyond TF32's (a 10-bit mantissa) and half precision's."""
    pairs = max(k // 2, 1)
    a = _randn((pairs, d), gen, device).double() * 3
    b = a + _randn((pairs, d), gen, device).double()
    c = torch.stack([a, b], dim=1).reshape(2 * pairs, d)
    if k > 2 * pairs:  # an odd k: one more centroid, far from every pair
        c = torch.cat([c, 30 + _randn((k - 2 * pairs, d), gen, device).double()])
    pair = _randint(pairs, (n,), gen, device)
    ends_a, ends_b = a[pair], b[pair]
    axis = ends_a - ends_b
    half = axis.norm(dim=1, keepdim=True) / 2
    axis = axis / (2 * half)
    off_axis = 0.3 * _randn((n, d), gen, device).double()
    off_axis -= (off_axis * axis).sum(dim=1, keepdim=True) * axis
    margin = 1e-4 + 9e-4 * torch.rand((n, 1), generator=gen, device=device, dtype=torch.float64)
    sign = torch.where(torch.rand((n, 1), generator=gen, device=device) < 0.5, -1.0, 1.0)
    # d_b² − d_a² = 4·half·t, relative to d_a² ≈ half² + |off_axis|²: t sets the margin.
    t = sign * margin * (half**2 + (off_axis**2).sum(dim=1, keepdim=True)) / (4 * half)
    x = (ends_a + ends_b) / 2 + t * axis + off_axis
    return x.float(), c.float()


def _duplicated(n: int, d: int, k: int, gen, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each point several times over; centroids that sit exactly on points, each twice."""
    distinct = _randn((max(n // 4, 1), d), gen, device)
    x = distinct[_randint(len(distinct), (n,), gen, device)]
    on_points = x[_randint(n, (max(k // 2, 1),), gen, device)]
    c = torch.cat([on_points, on_points])[:k]
    if len(c) < k:
        c = torch.cat([c, _randn((k - len(c), d), gen, device)])
    return x, c


def _assign_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    n, d, k = case.sizes["n"], case.sizes["d"], case.sizes["k"]
    if case.note == NEAR_TIES:
        x, c = _near_ties(n, d, k, gen, device)
    elif case.note == DUPLICATES:
        x, c = _duplicated(n, d, k, gen, device)
    else:
        x, c = _randn((n, d), gen, device), _randn((k, d), gen, device)
    if case.note == FAR:
        x, c = x + OFFSET, c + OFFSET
    return _as_case(x, case, "x"), _as_case(c, case, "c")


def _assign_cost(case: Case) -> Cost:
    n, d, k = case.sizes["n"], case.sizes["d"], case.sizes["k"]
    # fp32 tiles go into tl.dot, whatever the input dtype: the TF32 roof of the tensor cores.
    return Cost(2 * n * k * d, (n * d + k * d) * case.dtype.itemsize + 8 * n, "tf32")


# --- distances in float64, and what a wrong label looks like --------------------------------


def _sq_distances(points: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Squared distances of some points to every centroid, float64, through the expansion
    on data shifted to the centroids' mean (so nothing cancels far from the origin)."""
    shift = c.mean(dim=0)
    xs, cs = points - shift, c - shift
    return ((xs * xs).sum(dim=1, keepdim=True) - 2 * xs @ cs.T
            + (cs * cs).sum(dim=1)[None, :]).clamp_min_(0)


def _chunks(n: int, k: int) -> list[slice]:
    step = max(1, (1 << 25) // max(k, 1))  # about 256 MB of float64 distances at a time
    return [slice(start, min(start + step, n)) for start in range(0, n, step)]


def _direct(x: torch.Tensor, c: torch.Tensor, points: torch.Tensor,
            labels: torch.Tensor) -> torch.Tensor:
    """‖x_i − c_label‖², float64, computed from the differences: exact zeros stay zeros."""
    return ((x[points] - c[labels]) ** 2).sum(dim=1)


def wrong_labels(x: torch.Tensor, c: torch.Tensor, labels: torch.Tensor) -> dict:
    """Points whose label is not (within TIE) a nearest centroid, with what the diagnosis
    needs: their labels, their nearest centroids, the relative gaps, and their rows of
    distances. ``labels`` must be in range."""
    n, k = x.shape[0], c.shape[0]
    best = torch.empty(n, dtype=torch.int64, device=x.device)
    for rows in _chunks(n, k):
        best[rows] = _sq_distances(x[rows], c).argmin(dim=1)
    suspects = torch.nonzero(labels != best).flatten()
    got = _direct(x, c, suspects, labels[suspects])
    nearest = _direct(x, c, suspects, best[suspects])
    wrong = got > nearest * (1 + TIE)
    points = suspects[wrong]
    gap = (got[wrong] - nearest[wrong]) / nearest[wrong].clamp_min(1e-300)
    shown = points[:512]  # enough to see a pattern
    return {"points": points, "labels": labels[points], "best": best[points], "gap": gap,
            "rows": _sq_distances(x[shown], c)}


def _far_from_origin(x: torch.Tensor) -> tuple[bool, float, float]:
    centre = x.mean(dim=0)
    spread = float((x - centre).pow(2).mean().sqrt())
    where = float(centre.abs().mean())
    return where > 30 * max(spread, 1e-30), where, spread


def _suffix_min(rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """For each row: is its label's distance the least among centroids at or after it
    (within TIE: the kernel compared fp32 distances, these are the grader's)?"""
    k = rows.shape[1]
    after = torch.arange(k, device=rows.device)[None, :] >= labels[:, None]
    chosen = rows.gather(1, labels[:, None]).squeeze(1)
    return chosen <= torch.where(after, rows, math.inf).amin(dim=1) * (1 + TIE)


def _prefix_min(rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """For each row: is its label's distance the least among centroids up to it (within
    TIE)?"""
    k = rows.shape[1]
    upto = torch.arange(k, device=rows.device)[None, :] <= labels[:, None]
    chosen = rows.gather(1, labels[:, None]).squeeze(1)
    return chosen <= torch.where(upto, rows, math.inf).amin(dim=1) * (1 + TIE)


def _half_precision(x: torch.Tensor) -> bool:
    """Were the points given in fp16 or bf16? (Every value is exact in one of them.)"""
    return any(bool((x.to(half).double() == x).all()) for half in (torch.float16,
                                                                    torch.bfloat16))


def diagnose_labels(x: torch.Tensor, c: torch.Tensor, found: dict) -> str:
    """The likely cause of wrong labels, in words, only where the evidence points to it;
    else the plain facts."""
    points, labels, best, gap = found["points"], found["labels"], found["best"], found["gap"]
    n, k = x.shape[0], c.shape[0]
    count = len(points)
    i, j, b = int(points[0]), int(labels[0]), int(best[0])
    example = (f"point {i} has label {j} at squared distance "
               f"{float(_direct(x, c, points[:1], labels[:1])[0]):.6g}, but centroid {b} is at "
               f"{float(_direct(x, c, points[:1], best[:1])[0]):.6g}")
    head = f"{count} of {n} points are not labelled with their nearest centroid ({example})"
    far, where, spread = _far_from_origin(x)
    if far:
        size = where**2 * x.shape[1]
        return (f"{head}. The data sit far from the origin (coordinates ≈ {where:.3g}, spread "
                f"≈ {spread:.2g}): ‖x‖², 2x·c and ‖c‖² are ≈ {size:.1e} while the distances "
                f"that decide the label are ≈ {2 * spread**2 * x.shape[1]:.2g}, so fp32 loses "
                "them to cancellation. Distances do not change when x and c move together: "
                "subtract one vector (centroid 0, say) from both before the dot product")
    rows = found["rows"]
    chosen, nearest = labels[:len(rows)], best[:len(rows)]
    for tile in (256, 128, 64, 32, 16):  # the widest tile that explains them
        if tile < k and bool((chosen < tile).all()) and bool((nearest % tile == chosen).all()):
            return (f"{head}: every wrong label is the nearest centroid's index modulo {tile}. "
                    f"The argmin of a tile is an index within the tile: add the index of the "
                    "tile's first centroid (k0) before keeping it")
    if float(gap.max()) < 3e-3:
        if not _half_precision(x):
            return (f"{head}: every wrong label is a near-tie, within {float(gap.max()):.1e} "
                    "of the nearest. That is the error of TF32: on a GPU an fp32 tl.dot "
                    "rounds its inputs to 10 mantissa bits unless told otherwise. Pass "
                    "input_precision=\"tf32x3\" (three TF32 products, fp32's accuracy) or "
                    "\"ieee\" to tl.dot")
        return (f"{head}: every wrong label is a near-tie, within {float(gap.max()):.1e} of "
                "the nearest: distances computed in half precision (a 10- or 7-bit "
                "mantissa). Convert the tiles to fp32 before any arithmetic on them")
    if bool((nearest < chosen).all()) and bool(_suffix_min(rows, chosen).all()):
        return (f"{head}: each wrong label is the nearest among the centroids after it, never "
                "compared with the better one before it. A stale running min: a later tile's "
                "minimum replaced the label without beating the best distance so far. Compare "
                "each tile's minimum with the running best, and update the best distance and "
                "the label together, from that one comparison")
    if bool((nearest > chosen).all()) and bool(_prefix_min(rows, chosen).all()):
        return (f"{head}: the labels never move past the first centroids they see, though a "
                "later tile holds a nearer one. The running min is updated before it is "
                "compared with (so no tile ever looks better), or never compared at all: "
                "compare the tile's minimum with the best so far first, then update both")
    return head


def compare_labels(output: object, reference: tuple) -> str:
    """kmeans/assign: int64 labels, each a nearest centroid within TIE."""
    x, c = reference
    n, k = x.shape[0], c.shape[0]
    wrong = form_cause(output, shape=(n,), dtype=torch.int64, device=x.device, name="labels") \
        or unwritten_cause(output, "labels")
    if wrong:
        return wrong
    labels = output.to(x.device)
    outside = (labels < 0) | (labels >= k)
    if bool(outside.any()):
        first = int(torch.nonzero(outside)[0])
        return (f"{int(outside.sum())} labels out of range 0 … {k - 1}, first label[{first}] = "
                f"{int(labels[first])}: the padding past the last centroid (k is rarely a "
                "multiple of the tile) must never win; give it distance +inf")
    found = wrong_labels(x, c, labels)
    if not len(found["points"]):
        return ""
    return diagnose_labels(x, c, found)


def _assign_reference(x: torch.Tensor, c: torch.Tensor) -> tuple:
    return x, c


# --- how the labels were computed (from the interpreter's trace) ------------------------------


def assign_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """kmeans/assign, from the trace: nothing of size n × k is written, x is read at most
    twice, the distances come from tl.dot (2nkd FLOPs within 5% on the traced case), and
    fp32 tiles are not multiplied as TF32."""
    x, c = inputs
    n, d = x.shape
    k = c.shape[0]
    labels_bytes = 8 * n
    stored = traced.requested(launches, "store")
    if stored > 2 * labels_bytes + 4096:
        matrix = " the size of an n × k matrix of fp32 distances" if stored >= 4 * n * k else ""
        return (f"writes {stored:,} bytes for {labels_bytes:,} bytes of labels, "
                f"{stored / labels_bytes:.0f}× as much:{matrix}. Keep each tile of distances "
                "in registers and fold it into a running min and argmin per point: only the "
                "labels need to reach memory")
    x_bytes = n * d * x.element_size()
    loaded = traced.bytes_moved(launches, x, "load")
    if loaded > 2 * x_bytes:
        return (f"reads x {loaded / x_bytes:.1f} times: load a block of points once, before "
                "the loop over the centroids, and keep it in registers while the loop runs")
    dots = [dot for launch in launches for dot in launch.dots]
    flops = sum(2 * dot.m * dot.n * dot.k for dot in dots if not dot.constant_operand)
    need = 2 * n * k * d
    if case.note == TRAFFIC and flops < 0.95 * need:
        return (f"its tl.dot calls do {flops / need:.0%} of the 2nkd = {need:,} FLOPs of the "
                "distances: compute x·c for a tile of points and a tile of centroids with "
                "tl.dot, on the tensor cores, not elementwise")
    if case.note == TRAFFIC and flops > 1.05 * need:
        return (f"its tl.dot calls do {flops / need:.2f}× the 2nkd = {need:,} FLOPs of the "
                f"distances (n = {n}, k = {k}, d = {d}): tiles much wider than the data, or "
                "each product computed more than once")
    return tf32_dots(launches, "and points nearly as close to two centroids get the wrong "
                               "one")


def assign_host_writes(case: Case, inputs: tuple, writes: list) -> str:
    """kmeans/assign, from what the host code wrote: no n × k matrix there either (a copy
    of an expanded view is one, built without a kernel). Copies of x or c, the labels, and
    anything smaller than n × k may be written."""
    x, c = inputs
    (n, d), k = x.shape, c.shape[0]
    allowed = {(n,), (n, d), (d, n), (k, d), (d, k)}
    for op, size, shape in writes:
        if math.prod(shape) >= n * k and tuple(shape) not in allowed:
            return (f"its host code writes a tensor of shape {tuple(shape)} ({size:,} bytes, "
                    f"aten.{op}): as large as the n × k matrix of distances (n = {n}, k = "
                    f"{k}) the fused kernel exists to avoid. Compute each tile of distances "
                    "in the kernel, and keep it in registers")
    return ""


def tf32_dots(launches: list, consequence: str) -> str:
    """From the trace: fp32 tiles multiplied as TF32 (tl.dot's default precision), which
    the interpreter computes in fp32, so the answer passed here; "" if none were. Says
    ``consequence``: what TF32 does to this exercise's answer on a GPU."""
    if not any(dot.operand == "fp32" and dot.input_precision == "tf32"
               for launch in launches for dot in launch.dots):
        return ""
    return ("fp32 tiles go into tl.dot with input_precision \"tf32\" (the default): on a "
            f"GPU that rounds them to TF32's 10 mantissa bits, {consequence} (the "
            "interpreter computes in fp32, so this case passed here). Pass "
            "input_precision=\"tf32x3\" or \"ieee\"")


ASSIGN_SIGNATURE = "(x: Tensor[n, d], c: Tensor[k, d]) -> Tensor[n] int64  # nearest centroid"

register(Problem(
    id="kmeans/assign", title="Fused assignment: distances by tl.dot, a running argmin, no "
                              "n × k matrix",
    signature=ASSIGN_SIGNATURE,
    make_inputs=_assign_inputs, reference=_assign_reference, cost=_assign_cost,
    solution="rooflab.kernels.kmeans:assign",
    cpu_cases=[
        Case({"n": 300, "d": 37, "k": 20}, torch.float32, note="d not a multiple of the tile"),
        Case({"n": 200, "d": 16, "k": 1}, torch.float32, note="k = 1"),
        Case({"n": 50, "d": 8, "k": 100}, torch.float32, note="k > n"),
        Case({"n": 256, "d": 24, "k": 40}, torch.float32, note=DUPLICATES),
        Case({"n": 500, "d": 64, "k": 40}, torch.float16),
        Case({"n": 240, "d": 20, "k": 30}, torch.float32, transposed=("x", "c")),
        Case({"n": 1000, "d": 32, "k": 64}, torch.float32, note=FAR),
        Case({"n": 600, "d": 32, "k": 32}, torch.float32, note=NEAR_TIES),
        # n, d, k from the anchors for grading traffic, k wide enough for several tiles.
        Case({"n": 4096, "d": 32, "k": 256}, torch.float32, note=TRAFFIC),
        Case({"n": 300, "d": 40, "k": 50}, torch.bfloat16),
    ],
    gpu_cases=[
        # 100 000 random points: enough near-ties that TF32 distances mislabel some.
        Case({"n": 100_003, "d": 100, "k": 300}, torch.float32, note="ragged"),
        Case({"n": 20_000, "d": 64, "k": 64}, torch.float32, note=NEAR_TIES),
        Case({"n": 65_536, "d": 64, "k": 256}, torch.float32, note=FAR),
        Case({"n": 65_536, "d": 128, "k": 512}, torch.bfloat16),
        Case({"n": 65_536, "d": 96, "k": 200}, torch.float16, transposed=("x",)),
        Case({"n": 5_000, "d": 32, "k": 1}, torch.float32, note="k = 1"),
        Case({"n": 1_000, "d": 48, "k": 3_000}, torch.float32, transposed=("c",),
             note="k > n"),
        Case({"n": 8_192, "d": 64, "k": 256}, torch.float32, note=DUPLICATES),
        Case({"n": 1 << 20, "d": 128, "k": 1024}, torch.float32, note="timed against torch",
             timed=True),
    ],
    # Not measured yet: no GPU was at hand when these bars were set. The solution runs
    # three TF32 products (tf32x3), a third of the TF32 roof at best, under an argmin
    # epilogue; the pass bar, 4% of the TF32 roof (14 ms at n = 2²⁰, d = 128, k = 1024 on
    # an H100), and matching torch's cdist + argmin are set low on purpose, until a GPU
    # run says how far above them the solution lands.
    levels=Levels(passing=0.04, good=0.1, excellent=0.2),
    baseline=lambda x, c: torch.cdist(x, c).argmin(dim=1),
    baseline_name="torch.cdist + argmin", at_least_vs_baseline=1.0,
    compare=compare_labels, trace_check=assign_structure, host_check=assign_host_writes,
    hints=("Load the block of points once, before the loop; walk the centroids BLOCK_K at a "
           "time: ‖x − c‖² − ‖x‖² = ‖c‖² − 2x·c for a whole tile comes from one tl.dot, and "
           "each point keeps its best distance so far and its label.",
           "Shift x and c by centroid 0 first (distances do not change), so nothing cancels "
           "far from the origin. Padding centroids (past k) get +inf. tl.min(dist, axis=1, "
           "return_indices=True) gives a tile's best and its index within the tile: add k0, "
           "and update best and label from the same comparison. Choose input_precision: "
           "the default, TF32, mislabels near-ties."),
    answer_in=("assign_kernel", "assign"),
))


# --- the update ---------------------------------------------------------------------------


def _update_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    n, d, k = case.sizes["n"], case.sizes["d"], case.sizes["k"]
    if case.note == DUPLICATES:
        x, _ = _duplicated(n, d, k, gen, device)
    else:
        x = _randn((n, d), gen, device)
    if case.note == FAR:
        x = x + OFFSET
    labels = _randint(k, (n,), gen, device)
    if case.note == EMPTY:  # clusters 1, 4, 7, … are never used
        labels = torch.where(labels % 3 == 1, labels - 1, labels)
    if case.note == SKEWED:
        labels = torch.where(torch.rand(n, generator=gen, device=device) < 0.5, 0, labels)
    return _as_case(x, case, "x"), labels, k


def _update_reference(x: torch.Tensor, labels: torch.Tensor, k: int) -> tuple:
    counts = torch.bincount(labels, minlength=k)
    sums = torch.zeros((k, x.shape[1]), dtype=x.dtype, device=x.device)
    sums.index_add_(0, labels, x)
    return sums / counts.clamp_min(1)[:, None], counts


def _update_cost(case: Case) -> Cost:
    n, d, k = case.sizes["n"], case.sizes["d"], case.sizes["k"]
    # x and the labels read once, the centroids and counts written once; an add per element.
    return Cost(n * d + k * d, n * d * case.dtype.itemsize + 8 * n + 4 * k * d + 8 * k)


EMPTY_POLICY = ("an empty cluster's centroid is 0, with count 0 (the update reports it; the "
                "loop decides what to do with it)")


def compare_update(output: object, reference: tuple) -> str:
    """kmeans/update: (centroids fp32 k × d, counts int64 k); empty clusters 0."""
    want_c, want_n = reference
    k, d = want_c.shape
    if not isinstance(output, (tuple, list)) or len(output) != 2 or not all(
            isinstance(t, torch.Tensor) for t in output):
        return "return (centroids, counts): a tensor k × d and a tensor of k counts"
    centroids, counts = output
    cause = compare_tensor(counts, want_n, dtype=torch.int64, device=want_n.device,
                           tolerance=EXACT, name="counts").cause
    if cause:
        return cause + ": each point counts once, in the cluster of its label"
    if centroids.dtype == torch.float32 and tuple(centroids.shape) == (k, d):
        nan_rows = torch.isnan(centroids.double()).any(dim=1).to(want_n.device)
        empty = want_n == 0
        if bool(nan_rows.any()) and bool((nan_rows <= empty).all()):
            j = int(torch.nonzero(nan_rows)[0])
            return (f"centroid {j} is NaN, and cluster {j} has no points: 0 / 0. The policy "
                    f"here: {EMPTY_POLICY}")
    result = compare_tensor(centroids, want_c, dtype=torch.float32, device=want_c.device,
                            tolerance=DEFAULT_TOLERANCES["fp32"], name="centroids")
    return result.cause


def hottest_address(launches: list) -> int:
    """The most atomic updates any one address received."""
    addresses = [access.addresses[access.active] for launch in launches
                 for access in launch.accesses if access.kind == "atomic"]
    if not addresses:
        return 0
    _, counts = np.unique(np.concatenate(addresses), return_counts=True)
    return int(counts.max())


def update_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """kmeans/update, from the trace: x is read at most twice, with half of the points
    in one cluster no address takes an atomic per point (the contention that serialises
    them on a GPU), and sums made by tl.dot (a one-hot matrix times x) are not TF32's."""
    x, labels, k = inputs
    n, d = x.shape
    x_bytes = n * d * x.element_size()
    loaded = traced.bytes_moved(launches, x, "load")
    if loaded > 2 * x_bytes:
        return f"reads x {loaded / x_bytes:.1f} times: once is enough"
    hottest = hottest_address(launches)
    if case.note == SKEWED and hottest > max(64, n // 8):
        return (f"half of the {n} points are in cluster 0, and one address took {hottest} "
                "atomic adds, about one per point of that cluster: on a GPU they queue up "
                "behind each other (contention). Sort the points by label, then add each run "
                "of equal labels up first: one atomic per run and block")
    return tf32_dots(launches, "each point is off by up to 5e-4 of itself, and the sums by "
                               "far more than the 1e-5 the centroids are graded to")


UPDATE_SIGNATURE = ("(x: Tensor[n, d], labels: Tensor[n] int64, k: int) -> (centroids: "
                    "Tensor[k, d] fp32, counts: Tensor[k] int64)  # empty cluster: 0")
UPDATE_CPU_CASES = [
    Case({"n": 300, "d": 37, "k": 20}, torch.float32, note="d not a multiple of the tile"),
    Case({"n": 200, "d": 16, "k": 1}, torch.float32, note="k = 1"),
    Case({"n": 50, "d": 8, "k": 100}, torch.float32, note="k > n"),
    Case({"n": 400, "d": 24, "k": 30}, torch.float32, note=EMPTY),
    Case({"n": 256, "d": 20, "k": 16}, torch.float32, note=DUPLICATES),
    Case({"n": 500, "d": 64, "k": 40}, torch.float16),
    Case({"n": 300, "d": 32, "k": 25}, torch.float32, note=FAR),
    Case({"n": 240, "d": 20, "k": 12}, torch.float32, transposed=("x",)),
    Case({"n": 4096, "d": 32, "k": 64}, torch.float32, note=SKEWED),
    Case({"n": 300, "d": 40, "k": 50}, torch.bfloat16),
]
TIMED_SKEWED = Case({"n": 1 << 22, "d": 64, "k": 256}, torch.float32, note=SKEWED, timed=True)


def _update_problem(id: str, title: str, **fields) -> Problem:
    return register(Problem(
        id=id, title=title, signature=UPDATE_SIGNATURE, make_inputs=_update_inputs,
        reference=_update_reference, cost=_update_cost, compare=compare_update,
        **fields))


_update_problem(
    "kmeans/update_atomic", "The update with atomics, in CUDA C: one atomicAdd per point "
                            "and feature",
    solution="rooflab.kernels.kmeans_cuda:update_cuda", kernel="cupy",
    # Never run on a CPU (the CUDA C is compile-checked there); listed for `rooflab list`.
    cpu_cases=[Case({"n": 300, "d": 37, "k": 20}, torch.float32)],
    gpu_cases=[
        Case({"n": 100_003, "d": 100, "k": 300}, torch.float32, note="ragged"),
        Case({"n": 1_000, "d": 64, "k": 3_000}, torch.float32, note="k > n"),
        Case({"n": 65_536, "d": 64, "k": 256}, torch.float32, note=EMPTY),
        Case({"n": 65_536, "d": 48, "k": 100}, torch.float32, transposed=("x",)),
        TIMED_SKEWED,
    ],
    # The starting point: timed to be compared (and to show contention), not held to a speed.
    levels=Levels(passing=0.0, good=0.3, excellent=0.6),
    hints=("One thread per element of x: thread i handles row i / d, feature i % d. Two "
           "threads with the same label add to the same sum: a plain += loses one of them.",
           "atomicAdd(&sums[label * d + col], value) adds safely; count each point once, "
           "from the thread of its first feature (col == 0)."),
    answer_in=("SCATTER_ADD",),
)

_update_problem(
    "kmeans/update", "The update after a sort by label: segment sums, one atomic per run",
    solution="rooflab.kernels.kmeans:update_sorted",
    cpu_cases=UPDATE_CPU_CASES,
    gpu_cases=[
        Case({"n": 100_003, "d": 100, "k": 300}, torch.float32, note="ragged"),
        Case({"n": 65_536, "d": 64, "k": 1}, torch.float32, note="k = 1"),
        Case({"n": 1_000, "d": 64, "k": 3_000}, torch.float32, note="k > n"),
        Case({"n": 65_536, "d": 64, "k": 256}, torch.float32, note=EMPTY),
        Case({"n": 65_536, "d": 64, "k": 256}, torch.float32, note=DUPLICATES),
        Case({"n": 65_536, "d": 128, "k": 512}, torch.float16),
        Case({"n": 65_536, "d": 128, "k": 512}, torch.bfloat16),
        Case({"n": 65_536, "d": 64, "k": 256}, torch.float32, note=FAR),
        Case({"n": 65_536, "d": 48, "k": 100}, torch.float32, transposed=("x",)),
        TIMED_SKEWED,
    ],
    # Not measured yet (no GPU at hand): the sorted update reads x once, gathered by rows,
    # plus a few passes over n labels and indices, about 1.3× the compulsory bytes. The
    # pass bar, 10% of the memory roof on half of the points in one cluster, is set low on
    # purpose; one atomic per point and feature there is expected far below it.
    levels=Levels(passing=0.1, good=0.3, excellent=0.5),
    trace_check=update_structure,
    hints=("After the sort, each cluster's points are one run of consecutive positions. A "
           "block of BLOCK_N positions holds a few runs: add each run up in registers and "
           "send one atomic add per run, not one per point.",
           "tl.cumsum(rows, axis=0) gives running sums down the block. A run that ends at "
           "lane e (its label differs from the next, or e is the last lane) adds running[e] "
           "to its label's sum; the run that starts at e + 1 in the same block subtracts "
           "running[e] from its own."),
    answer_in=("segment_sum_kernel",),
)


# --- the whole loop -----------------------------------------------------------------------

BLOBS = "well-separated groups of points"
FAR_BLOBS = "groups far from the origin: every coordinate offset by 10 000"
DUPLICATE_BLOBS = "every point four times"
EMPTY_START = ("init given, one centroid far from every point: its cluster starts empty; "
               "groups offset by 10 000")
LOCAL_START = ("init given, two centroids in one group (of two halves) and none in another: "
               "Lloyd's algorithm keeps them there, a worse clustering than k-means++ finds")
ONE = "k = 1"


def _blobs(n: int, d: int, k: int, gen, device) -> tuple[torch.Tensor, torch.Tensor]:
    """k groups of n / k points, spread 1 around centres about 1000 · √(2d) apart: so far
    apart that a start with one centroid in each group finds the best clustering (and
    k-means++ picks one in each, but for a chance of about 1e-5). The points, and the
    group of each."""
    centres = _randn((k, d), gen, device) * 1000
    group = torch.arange(n, device=device) % k
    group = group[torch.randperm(n, generator=gen, device=device)]
    return centres[group] + _randn((n, d), gen, device), group


def _fit_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    n, d, k = case.sizes["n"], case.sizes["d"], case.sizes["k"]
    seed = int(torch.randint(1 << 30, (1,), generator=gen, device=device))
    init = None
    if case.note == DUPLICATE_BLOBS:
        x, group = _blobs(n // 4, d, k, gen, device)
        x = x.repeat(4, 1)[torch.randperm(n, generator=gen, device=device)]
    else:
        x, group = _blobs(n, d, k, gen, device)
    if case.note in (FAR_BLOBS, EMPTY_START):
        # Far from the origin, too, for the empty start: a centroid of 0 left in place of
        # an empty cluster must not win a group by chance.
        x = x + 10 * OFFSET
    if case.note == EMPTY_START:
        # One point from each group but the last, and a centroid 10⁶ away from every point:
        # the last group joins a covered one, the far centroid gets no point, and only the
        # policy for empty clusters gives the last group a centroid of its own.
        firsts = [x[torch.nonzero(group == g)[0, 0]] for g in range(k - 1)]
        init = torch.stack([*firsts, x.mean(dim=0) + 1e6])
    if case.note == LOCAL_START:
        x, init = _local_start(x, group, k)
    return _as_case(x, case, "x"), k, seed, init


def _local_start(x: torch.Tensor, group: torch.Tensor, k: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Points, and a start from which Lloyd's algorithm stays in a local optimum. The
    group farthest from the last one is cut in two halves 100 apart, and gets two
    centroids, one in each half; the last group gets none; every other group one. The
    last group joins the group nearest to it, whose centroid settles between the two;
    the halves keep their centroids: nothing moves one to the last group. Every point
    stays far from any boundary between two centroids (fp32 labels it as float64 does),
    and a start with one centroid in each group, as k-means++ almost always picks, ends
    with an inertia thousands of times lower."""
    means = torch.stack([x[group == g].mean(dim=0) for g in range(k)])
    cut = int(((means[:-1] - means[-1]) ** 2).sum(dim=1).argmax())
    members = torch.nonzero(group == cut).flatten()
    halves = (members[: len(members) // 2], members[len(members) // 2:])
    x = x.clone()
    x[halves[0], 0] += 50
    x[halves[1], 0] -= 50
    firsts = [torch.nonzero(group == g)[0, 0] for g in range(k - 1) if g != cut]
    return x, x[torch.stack([*firsts, halves[0][0], halves[1][0]])].clone()


def _farthest_first(x: torch.Tensor, k: int) -> torch.Tensor:
    """k points: point 0, then each time the point farthest from those chosen. On
    well-separated groups it takes one point from each."""
    chosen = [0]
    nearest = ((x - x[0]) ** 2).sum(dim=1)
    while len(chosen) < k:
        chosen.append(int(nearest.argmax()))
        nearest = torch.minimum(nearest, ((x - x[chosen[-1]]) ** 2).sum(dim=1))
    return x[chosen].clone()


def lloyd(x: torch.Tensor, k: int, init: torch.Tensor, tol: float = 1e-4,
          max_iter: int = 100) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Lloyd's algorithm in float64 with the lab's policies: an empty cluster takes the
    point farthest from its centroid; stop once an assignment lowers the inertia by at
    most ``tol`` of it. Returns (centroids, labels, inertia), labels of those centroids."""
    centroids = init.clone()
    last = math.inf
    for _ in range(max_iter):
        distances, labels = _nearest(x, centroids)
        total = float(distances.sum())
        if last - total <= tol * total:
            return centroids, labels, total
        last = total
        centroids, counts = _update_reference(x, labels, k)
        starved = (counts == 0).nonzero().flatten()
        if starved.numel():
            centroids[starved] = x[distances.topk(starved.numel()).indices]
    distances, labels = _nearest(x, centroids)
    return centroids, labels, float(distances.sum())


def _nearest(x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each point's squared distance to its nearest centroid, and that centroid."""
    n = x.shape[0]
    distances = torch.empty(n, dtype=x.dtype, device=x.device)
    labels = torch.empty(n, dtype=torch.int64, device=x.device)
    for rows in _chunks(n, c.shape[0]):
        distances[rows], labels[rows] = _sq_distances(x[rows], c).min(dim=1)
    distances = _direct(x, c, torch.arange(n, device=x.device), labels)
    return distances, labels


def _fit_reference(x: torch.Tensor, k: int, seed: int, init: torch.Tensor | None) -> dict:
    start = _farthest_first(x, k) if init is None else init
    centroids, labels, inertia = lloyd(x, k, start)
    return {"x": x, "k": k, "init": init, "inertia": inertia}


def _real(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    return None


def compare_fit(output: object, reference: dict) -> str:
    """kmeans/fit: consistent (labels nearest to the centroids, the inertia theirs),
    no empty cluster, converged, and as good as float64 Lloyd from the same start (the
    best clustering, when the start is k-means++ on well-separated groups)."""
    x, k, init, best = reference["x"], reference["k"], reference["init"], reference["inertia"]
    n, d = x.shape
    if not isinstance(output, (tuple, list)) or len(output) != 3:
        return "return (centroids, labels, inertia)"
    centroids, labels, inertia = output
    if not isinstance(centroids, torch.Tensor) or tuple(centroids.shape) != (k, d) \
            or centroids.dtype != torch.float32:
        return f"centroids: expected an fp32 tensor of shape ({k}, {d})"
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != (n,) \
            or labels.dtype != torch.int64:
        return f"labels: expected an int64 tensor of shape ({n},)"
    value = _real(inertia)
    if value is None or not math.isfinite(value):
        return f"inertia: got {inertia!r}, expected a finite number"
    c = centroids.detach().to(x.device, torch.float64)
    labels = labels.detach().to(x.device)
    if not bool(torch.isfinite(c).all()):
        j = int(torch.nonzero(~torch.isfinite(c).all(dim=1))[0])
        return (f"centroid {j} is not finite: an empty cluster divided by its count of 0? "
                "The policy: an empty cluster takes the point farthest from its centroid")
    if bool(((labels < 0) | (labels >= k)).any()):
        return f"labels out of range 0 … {k - 1}"
    counts = torch.bincount(labels, minlength=k)
    if bool((counts == 0).any()):
        j = int(torch.nonzero(counts == 0)[0])
        return (f"cluster {j} has no points at the end: an empty cluster must not stay empty. "
                "The policy: an empty cluster takes the point farthest from its centroid "
                "(in the assignment that left it empty), then the loop goes on")
    # The centroids first: converged, and as good as the reference's; then the labels and
    # the inertia returned with them.
    nearest, closest = _nearest(x, c)
    reached = float(nearest.sum())
    step, step_counts = _update_reference(x, closest, k)
    step[step_counts == 0] = c[step_counts == 0]
    after, _ = _nearest(x, step)
    if float(after.sum()) < reached * (1 - 1e-3):
        return (f"not converged: one more assignment and update lower the inertia from "
                f"{reached:.6g} to {float(after.sum()):.6g}. Loop until an assignment lowers "
                "it by at most TOL of it")
    if init is not None and reached < best * (1 - 1e-3):
        return (f"inertia {reached:.6g}, below the {best:.6g} that Lloyd's algorithm reaches "
                "from the given init (with this lab's policy for empty clusters): a "
                "clustering that started elsewhere. Start from init when one is given; "
                "k-means++ is for init=None")
    if reached > best * (1 + 1e-3):
        if init is None:
            return (f"inertia {reached:.6g}, {reached / best:.3g}× the best clustering's "
                    f"({best:.6g}): the start put two centroids in one group of points and "
                    "none in another, and Lloyd's algorithm cannot move them apart. k-means++ "
                    "draws each next centroid with probability proportional to its squared "
                    "distance to the nearest chosen so far")
        return (f"inertia {reached:.6g}, where Lloyd's algorithm from the given init, with "
                f"this lab's policy for empty clusters, reaches {best:.6g}")
    found = wrong_labels(x, c, labels)
    if len(found["points"]):
        return ("the labels are not those of the centroids returned: "
                + diagnose_labels(x, c, found)
                + ". Return the labels of the last assignment, made with the centroids "
                "returned")
    own = float(_direct(x, c, torch.arange(n, device=x.device), labels).sum())
    if abs(value - own) > 1e-4 * own:
        large = float((x * x).sum(dim=1).mean()) > 1e3 * own / n  # ‖x‖² ≫ the distances
        far = (": ‖x‖² − 2x·c + ‖c‖² in fp32 cancels where the points are this large next to "
               "their distances; sum ‖x − c‖² from the differences") if large else ""
        return (f"inertia {value:.6g}, but the centroids and labels returned give "
                f"{own:.6g}: the sum of each point's squared distance to its centroid{far}")
    return ""


register(Problem(
    id="kmeans/fit", title="The whole loop: k-means++, empty clusters, convergence",
    signature=("(x: Tensor[n, d], k: int, seed: int, init: Tensor[k, d] | None) -> "
               "(centroids: Tensor[k, d] fp32, labels: Tensor[n] int64, inertia: float)"),
    make_inputs=_fit_inputs, reference=_fit_reference,
    cost=lambda case: _assign_cost(case),
    solution="rooflab.kernels.kmeans:fit",
    # The loop around the kernels, graded on what it converges to; its kernels are graded
    # (and timed) by kmeans/assign and kmeans/update.
    kernel=None, timed=False, compare=compare_fit,
    # Each iteration is six interpreted launches: a few dozen points a group is enough.
    cpu_cases=[
        Case({"n": 320, "d": 16, "k": 8}, torch.float32, note=BLOBS),
        Case({"n": 240, "d": 12, "k": 6}, torch.float16, note=BLOBS),
        Case({"n": 300, "d": 10, "k": 10}, torch.float32, note=FAR_BLOBS, transposed=("x",)),
        Case({"n": 256, "d": 8, "k": 8}, torch.float32, note=DUPLICATE_BLOBS),
        Case({"n": 200, "d": 8, "k": 4}, torch.float32, note=EMPTY_START),
        Case({"n": 150, "d": 8, "k": 5}, torch.float32, note=LOCAL_START),
        Case({"n": 150, "d": 10, "k": 1}, torch.float32, note=ONE),
        Case({"n": 300, "d": 16, "k": 6}, torch.bfloat16, note=BLOBS),
    ],
    gpu_cases=[
        Case({"n": 65_536, "d": 32, "k": 32}, torch.float32, note=BLOBS),
        Case({"n": 65_536, "d": 64, "k": 16}, torch.float16, note=BLOBS),
        Case({"n": 65_536, "d": 64, "k": 16}, torch.bfloat16, note=BLOBS),
        Case({"n": 20_000, "d": 24, "k": 12}, torch.float32, note=FAR_BLOBS,
             transposed=("x",)),
        Case({"n": 16_384, "d": 32, "k": 16}, torch.float32, note=DUPLICATE_BLOBS),
        Case({"n": 20_000, "d": 16, "k": 8}, torch.float32, note=EMPTY_START),
        Case({"n": 20_000, "d": 16, "k": 8}, torch.float32, note=LOCAL_START),
        Case({"n": 5_000, "d": 16, "k": 1}, torch.float32, note=ONE),
    ],
    hints=("k-means++: the first centroid is a point drawn uniformly; each next one a point "
           "drawn with probability proportional to its squared distance to the nearest "
           "centroid so far (torch.multinomial). Then alternate assign and update.",
           "Keep the inertia of each assignment; stop when it fell by at most TOL of itself. "
           "After an update, a cluster with count 0 takes the point farthest from its "
           "centroid (torch.topk of the distances). Return the labels of the centroids "
           "you return."),
    answer_in=("kmeans_plus_plus", "fit"),
))
