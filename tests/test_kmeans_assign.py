"""Lab 06, the assignment: the fused kernel against float64, the bugs the check names
(each a one-line change of the course's kernel), other correct ways that pass, cheats that
fail, and the cases that tell TF32 apart on a GPU."""

import threading

import mutants
import pytest
import torch
import triton
import triton.language as tl
from mutants import grade, only

from rooflab.autograder import get_problem
from rooflab.autograder.problems import kmeans as problems
from rooflab.kernels import kmeans as km

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ASSIGN = get_problem("kmeans/assign")


def mutant(tmp_path, name, *edits):
    """kernels/kmeans.py with each (old, new) edit made once: one classic bug each."""
    return mutants.mutant(tmp_path, "kmeans", *edits, name=f"kmeans_{name}")


UPDATE_BEST = ("        best = tl.where(better, tile_best, best)\n", "")
COMPARE = ("        better = tile_best < best  # against the best so far, then update both "
           "together\n")
NO_INF = ('        dist = tl.where(col_ok[None, :], dist, float("inf"))  # padding never '
          'wins\n', "")
NO_SHIFT = [("    x = x - shift[None, :]\n", ""), ("        c = c - shift[None, :]\n", "")]
TF32 = ('        precision = "tf32x3"\n', '        precision = "tf32"\n')


# --- right answers ---------------------------------------------------------------------------

