"""k-means on the GPU: Lloyd's algorithm, one kernel at a time.

Lloyd's algorithm alternates two steps until the clusters stop changing:

* **assign**: every point takes the label of its nearest centroid;
* **update**: every centroid moves to the mean of the points that carry its label.

The ladder, top to bottom:

1. ``assign_naive``: distances as a GEMM, ‖x‖² − 2x·c + ‖c‖², written to an n × k matrix
   in memory, then an argmin over each row of it. The matrix is the whole cost: at
   n = 2²⁰, k = 1024 it is 4 GiB written and read again, for labels of 8 MiB.
2. ``assign``: the same GEMM tile by tile, with a running argmin kept in registers; the
   n × k matrix never exists. x is read once. Two numerical traps are handled here:
   far from the origin ‖x‖² and 2x·c cancel (so x and c are shifted by one centroid
   first), and an fp32 ``tl.dot`` runs as TF32 on a GPU (so the precision is chosen).
3. ``update_atomic``: every point adds itself to its centroid's sum with an atomic add.
   Simple, and slow when one cluster is huge: its atomics all hit the same addresses.
4. ``update_sorted``: sort the points by label (a counting sort), then sum each run of
   equal labels with a prefix sum: one atomic per run and block instead of one per point.
5. ``kmeans_plus_plus`` and ``fit``: the whole loop, its initialisation, its policy for
   empty clusters and its convergence test.

The kernels take inputs of any strides in fp32, fp16 or bf16, and compute in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# --- 1. the naive assignment: the distance matrix in memory -------------------------------


@triton.jit
def distances_kernel(x_ptr, c_ptr, dist_ptr, n, k, d,
                     stride_xn, stride_xd, stride_ck, stride_cd,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """One BLOCK_N × BLOCK_K tile of D[i, j] = ‖x_i‖² − 2 x_i·c_j + ‖c_j‖², the textbook
    expansion, with tl.dot's default precision."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    dims = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                mask=(rows[:, None] < n) & (dims[None, :] < d), other=0.0).to(tl.float32)
    c = tl.load(c_ptr + cols[:, None] * stride_ck + dims[None, :] * stride_cd,
                mask=(cols[:, None] < k) & (dims[None, :] < d), other=0.0).to(tl.float32)
    x_norm = tl.sum(x * x, axis=1)
    c_norm = tl.sum(c * c, axis=1)
    dist = x_norm[:, None] - 2.0 * tl.dot(x, tl.trans(c)) + c_norm[None, :]
    tl.store(dist_ptr + rows[:, None] * k + cols[None, :], dist,
             mask=(rows[:, None] < n) & (cols[None, :] < k))


