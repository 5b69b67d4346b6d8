"""Lab 06, what no case tested before: an update whose sums come from a one-hot tl.dot in
TF32 (right in the interpreter, which computes in fp32; off by far more than the tolerance
on a GPU), and a loop that ignores the init it is given."""

import mutants
import pytest
import torch
import triton
import triton.language as tl
from mutants import grade

from rooflab.autograder import get_problem
from rooflab.autograder.problems import kmeans as problems
from rooflab.kernels import kmeans as km

# --- the update as a matrix product: a one-hot matrix times the points ------------------


@triton.jit
def one_hot_sums_kernel(x_ptr, labels_ptr, sums_ptr, counts_ptr, n, d, k, stride_xn,
                        stride_xd, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """sums[c] += Σ x_i over the block's points labelled c, for a block of BLOCK_K
    clusters: onehot[c, i] = (label_i == c), and onehot @ x on the tensor cores."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    clusters = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    dims = tl.arange(0, BLOCK_D)
    label = tl.load(labels_ptr + rows, mask=rows < n, other=-1)
    one_hot = (clusters[:, None] == label[None, :]).to(tl.float32)
    x = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                mask=(rows[:, None] < n) & (dims[None, :] < d), other=0.0).to(tl.float32)
    part = tl.dot(one_hot, x, input_precision=PRECISION)
    ok = clusters < k
    tl.atomic_add(sums_ptr + clusters[:, None] * d + dims[None, :], part,
                  mask=ok[:, None] & (dims[None, :] < d), sem="relaxed")
    tl.atomic_add(counts_ptr + clusters, tl.sum(one_hot, axis=1).to(tl.int32), mask=ok,
                  sem="relaxed")


def update_one_hot(x, labels, k, precision):
    n, d = x.shape
    sums = torch.zeros((k, d), dtype=torch.float32, device=x.device)
    counts = torch.zeros(k, dtype=torch.int32, device=x.device)
    block_k = min(128, max(16, triton.next_power_of_2(k)))
    block_d = max(16, triton.next_power_of_2(d))
    one_hot_sums_kernel[(triton.cdiv(n, 64), triton.cdiv(k, block_k))](
        x, labels, sums, counts, n, d, k, *x.stride(), BLOCK_N=64, BLOCK_K=block_k,
        BLOCK_D=block_d, PRECISION=precision)
    return km._finalize(sums, counts)


UPDATE_CASES = mutants.only("kmeans/update", "d not a multiple of the tile", "ragged")


@pytest.mark.cpu("the interpreter computes fp32 exactly: TF32 shows in the trace")
@pytest.mark.parametrize("seed", [0, 1])
def test_a_one_hot_update_in_tf32_is_named_from_the_trace(seed):
    """Read from the trace, not the data: the same verdict for every seed (two shown)."""
    result = grade(UPDATE_CASES, lambda x, labels, k: update_one_hot(x, labels, k, "tf32"),
                   seed=seed)
    assert not result.passed
    assert all("TF32" in case.error for case in result.cases), result.causes
    assert 'input_precision="tf32x3" or "ieee"' in result.causes[0]
    assert "the sums by far more than the 1e-5 the centroids are graded to" in \
        result.causes[0]


@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_a_one_hot_update_in_fp32_precision_passes(precision):
    result = grade(UPDATE_CASES, lambda x, labels, k: update_one_hot(x, labels, k, precision))
    assert result.passed, result.message()


def test_the_tf32_check_is_one_function_for_assign_and_update():
    """kmeans/assign's verdict on TF32 and kmeans/update's come from the same check."""
    from types import SimpleNamespace

    from rooflab.autograder.model.trace_data import Dot

    launch = SimpleNamespace(dots=[Dot(16, 16, 16, "fp32", "fp32", "tf32")])
    exact = SimpleNamespace(dots=[Dot(16, 16, 16, "fp32", "fp32", "tf32x3")])
    assert problems.tf32_dots([exact], "") == ""
    assert "TF32's 10 mantissa bits, it does X" in problems.tf32_dots([launch], "it does X")


# --- the loop from the init it is given --------------------------------------------------

FIT = get_problem("kmeans/fit")
LOCAL = mutants.only(FIT, problems.LOCAL_START)


def _ignores_init(x, k, seed, init=None):
    return km.fit(x, k, seed, None)  # k-means++ whatever it is given


def test_a_loop_that_ignores_its_init_fails_and_one_that_uses_it_passes():
    wrong = grade(LOCAL, _ignores_init)
    assert not wrong.passed
    assert "below the" in wrong.causes[0] and "reaches from the given init" in wrong.causes[0]
    assert "Start from init when one is given" in wrong.causes[0]
    assert grade(LOCAL, km.fit).passed


def test_the_init_leads_elsewhere_than_any_good_start_for_20_seeds():
    """What that verdict rests on, for 20 seeds: from the init, float64 Lloyd ends far
    above where a start with one point in each group (farthest-first, as k-means++ almost
    always starts) already is, before Lloyd lowers it further; and every point is far
    from a tie between its two nearest centroids there, next to fp32's rounding of
    ‖x − c‖², so that a correct loop in fp32 labels it as float64 does."""
    (case,) = LOCAL.cpu_cases
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        x, k, _, init = FIT.make_inputs(case, generator, torch.device("cpu"))
        x = x.double()
        centroids, _, from_init = problems.lloyd(x, k, init.double())
        good_start = problems._nearest(x, problems._farthest_first(x, k))[0].sum()
        assert from_init > 100 * float(good_start), seed
        nearest = problems._sq_distances(x, centroids).sort(dim=1).values
        scale = (x * x).sum(dim=1) + (centroids * centroids).sum(dim=1).max()
        assert float(((nearest[:, 1] - nearest[:, 0]) / scale).min()) > 1e-5, seed