@pytest.mark.parametrize("n, d, k", [(300, 37, 20), (50, 8, 100), (200, 16, 1), (129, 256, 70)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_assign_finds_the_nearest_centroid(n, d, k, dtype):
    x = torch.randn(n, d, device=DEVICE).to(dtype)
    c = torch.randn(k, d, device=DEVICE).to(dtype)
    labels = km.assign(x, c)
    assert labels.dtype == torch.int64 and labels.shape == (n,)
    found = problems.wrong_labels(x.double(), c.double(), labels)
    assert len(found["points"]) == 0


@pytest.mark.parametrize("name, edits, kwargs", [
    ("ieee", [('        precision = "tf32x3"\n', '        precision = "ieee"\n')], {}),
    ("small tiles", [], {"block_n": 64, "block_k": 32, "num_warps": 4}),
    # Shift by the block's first point instead of centroid 0: any vector near the data.
    ("shift by a point", [(
        "    shift = tl.load(c_ptr + dims * stride_cd, mask=dim_ok, other=0.0).to(tl.float32)\n",
        "    shift = tl.load(x_ptr + tl.program_id(0) * BLOCK_N * stride_xn + dims * stride_xd,"
        "\n                    mask=dim_ok, other=0.0).to(tl.float32)\n")], {}),
    # The whole distance, ‖x‖² included.
    ("with the norm of x", [(
        "        dist = tl.sum(c * c, axis=1)[None, :] - 2.0 * tl.dot(",
        "        dist = tl.sum(x * x, axis=1)[:, None] + tl.sum(c * c, axis=1)[None, :] "
        "- 2.0 * tl.dot(")], {}),
])
def test_correct_assignments_written_other_ways_pass(tmp_path, name, edits, kwargs):
    module = mutant(tmp_path, name.replace(" ", "_"), *edits)
    result = grade(ASSIGN, lambda x, c: module.assign(x, c, **kwargs))
    assert result.passed, result.message()


# --- the classic bugs, named ------------------------------------------------------------------

@pytest.mark.parametrize("name, edits, words", [
    ("stale min", [UPDATE_BEST], "A stale running min"),
    ("overwritten min", [(UPDATE_BEST[0], "        best = tile_best\n")], "A stale running min"),
    ("min updated first", [(COMPARE, "        best = tl.minimum(best, tile_best)\n"
                                     "        better = tile_best < best\n"), UPDATE_BEST],
     "the labels never move past the first centroids"),
    ("index within the tile", [("k0 + tile_label.to(tl.int64)", "tile_label.to(tl.int64)")],
     "add the index of the tile's first centroid"),
    ("padding wins", [NO_INF], "the padding past the last centroid"),
    ("no shift", NO_SHIFT, "fp32 loses them to cancellation"),
])
def test_assignment_bugs_are_named(tmp_path, name, edits, words):
    module = mutant(tmp_path, name.replace(" ", "_"), *edits)
    result = grade(ASSIGN, module.assign)
    assert not result.passed
    assert words in result.causes[0], result.causes


@pytest.mark.cpu("the interpreter computes fp32 exactly: TF32 shows in the trace")
def test_tf32_is_named_from_the_trace_on_a_cpu(tmp_path):
    result = grade(ASSIGN, mutant(tmp_path, "tf32", TF32).assign)
    assert not result.passed and all(case.ok or "TF32" in case.error for case in result.cases)
    assert 'input_precision="tf32x3" or "ieee"' in result.causes[0]


@pytest.mark.gpu
def test_tf32_mislabels_near_ties_on_a_gpu():
    near = only("kmeans/assign", problems.NEAR_TIES, "ragged")
    for seed in range(3):
        wrong = grade(near, lambda x, c: km.assign(x, c, precision="tf32"), seed=seed)
        assert not wrong.passed and "That is the error of TF32" in wrong.causes[0], seed
        assert grade(near, km.assign, seed=seed).passed


@pytest.mark.cpu("graded from the interpreter's trace")
def test_the_naive_assignment_writes_the_matrix_and_is_told_so():
    result = grade(ASSIGN, km.assign_naive)
    traffic = next(case for case in result.cases if case.case.note == problems.TRAFFIC)
    assert "the size of an n × k matrix of fp32 distances" in traffic.error
    far = next(case for case in result.cases if case.case.note == problems.FAR)
    assert "cancellation" in far.summary


@pytest.mark.cpu("graded from the interpreter's trace")
def test_reading_x_once_per_tile_is_named(tmp_path):
    reload = ("        cols = k0 + tl.arange(0, BLOCK_K)\n",
              "        cols = k0 + tl.arange(0, BLOCK_K)\n"
              "        x = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,"
              "\n                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)"
              ".to(tl.float32) - shift[None, :]\n")
    result = grade(only("kmeans/assign", problems.TRAFFIC), mutant(tmp_path, "reload",
                                                                    reload).assign)
    assert not result.passed and "reads x 5.0 times" in result.causes[0], result.causes


@triton.jit
def _elementwise_kernel(x_ptr, c_ptr, labels_ptr, n, k, d, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """Right labels, with every distance computed elementwise: no tl.dot."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + rows[:, None] * d + dims[None, :],
                mask=(rows[:, None] < n) & (dims[None, :] < d), other=0.0)
    best = tl.full((BLOCK_N,), float("inf"), tl.float32)
    label = tl.zeros((BLOCK_N,), tl.int64)
    for k0 in range(0, k, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        c = tl.load(c_ptr + cols[:, None] * d + dims[None, :],
                    mask=(cols[:, None] < k) & (dims[None, :] < d), other=0.0)
        diff = x[:, None, :] - c[None, :, :]
        dist = tl.where(cols[None, :] < k, tl.sum(diff * diff, axis=2), float("inf"))
        tile_best, tile_label = tl.min(dist, axis=1, return_indices=True)
        label = tl.where(tile_best < best, k0 + tile_label.to(tl.int64), label)
        best = tl.minimum(best, tile_best)
    tl.store(labels_ptr + rows, label, mask=rows < n)


def _elementwise(x, c):
    x, c = x.float().contiguous(), c.float().contiguous()
    labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    _elementwise_kernel[(triton.cdiv(x.shape[0], 64),)](
        x, c, labels, x.shape[0], c.shape[0], x.shape[1], BLOCK_N=64, BLOCK_K=16,
        BLOCK_D=triton.next_power_of_2(x.shape[1]))
    return labels


@pytest.mark.cpu("graded from the interpreter's trace")
def test_distances_without_tl_dot_are_named():
    result = grade(only("kmeans/assign", problems.TRAFFIC), _elementwise)
    assert not result.passed and "do 0% of the 2nkd" in result.causes[0], result.causes


# --- cheats and wrong types ----------------------------------------------------------------

@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=offsets < n), mask=offsets < n)


def _copied(answer):
    out = torch.empty_like(answer)
    _copy_kernel[(triton.cdiv(answer.numel(), 256),)](answer, out, answer.numel(), BLOCK=256)
    return out


def _in_numpy(x, c):
    x64, c64 = x.double().cpu().numpy(), c.double().cpu().numpy()
    distances = ((x64[:, None, :] - c64[None, :, :]) ** 2).sum(-1)
    return _copied(torch.from_numpy(distances.argmin(1)).to(x.device))


def _in_a_thread(x, c):
    found = {}
    worker = threading.Thread(target=lambda: found.setdefault(
        "labels", torch.cdist(x.double(), c.double()).argmin(1)))
    worker.start()
    worker.join()
    return _copied(found["labels"])


@pytest.mark.parametrize("candidate, words", [
    (lambda x, c: torch.cdist(x.double(), c.double()).argmin(dim=1), "calls the library"),
    (_in_numpy, "not computed by its kernels"),
    # A thread started during the check runs under the recorder too.
    (_in_a_thread, "calls the library (aten._euclidean_dist, aten.argmin)"),
    (lambda x, c: km.assign(x, c).int(), "expected int64"),
])
def test_cheats_and_wrong_types_fail(candidate, words):
    # One case, and not k = 1 (where every answer is 0 whatever the inputs): the replay of
    # a passing case on new inputs is what catches an answer computed elsewhere.
    result = grade(only("kmeans/assign", problems.FAR), candidate)
    named = any(w in result.message() for w in ((words,) if isinstance(words, str) else words))
    assert not result.passed and named, result.message()


# --- the verdicts that could depend on the seed -------------------------------------------------

def test_far_from_the_origin_and_near_ties_give_the_same_verdict_for_20_seeds(tmp_path):
    cases, far = only("kmeans/assign", problems.FAR, problems.NEAR_TIES), only(
        "kmeans/assign", problems.FAR)
    unshifted = mutant(tmp_path, "unshifted", *NO_SHIFT).assign
    for seed in range(20):
        right = grade(cases, km.assign, seed=seed)
        assert right.passed, (seed, right.message())
        wrong = grade(far, unshifted, seed=seed)
        assert not wrong.passed and "cancellation" in wrong.causes[0], (seed, wrong.causes)


def _tf32(t):
    bits = t.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def _emulated(x, c, precision):
    """The fused kernel's labels with TF32 or tf32x3 products, emulated in float64."""
    xs, cs = x.float() - c[0].float(), c.float() - c[0].float()
    hi_x, hi_c = _tf32(xs).double(), _tf32(cs).double()
    products = hi_x @ hi_c.T
    if precision == "tf32x3":
        lo_x, lo_c = _tf32(xs - _tf32(xs)).double(), _tf32(cs - _tf32(cs)).double()
        products = products + hi_x @ lo_c.T + lo_x @ hi_c.T
    return ((cs.double() ** 2).sum(1)[None, :] - 2 * products).argmin(dim=1)


@pytest.mark.cpu("emulates the GPU's TF32 on the GPU cases, which a GPU grades for real")
def test_the_gpu_near_tie_case_tells_tf32_apart_for_20_seeds():
    spec = get_problem("kmeans/assign")
    near = next(case for case in spec.gpu_cases if case.note == problems.NEAR_TIES)
    for seed in range(20):
        x, c = spec.make_inputs(near, torch.Generator().manual_seed(seed), torch.device("cpu"))
        wrong = problems.wrong_labels(x.double(), c.double(), _emulated(x, c, "tf32"))
        assert len(wrong["points"]) > 1000, seed  # about half of 20 000
        assert "That is the error of TF32" in problems.diagnose_labels(x.double(), c.double(),
                                                                       wrong)
        right = problems.wrong_labels(x.double(), c.double(), _emulated(x, c, "tf32x3"))
        assert len(right["points"]) == 0, seed


@pytest.mark.cpu("emulates the GPU's TF32 on the GPU cases, which a GPU grades for real")
def test_a_hundred_thousand_random_points_tell_tf32_apart():
    spec = get_problem("kmeans/assign")
    ragged = next(case for case in spec.gpu_cases if case.note == "ragged")
    assert ragged.sizes["n"] >= 5000
    for seed in range(2):
        x, c = spec.make_inputs(ragged, torch.Generator().manual_seed(seed), torch.device("cpu"))
        wrong = problems.wrong_labels(x.double(), c.double(), _emulated(x, c, "tf32"))
        assert len(wrong["points"]) > 20, seed


def test_near_ties_are_built_as_promised():
    spec = get_problem("kmeans/assign")
    near = next(case for case in spec.cases(torch.cuda.is_available())
                if case.note == problems.NEAR_TIES)
    x, c = spec.make_inputs(near, torch.Generator(device=DEVICE).manual_seed(0),
                            torch.device(DEVICE))
    distances = torch.cdist(x.double(), c.double()) ** 2
    two = distances.topk(3, dim=1, largest=False)
    gap = (two.values[:, 1] - two.values[:, 0]) / two.values[:, 0]
    assert 0.9e-4 < float(gap.min()) and float(gap.max()) < 1.1e-3
    assert bool((two.indices[:, 0] // 2 == two.indices[:, 1] // 2).all())  # one pair
    assert float((two.values[:, 2] / two.values[:, 1]).min()) > 2  # the third far behind
