"""Lab 06, the update: the sorted update and the atomic ones against float64, the empty
cluster's policy, contention read from the trace, the CUDA C step, and on a GPU the
target: half of the points in one cluster at most twice the uniform time."""

import shutil

import mutants
import pytest
import torch
from mutants import grade

from rooflab.autograder import check, get_problem
from rooflab.autograder.device import cuda
from rooflab.autograder.model.trace import tracing
from rooflab.autograder.problems import kmeans as problems
from rooflab.kernels import kmeans as km
from rooflab.kernels.kmeans_cuda import CudaUpdate, update_cuda

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
UPDATE = get_problem("kmeans/update")


def mutant(tmp_path, name, *edits):
    """kernels/kmeans.py with each (old, new) edit made once."""
    return mutants.mutant(tmp_path, "kmeans", *edits, name=f"kmeans_{name}")


def only(*notes):
    """kmeans/update with only its cases (in this world) of the given notes."""
    return mutants.only(UPDATE, *notes)


RAGGED = ("d not a multiple of the tile", "ragged")  # the first case, in either world


def _float64(x, labels, k):
    counts = torch.bincount(labels, minlength=k)
    sums = torch.zeros(k, x.shape[1], dtype=torch.float64, device=x.device)
    return sums.index_add_(0, labels, x.double()) / counts.clamp_min(1)[:, None], counts


@pytest.mark.parametrize("update", [km.update_sorted, km.update_atomic],
                         ids=["sorted", "atomic"])
@pytest.mark.parametrize("n, d, k", [(300, 37, 20), (50, 8, 100), (200, 130, 1), (1000, 16, 7)])
def test_updates_match_float64_with_empty_clusters_zero(update, n, d, k):
    x = torch.randn(d, n, device=DEVICE).T  # strided
    labels = torch.randint(k, (n,), device=DEVICE) // 2 * 2 % k  # odd clusters stay empty
    centroids, counts = update(x, labels, k)
    want, want_counts = _float64(x, labels, k)
    assert centroids.dtype == torch.float32 and counts.dtype == torch.int64
    assert torch.equal(counts, want_counts)
    torch.testing.assert_close(centroids.double(), want, rtol=1e-5, atol=1e-5)
    assert bool((centroids[want_counts == 0] == 0).all())


def test_sorted_updates_with_other_blocks_pass():
    for block_n in (32, 128):
        result = grade(only(*RAGGED, problems.EMPTY, "k > n", problems.SKEWED),
                       lambda x, labels, k, b=block_n: km.update_sorted(x, labels, k,
                                                                         block_n=b))
        assert result.passed, (block_n, result.message())


@pytest.mark.cpu("contention read from the interpreter's trace")
def test_atomics_per_point_fail_on_the_skewed_case_only():
    result = grade(UPDATE, km.update_atomic)
    assert not result.passed
    failing = [case for case in result.cases if not case.ok]
    assert [case.case.note for case in failing] == [problems.SKEWED]
    assert "(contention)" in failing[0].error and "one atomic per run" in failing[0].error


@pytest.mark.cpu("contention read from the interpreter's trace")
def test_the_hottest_address_counts_atomics_per_address():
    x, labels, k = torch.randn(4096, 32), torch.zeros(4096, dtype=torch.int64), 64
    labels[::2] = torch.arange(2048) % 64
    with tracing() as atomic:
        km.update_atomic(x, labels, k)
    with tracing() as sorted_:
        km.update_sorted(x, labels, k)
    assert problems.hottest_address(atomic.launches) == 2048 + 32  # cluster 0: every point
    assert problems.hottest_address(sorted_.launches) <= 4096 // km.RANK_BLOCK