@triton.jit
def argmin_rows_kernel(dist_ptr, labels_ptr, n, k, BLOCK_ROWS: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """labels[i] = argmin_j D[i, j], a block of whole rows per program."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_K)
    dist = tl.load(dist_ptr + rows[:, None] * k + cols[None, :],
                   mask=(rows[:, None] < n) & (cols[None, :] < k), other=float("inf"))
    tl.store(labels_ptr + rows, tl.argmin(dist, axis=1).to(tl.int64), mask=rows < n)


def _check_shapes(x: torch.Tensor, c: torch.Tensor) -> tuple[int, int, int]:
    assert x.dim() == 2 and c.dim() == 2 and x.shape[1] == c.shape[1], \
        "need points x (n × d) and centroids c (k × d)"
    n, d = x.shape
    k = c.shape[0]
    assert k >= 1, "need at least one centroid"
    assert 1 <= d <= 256, "a row of x is held whole in registers: d must be at most 256"
    return n, d, k


def distances(x: torch.Tensor, c: torch.Tensor, block: int = 64) -> torch.Tensor:
    """The n × k matrix of squared distances, fp32, by the expansion (no shift)."""
    n, d, k = _check_shapes(x, c)
    dist = torch.empty((n, k), dtype=torch.float32, device=x.device)
    block_d = max(16, triton.next_power_of_2(d))
    distances_kernel[(triton.cdiv(n, block), triton.cdiv(k, block))](
        x, c, dist, n, k, d, *x.stride(), *c.stride(),
        BLOCK_N=block, BLOCK_K=block, BLOCK_D=block_d)
    return dist


def assign_naive(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Labels (int64) through the distance matrix: one kernel writes D, one reads it."""
    n, _, k = _check_shapes(x, c)
    dist = distances(x, c)
    labels = torch.empty(n, dtype=torch.int64, device=x.device)
    block_k = max(16, triton.next_power_of_2(k))
    block_rows = max(1, min(64, 16384 // block_k))
    argmin_rows_kernel[(triton.cdiv(n, block_rows),)](dist, labels, n, k,
                                                      BLOCK_ROWS=block_rows, BLOCK_K=block_k)
    return labels


# --- 2. the fused assignment: a running argmin, no matrix ---------------------------------


@triton.jit
def assign_kernel(x_ptr, c_ptr, labels_ptr, n, k, d,
                  stride_xn, stride_xd, stride_ck, stride_cd,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr):
    """labels[i] = argmin_j ‖x_i − c_j‖² for a block of BLOCK_N points. The block of x is
    loaded once and stays in registers while the program walks the centroids BLOCK_K at
    a time, keeping each point's best distance so far and its label."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < n
    dim_ok = dims < d
    x = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    ### BEGIN SOLUTION
    # Distances do not change when x and c move together: shift both by centroid 0, so
    # that far from the origin the terms below stay as small as the distances themselves.
    shift = tl.load(c_ptr + dims * stride_cd, mask=dim_ok, other=0.0).to(tl.float32)
    x = x - shift[None, :]
    best = tl.full((BLOCK_N,), float("inf"), dtype=tl.float32)
    best_label = tl.zeros((BLOCK_N,), dtype=tl.int64)
    for k0 in range(0, k, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < k
        c = tl.load(c_ptr + cols[:, None] * stride_ck + dims[None, :] * stride_cd,
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
        c = c - shift[None, :]
        ### KEY
        # ‖x − c‖² − ‖x‖²: the argmin over c does not need ‖x‖².
        dist = tl.sum(c * c, axis=1)[None, :] - 2.0 * tl.dot(
            x, tl.trans(c), input_precision=INPUT_PRECISION)
        dist = tl.where(col_ok[None, :], dist, float("inf"))  # padding never wins
        tile_best, tile_label = tl.min(dist, axis=1, return_indices=True)
        better = tile_best < best  # against the best so far, then update both together
        best_label = tl.where(better, k0 + tile_label.to(tl.int64), best_label)
        ### END KEY
        best = tl.where(better, tile_best, best)
    ### END SOLUTION
    tl.store(labels_ptr + rows, best_label, mask=row_ok)


def assign(x: torch.Tensor, c: torch.Tensor, precision: str | None = None,
           block_n: int = 128, block_k: int = 64, num_warps: int = 8,
           num_stages: int = 2) -> torch.Tensor:
    """Labels (int64): the nearest centroid of each point, with the fused kernel.
    ``precision`` is tl.dot's for fp32 tiles on a GPU: "tf32", "tf32x3" or "ieee"."""
    n, d, k = _check_shapes(x, c)
    labels = torch.empty(n, dtype=torch.int64, device=x.device)
    if precision is None:  # the default, and the reason for it
        ### BEGIN SOLUTION
        ### KEY
        # TF32 keeps 10 bits of mantissa: points nearly as close to two centroids get the
        # wrong one. Three TF32 products give fp32's accuracy on the tensor cores.
        precision = "tf32x3"
        ### END KEY
        ### END SOLUTION
    block_d = max(16, triton.next_power_of_2(d))
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    assign_kernel[(triton.cdiv(n, block_n),)](
        x, c, labels, n, k, d, *x.stride(), *c.stride(),
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_D=block_d, INPUT_PRECISION=precision,
        num_warps=num_warps, num_stages=num_stages)
    return labels


# --- 3. the update with atomics ------------------------------------------------------------


@triton.jit
def scatter_add_kernel(x_ptr, labels_ptr, sums_ptr, counts_ptr, n, d, stride_xn, stride_xd,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """sums[label_i] += x_i and counts[label_i] += 1, one atomic per point and feature."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < n
    ok = row_ok[:, None] & (dims[None, :] < d)
    label = tl.load(labels_ptr + rows, mask=row_ok, other=0)
    x = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=ok,
                other=0.0).to(tl.float32)
    tl.atomic_add(sums_ptr + label[:, None] * d + dims[None, :], x, mask=ok, sem="relaxed")
    if tl.program_id(1) == 0:  # count each point once, not once per block of features
        tl.atomic_add(counts_ptr + label, tl.full((BLOCK_N,), 1, tl.int32), mask=row_ok,
                      sem="relaxed")


@triton.jit
def finalize_kernel(sums_ptr, counts_ptr, centroids_ptr, counts_out_ptr, k, d,
                    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """centroids = sums / counts. An empty cluster gets 0 and count 0, never 0 / 0."""
    clusters = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = (clusters[:, None] < k) & (dims[None, :] < d)
    count = tl.load(counts_ptr + clusters, mask=clusters < k, other=0)
    sums = tl.load(sums_ptr + clusters[:, None] * d + dims[None, :], mask=ok, other=0.0)
    mean = sums / tl.maximum(count, 1).to(tl.float32)[:, None]
    tl.store(centroids_ptr + clusters[:, None] * d + dims[None, :], mean, mask=ok)
    if tl.program_id(1) == 0:
        tl.store(counts_out_ptr + clusters, count.to(tl.int64), mask=clusters < k)


def _check_update(x: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[int, int]:
    assert x.dim() == 2 and labels.shape == (x.shape[0],), "need x (n × d) and n labels"
    assert labels.dtype == torch.int64, "labels are int64"
    assert k >= 1, "need at least one cluster"
    return x.shape


def _finalize(sums: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k, d = sums.shape
    centroids = torch.empty((k, d), dtype=torch.float32, device=sums.device)
    counts_out = torch.empty(k, dtype=torch.int64, device=sums.device)
    block_d = min(128, max(16, triton.next_power_of_2(d)))
    finalize_kernel[(triton.cdiv(k, 32), triton.cdiv(d, block_d))](
        sums, counts, centroids, counts_out, k, d, BLOCK_K=32, BLOCK_D=block_d)
    return centroids, counts_out


def update_atomic(x: torch.Tensor, labels: torch.Tensor, k: int, block_n: int = 64
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Centroids (fp32, k × d) and counts (int64): every point adds itself atomically."""
    n, d = _check_update(x, labels, k)
    sums = torch.zeros((k, d), dtype=torch.float32, device=x.device)
    counts = torch.zeros(k, dtype=torch.int32, device=x.device)
    block_d = min(128, max(16, triton.next_power_of_2(d)))
    scatter_add_kernel[(triton.cdiv(n, block_n), triton.cdiv(d, block_d))](
        x, labels, sums, counts, n, d, *x.stride(), BLOCK_N=block_n, BLOCK_D=block_d)
    return _finalize(sums, counts)


# --- 4. the update after a sort by label: segment sums -------------------------------------


@triton.jit
def count_and_rank_kernel(labels_ptr, counts_ptr, rank_ptr, n, BLOCK: tl.constexpr):
    """counts[label] = points with that label; rank[i] = a place for point i among them,
    0 … counts[label] − 1. A block of points sends one atomic per distinct label in it
    (reserving a range for all its points with that label), not one per point."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offsets < n
    label = tl.load(labels_ptr + offsets, mask=valid, other=-1)
    lane = tl.arange(0, BLOCK)
    same = (label[:, None] == label[None, :]) & valid[None, :]  # BLOCK × BLOCK
    before = tl.sum((same & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
    total = tl.sum(same.to(tl.int32), axis=1)
    first = valid & (before == 0)  # the first lane of each distinct label reserves
    base = tl.atomic_add(counts_ptr + label, total, mask=first, sem="relaxed")
    base = tl.where(first, base, 0)
    base = tl.sum(tl.where(same & first[None, :], base[None, :], 0), axis=1)  # shared
    tl.store(rank_ptr + offsets, base + before, mask=valid)


@triton.jit
def offsets_kernel(counts_ptr, offsets_ptr, k, BLOCK: tl.constexpr):
    """offsets = exclusive prefix sum of counts: where each cluster's run starts."""
    carry = 0
    for k0 in range(0, k, BLOCK):
        clusters = k0 + tl.arange(0, BLOCK)
        count = tl.load(counts_ptr + clusters, mask=clusters < k, other=0)
        tl.store(offsets_ptr + clusters, carry + tl.cumsum(count, axis=0) - count,
                 mask=clusters < k)
        carry += tl.sum(count, axis=0)


@triton.jit
def scatter_kernel(labels_ptr, rank_ptr, offsets_ptr, order_ptr, sorted_labels_ptr, n,
                   BLOCK: tl.constexpr):
    """order[offsets[label_i] + rank_i] = i: the points sorted by label (a counting sort),
    and their labels in that order."""
    points = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = points < n
    label = tl.load(labels_ptr + points, mask=valid, other=0)
    position = tl.load(offsets_ptr + label, mask=valid, other=0) + tl.load(
        rank_ptr + points, mask=valid, other=0)
    tl.store(order_ptr + position, points, mask=valid)
    tl.store(sorted_labels_ptr + position, label, mask=valid)


@triton.jit
def segment_sum_kernel(x_ptr, order_ptr, sorted_labels_ptr, sums_ptr, n, d,
                       stride_xn, stride_xd, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """sums[label] += the points of each run of equal labels in BLOCK_N consecutive
    positions of the sorted order: a prefix sum down the block, and one atomic add at each
    end of a run (and one to take away what came before the next run in the block)."""
    positions = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    valid = positions < n
    dim_ok = dims < d
    ### BEGIN SOLUTION
    point = tl.load(order_ptr + positions, mask=valid, other=0).to(tl.int64)
    label = tl.load(sorted_labels_ptr + positions, mask=valid, other=-1)
    has_next = positions + 1 < n
    next_label = tl.load(sorted_labels_ptr + positions + 1, mask=has_next, other=-1)
    rows = tl.load(x_ptr + point[:, None] * stride_xn + dims[None, :] * stride_xd,
                   mask=valid[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    ### KEY
    running = tl.cumsum(rows, axis=0)  # running[i] = rows 0 … i of this block
    ### END KEY
    last_lane = tl.arange(0, BLOCK_N) == BLOCK_N - 1
    run_ends = valid & ((label != next_label) | last_lane)
    ### KEY
    # A run ending at lane e adds running[e]; the run after it, in the same block, starts
    # with running[e] already counted, so it takes running[e] away again.
    tl.atomic_add(sums_ptr + label[:, None] * d + dims[None, :], running,
                  mask=run_ends[:, None] & dim_ok[None, :], sem="relaxed")
    ### END KEY
    next_starts = run_ends & has_next & ~last_lane
    ### KEY
    tl.atomic_add(sums_ptr + next_label[:, None] * d + dims[None, :], -running,
                  mask=next_starts[:, None] & dim_ok[None, :], sem="relaxed")
    ### END KEY
    ### END SOLUTION


RANK_BLOCK = 64  # count_and_rank compares every pair of labels in a block: BLOCK² lanes


def update_sorted(x: torch.Tensor, labels: torch.Tensor, k: int, block_n: int = 64
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Centroids (fp32, k × d) and counts (int64): sort the points by label, then one
    atomic per run of equal labels in a block of the sorted order. An empty cluster's
    centroid is 0 (its count says it is empty: what to do with it is the loop's policy)."""
    n, d = _check_update(x, labels, k)
    dev = x.device
    counts = torch.zeros(k, dtype=torch.int32, device=dev)
    rank = torch.empty(n, dtype=torch.int32, device=dev)
    count_and_rank_kernel[(triton.cdiv(n, RANK_BLOCK),)](labels, counts, rank, n,
                                                         BLOCK=RANK_BLOCK)
    offsets = torch.empty(k, dtype=torch.int32, device=dev)
    offsets_kernel[(1,)](counts, offsets, k, BLOCK=min(1024, triton.next_power_of_2(k)))
    order = torch.empty(n, dtype=torch.int32, device=dev)
    sorted_labels = torch.empty(n, dtype=torch.int64, device=dev)
    scatter_kernel[(triton.cdiv(n, 1024),)](labels, rank, offsets, order, sorted_labels, n,
                                            BLOCK=1024)
    sums = torch.zeros((k, d), dtype=torch.float32, device=dev)
    block_d = min(128, max(16, triton.next_power_of_2(d)))
    segment_sum_kernel[(triton.cdiv(n, block_n), triton.cdiv(d, block_d))](
        x, order, sorted_labels, sums, n, d, *x.stride(), BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=4)
    return _finalize(sums, counts)


# --- 5. the whole loop -----------------------------------------------------------------------

TOL = 1e-4  # converged once an assignment lowers the inertia by at most this fraction
MAX_ITER = 100


def kmeans_plus_plus(x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """k starting centroids (fp32): the first a point drawn uniformly, each next one a
    point drawn with probability proportional to its squared distance to the nearest
    centroid chosen so far (Arthur and Vassilvitskii, 2007)."""
    ### BEGIN SOLUTION
    generator = torch.Generator(device=x.device).manual_seed(seed)
    points = x.float()
    n = points.shape[0]
    chosen = [int(torch.randint(n, (1,), generator=generator, device=x.device))]
    nearest = ((points - points[chosen[0]]) ** 2).sum(dim=1)  # to the nearest chosen
    for _ in range(1, k):
        if not bool((nearest > 0).any()):
            raise ValueError(f"k-means++ needs {k} distinct points; x has fewer")
        ### KEY
        index = int(torch.multinomial(nearest, 1, generator=generator))
        chosen.append(index)
        nearest = torch.minimum(nearest, ((points - points[index]) ** 2).sum(dim=1))
        ### END KEY
    return points[chosen].clone()
    ### END SOLUTION


def fit(x: torch.Tensor, k: int, seed: int, init: torch.Tensor | None = None
        ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """k-means on the points x (n × d): (centroids fp32 k × d, labels int64 n, inertia),
    the inertia being the sum of each point's squared distance to its centroid, the labels
    those of the centroids returned. Starts from ``init`` (k × d) if given, else from
    k-means++ with ``seed``. An empty cluster takes the point farthest from its centroid.
    Stops once an assignment lowers the inertia by at most TOL of it, or after MAX_ITER
    updates."""
    ### BEGIN SOLUTION
    points = x.float()
    centroids = kmeans_plus_plus(x, k, seed) if init is None else init.float().clone()
    previous = float("inf")
    for _ in range(MAX_ITER):
        ### KEY
        labels = assign(x, centroids.to(x.dtype))
        ### END KEY
        distances = ((points - centroids[labels]) ** 2).sum(dim=1)
        inertia = float(distances.sum())
        ### KEY
        if previous - inertia <= TOL * inertia:
            break  # converged: these labels belong to these centroids
        ### END KEY
        previous = inertia
        ### KEY
        centroids, counts = update_sorted(x, labels, k)
        ### END KEY
        empty = torch.nonzero(counts == 0).flatten()
        ### KEY
        if len(empty):  # the policy: each empty cluster takes one of the farthest points
            centroids[empty] = points[torch.topk(distances, len(empty)).indices]
        ### END KEY
    else:  # out of iterations, just after an update: label the points once more
        labels = assign(x, centroids.to(x.dtype))
        inertia = float(((points - centroids[labels]) ** 2).sum())
    return centroids, labels, inertia
    ### END SOLUTION