@pytest.mark.parametrize("name, edits, words", [
    ("nan for empty", [("sums / tl.maximum(count, 1).to(tl.float32)[:, None]",
                        "sums / count.to(tl.float32)[:, None]")], "0 / 0. The policy here"),
    ("no subtraction", [("    tl.atomic_add(sums_ptr + next_label[:, None] * d + dims[None, :], "
                         "-running,\n", "    tl.atomic_add(sums_ptr + next_label[:, None] * d "
                         "+ dims[None, :], 0 * running,\n")], "centroids: relative error"),
    ("runs cut at blocks", [("((label != next_label) | last_lane)", "(label != next_label)")],
     "centroids: relative error"),
])
def test_update_bugs_fail(tmp_path, name, edits, words):
    module = mutant(tmp_path, name.replace(" ", "_"), *edits)
    result = grade(only(*RAGGED, problems.EMPTY, "k > n"), module.update_sorted)
    assert not result.passed and words in result.causes[0], result.causes


@pytest.mark.parametrize("candidate, words", [
    (lambda x, labels, k: problems._update_reference(x.double(), labels, k),
     "calls the library"),
    (lambda x, labels, k: (km.update_sorted(x, labels, k)[0], km.update_sorted(
        x, labels, k)[1].int()), "counts: dtype int32, expected int64"),
    (lambda x, labels, k: km.update_sorted(x, labels, k)[0], "return (centroids, counts)"),
])
def test_cheats_and_wrong_answers_fail(candidate, words):
    result = grade(only(*RAGGED), candidate)
    assert not result.passed and words in result.message(), result.message()


def test_empty_clusters_give_the_same_verdict_for_20_seeds(tmp_path):
    empty = only(problems.EMPTY)
    nan = mutant(tmp_path, "nan", ("sums / tl.maximum(count, 1).to(tl.float32)[:, None]",
                                   "sums / count.to(tl.float32)[:, None]")).update_sorted
    for seed in range(20):
        assert grade(empty, km.update_sorted, seed=seed).passed, seed
        wrong = grade(empty, nan, seed=seed)
        assert not wrong.passed and "0 / 0" in wrong.causes[0], seed


# --- the CUDA C step -----------------------------------------------------------------------

needs_nvrtc = pytest.mark.skipif(not cuda._nvrtc_candidates(), reason="no NVRTC library")


@needs_nvrtc
@pytest.mark.cpu("what a CPU can say about CUDA C")
def test_the_cuda_update_is_compile_checked_on_a_cpu():
    result = grade("kmeans/update_atomic", update_cuda)
    assert result.verdict == "NEEDS A GPU" and "scatter_add and divide compile" in result.line
    stub = CudaUpdate(update_cuda.scatter_add.source.replace(
        "atomicAdd(&counts[label], 1);", "// YOUR CODE HERE"))
    assert grade("kmeans/update_atomic", stub).verdict == "NOT IMPLEMENTED"
    typo = CudaUpdate(update_cuda.scatter_add.source.replace("atomicAdd(&counts[label], 1);",
                                                             "atomicAdd(&counts[label], 1)"))
    broken = grade("kmeans/update_atomic", typo)
    assert broken.verdict == "FAIL" and "scatter_add does not compile" in broken.causes[0]


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs the CUDA driver")
def test_the_cuda_update_on_a_gpu():
    pytest.importorskip("cupy")
    x = torch.randn(300, 1000, device="cuda").T  # strided
    labels = torch.randint(0, 40, (1000,), device="cuda") * 2
    centroids, counts = update_cuda(x, labels, 100)
    want, want_counts = _float64(x, labels, 100)
    assert torch.equal(counts, want_counts)
    torch.testing.assert_close(centroids.double(), want, rtol=1e-5, atol=1e-5)
    assert check("kmeans/update_atomic", update_cuda, show=False, measure=False).passed


# --- on a GPU: the update's target -----------------------------------------------------------

@pytest.mark.gpu
def test_half_of_the_points_in_one_cluster_at_most_doubles_the_sorted_update():
    from rooflab.autograder.device.timing import time_gpu

    n, d, k = 1 << 22, 64, 256
    x = torch.randn(n, d, device="cuda")
    uniform = torch.randint(k, (n,), device="cuda")
    skewed = torch.where(torch.rand(n, device="cuda") < 0.5, 0, uniform)
    times = {}
    for name, labels in (("uniform", uniform), ("skewed", skewed)):
        times[name] = time_gpu(lambda labels=labels: km.update_sorted(x, labels, k)).median_s
    assert times["skewed"] <= 2 * times["uniform"], times
