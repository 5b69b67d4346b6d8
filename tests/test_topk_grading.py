"""Lab 05 graded: topk/rows, topk/radix and topk/stream pass correct kernels written other
ways, fail wrong and cheating ones, and name the classic bug when the evidence shows it.

Each mutant is the course's kernel module with one line changed: the bug a learner would
write. Most are graded on the one kind of case that shows their bug (the same notes exist
in both worlds' cases), so that the suite stays fast; the full problems run once each in
test_solutions.py.
"""

import importlib.util
from pathlib import Path

import mutants
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from mutants import grade, only

from rooflab.autograder import get_problem
from rooflab.autograder.problems import topk as problems
from rooflab.kernels import topk

KERNELS = Path(topk.__file__)
ON_GPU = torch.cuda.is_available()


def _grade(problem_id, fn, *notes, seed=None):
    """The verdict on correctness (in either world), on the cases with these notes (all
    of them if none)."""
    return grade(only(problem_id, *notes) if notes else problem_id, fn, seed=seed)


def _mutant(tmp_path, line: str, replacement: str, name: str = "mutant_topk"):
    """kernels/topk.py with one line changed."""
    return mutants.mutant(tmp_path, "topk", (line, replacement), name=name)


# --- right answers, written other ways ------------------------------------------------


def test_radix_select_answers_the_rows_exercise_too():
    result = _grade("topk/rows", topk.topk_radix, "ragged rows", "strided rows",
                    problems.SPECIAL, problems.EQUAL, "k = n")
    assert result.passed, result.message()


def test_rows_kernel_with_small_blocks_passes():
    result = _grade("topk/rows", lambda x, k: topk.topk_rows(x, k, block=256),
                    "ragged rows", "k = n", problems.SPECIAL, problems.NEGATIVE)
    assert result.passed, result.message()


def test_radix_select_with_other_splits_blocks_and_buffers_passes():
    def other(x, k):
        k_pad = max(2, 1 << (k - 1).bit_length())
        return topk.topk_radix(x, k, block=2048, split=6, cap=16 * k_pad)

    result = _grade("topk/radix", other, problems.TRAFFIC, problems.FEW_ROWS, problems.NARROW,
                    problems.SPECIAL, "k = n", "rows shorter than a block", "strided rows")
    assert result.passed, result.message()


def test_radix_select_with_a_tiny_buffer_is_right_on_hard_rows():
    # Room for k candidates only: every row goes through the levels, and rows of equal
    # values end with the tie-limited filter. Right, whatever it reads.
    def tight(x, k):
        return topk.topk_radix(x, k, cap=max(2, 1 << (k - 1).bit_length()))

    result = _grade("topk/radix", tight, problems.EQUAL, problems.DUPLICATES,
                    problems.NARROW, problems.SPECIAL, "k = n")
    assert result.passed, result.message()


class StreamThroughRows:
    """Streaming top-k another way: each chunk's top k by radix select, and the merge as
    a top k of the two lists copied side by side into one short row (topk_rows), with
    the positions fetched by where each winner sits in that row."""

    def __init__(self, k, offset=0):
        self.k, self.offset, self.seen = k, offset, 0
        self.values = self.indices = None

    def update(self, chunk):
        values, indices = topk.topk_radix(chunk[None, :], min(self.k, chunk.numel()))
        self._take(values[0], indices[0], self.offset + self.seen)
        self.seen += chunk.numel()

    def merge(self, other):
        self._take(other.values, other.indices, 0)

    def result(self):
        return self.values, self.indices

    def _take(self, values, indices, base):
        held = 0 if self.values is None else self.values.numel()
        row_values = torch.empty((1, held + values.numel()), dtype=values.dtype,
                                 device=values.device)
        row_indices = torch.empty(held + values.numel(), dtype=torch.int64,
                                  device=values.device)
        if held:
            _side_by_side[(1,)](self.values, self.indices, held, 0, row_values, row_indices,
                                BLOCK=1 << max(1, (held - 1).bit_length()))
        _side_by_side[(1,)](values, indices, values.numel(), held, row_values, row_indices,
                            BASE=base, BLOCK=1 << max(1, (values.numel() - 1).bit_length()))
        kept = min(self.k, row_values.shape[1])
        top, where = topk.topk_rows(row_values, kept)
        out = torch.empty(kept, dtype=torch.int64, device=values.device)
        _fetch[(1,)](where, row_indices, out, kept, BLOCK=1 << max(1, (kept - 1).bit_length()))
        self.values, self.indices = top[0], out


@triton.jit
def _side_by_side(v_ptr, i_ptr, n, at, row_v_ptr, row_i_ptr, BASE=0, BLOCK: tl.constexpr = 2):
    slots = tl.arange(0, BLOCK)
    tl.store(row_v_ptr + at + slots, tl.load(v_ptr + slots, mask=slots < n), mask=slots < n)
    tl.store(row_i_ptr + at + slots, tl.load(i_ptr + slots, mask=slots < n) + BASE,
             mask=slots < n)


@triton.jit
def _fetch(where_ptr, row_i_ptr, out_ptr, n, BLOCK: tl.constexpr):
    slots = tl.arange(0, BLOCK)
    where = tl.load(where_ptr + slots, mask=slots < n, other=0)
    tl.store(out_ptr + slots, tl.load(row_i_ptr + where, mask=slots < n), mask=slots < n)


def test_a_stream_merged_another_way_passes():
    result = _grade("topk/stream", StreamThroughRows, problems.SHARDS, problems.SHORT_CHUNKS,
                    problems.SPECIAL, "k = n")
    assert result.passed, result.message()


# --- the classic bugs, named ----------------------------------------------------------

NEGATIVE_BITS = ("key = tl.where((bits >> 31) == 1, bits ^ 0xFFFFFFFF, bits | 0x80000000)",
                 "key = bits | 0x80000000")


def test_negative_floats_ranked_upside_down_are_named(tmp_path):
    mutant = _mutant(tmp_path, *NEGATIVE_BITS)
    result = _grade("topk/rows", mutant.topk_rows)  # every kind of row
    assert not result.passed
    assert "only negative scores come back wrong" in result.causes[0]
    assert "flip all the bits of a negative float" in result.causes[0]


def test_nan_with_its_sign_bit_must_rank_first(tmp_path):
    mutant = _mutant(tmp_path, "    key = tl.where(x != x, 0xFFFFFFFF, key)\n", "")
    result = _grade("topk/rows", mutant.topk_rows, problems.SPECIAL, "ragged rows")
    assert not result.passed
    assert "NaN ranks above every number in torch.topk, whatever its sign bit" in \
        result.causes[0]


def test_a_missing_mask_on_the_last_block_is_named(tmp_path):
    mutant = _mutant(tmp_path, "words = tl.where(mask, pack(float_key(x), cols), 0)",
                     "words = pack(float_key(x), cols)")
    result = _grade("topk/rows", mutant.topk_rows, problems.NEGATIVE)
    assert not result.passed
    assert "past the end of the row" in result.causes[0]
    assert "Mask the last block" in result.causes[0]


def test_an_element_taken_twice_is_a_tie_bug(tmp_path):
    mutant = _mutant(tmp_path, "words = tl.where(mask, pack(float_key(x), cols), 0)",
                     "words = tl.where(mask, pack(float_key(x), cols * 0), 0)")
    result = _grade("topk/rows", mutant.topk_rows, "ragged rows", problems.EQUAL)
    assert not result.passed
    assert "comes back twice" in result.causes[0]
    assert "Equal values are distinct elements" in result.causes[0]


def test_values_and_indices_that_disagree_are_named(tmp_path):
    mutant = _mutant(tmp_path, "(running & 0xFFFFFFFF).to(tl.int64),",
                     "((running & 0xFFFFFFFF) ^ 1).to(tl.int64),")
    result = _grade("topk/rows", mutant.topk_rows, "ragged rows")
    assert not result.passed
    assert "the values and the indices were sorted or stored apart" in result.causes[0]


def test_the_right_elements_in_the_wrong_order_are_named(tmp_path):
    source = KERNELS.read_text()
    mutant_source = source.replace("values_ptr + row * stride_vm + slots",
                                   "values_ptr + row * stride_vm + (K - 1 - slots)")
    mutant_source = mutant_source.replace("indices_ptr + row * stride_im + slots",
                                          "indices_ptr + row * stride_im + (K - 1 - slots)")
    assert mutant_source.count("(K - 1 - slots)") == 2
    path = tmp_path / "ascending_topk.py"
    path.write_text(mutant_source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mutant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutant)
    result = _grade("topk/rows", mutant.topk_rows, "ragged rows")
    assert not result.passed
    assert "the right elements in row 0, but not in descending order" in result.causes[0]


def test_a_filter_that_drops_the_threshold_bucket_is_named(tmp_path):
    mutant = _mutant(tmp_path, "n_under = tl.sum(under.to(tl.int32), 0)",
                     "n_under = 0 * tl.sum(under.to(tl.int32), 0)")
    result = _grade("topk/radix", mutant.topk_radix, problems.NEGATIVE, "k = 1")
    assert not result.passed
    assert "a slot no element filled" in result.causes[0]
    assert "the bucket's own elements included" in result.causes[0]


def test_a_histogram_that_ignores_the_prefix_is_wrong_where_levels_are_needed(tmp_path):
    # Few long rows take a second level (their buffer is small): counted over the whole
    # row instead of the threshold bucket, its histogram points at the wrong bucket.
    mutant = _mutant(tmp_path,
                     "under = mask & ((key.to(tl.uint64) >> (shift + 8)) == prefix)",
                     "under = mask")
    result = _grade("topk/radix", mutant.topk_radix, problems.FEW_ROWS)
    assert not result.passed
    assert not any(case.comparison and case.comparison.ok for case in result.cases)


def test_positions_counted_from_each_chunk_are_named(tmp_path):
    mutant = _mutant(tmp_path, "self._absorb(values[0], indices[0], self.offset + self.seen)",
                     "self._absorb(values[0], indices[0], self.offset)")
    result = _grade("topk/stream", mutant.StreamingTopK, problems.SHARDS)
    assert not result.passed
    assert "look like positions in a chunk or a shard" in result.causes[0]


def test_a_shard_without_its_offset_is_named(tmp_path):
    mutant = _mutant(tmp_path, "self._absorb(values[0], indices[0], self.offset + self.seen)",
                     "self._absorb(values[0], indices[0], self.seen)")
    result = _grade("topk/stream", mutant.StreamingTopK, problems.SHARDS)
    assert not result.passed
    assert "and the shard's offset" in result.causes[0]


# --- cheating ---------------------------------------------------------------------------


def test_torch_topk_is_a_library_call():
    result = _grade("topk/rows", lambda x, k: torch.topk(x, k), "ragged rows")
    assert "calls the library (aten.topk)" in result.causes[0]


def test_torch_sort_is_a_library_call():
    def by_sort(x, k):
        values, indices = torch.sort(x, dim=-1, descending=True)
        return values[:, :k], indices[:, :k]

    result = _grade("topk/radix", by_sort, "k = 1")
    assert "calls the library (aten.sort)" in result.causes[0]


def test_a_stream_that_concatenates_is_a_library_call():
    class Concatenating(topk.StreamingTopK):
        def update(self, chunk):
            if self.values is not None:
                torch.cat([self.values, chunk])
            super().update(chunk)

    result = _grade("topk/stream", Concatenating, problems.SHARDS)
    assert "calls the library (aten.cat)" in result.causes[-1]


@pytest.mark.cpu("the trace shows who wrote the answer; a GPU run has no trace")
def test_an_answer_made_on_the_host_fails_even_beside_a_kernel():
    def numpy_topk(x, k):
        topk.topk_rows(x[:1, :k], 1)  # a kernel launched for show
        scores = x.float().numpy()
        order = np.argsort(-np.where(np.isnan(scores), np.inf, scores), axis=1,
                           kind="stable")[:, :k]
        values = torch.empty((x.shape[0], k), dtype=x.dtype)
        indices = torch.empty((x.shape[0], k), dtype=torch.int64)
        values.copy_(torch.from_numpy(np.take_along_axis(scores, order, 1)))
        indices.copy_(torch.from_numpy(order))
        return values, indices

    result = _grade("topk/rows", numpy_topk, "ragged rows")
    assert not result.passed
    assert "the kernels did not read every score" in result.causes[0]


@pytest.mark.cpu("structure is read from the interpreter's trace")
def test_a_pass_per_byte_reads_the_scores_too_often():
    def pass_per_byte(x, k):
        return topk.topk_radix(x, k, cap=max(2, 1 << (k - 1).bit_length()))

    result = _grade("topk/radix", pass_per_byte, problems.TRAFFIC)
    assert all(case.comparison.ok for case in result.cases)  # right answers...
    assert not result.passed  # ...read four times
    assert "reads x" in result.causes[0] and "times on random scores" in result.causes[0]


@pytest.mark.cpu("structure is read from the interpreter's trace")
def test_rows_read_by_one_program_each_fail_when_rows_are_few():
    result = _grade("topk/radix", lambda x, k: topk.topk_radix(x, k, split=1),
                    problems.FEW_ROWS)
    assert not result.passed
    assert "each row of x is read by 1 program" in result.causes[0]
    one_per_row = _grade("topk/radix", topk.topk_rows, problems.FEW_ROWS)
    assert "read by 1 program" in one_per_row.causes[0]


@pytest.mark.cpu("structure is read from the interpreter's trace")
def test_a_copy_of_the_scores_in_scratch_fails():
    @triton.jit
    def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + cols, tl.load(x_ptr + cols, mask=cols < n), mask=cols < n)

    def copy_then_select(x, k):
        copy = torch.empty(x.shape, dtype=x.dtype)
        flat = x.contiguous()
        copy_kernel[(triton.cdiv(x.numel(), 4096),)](flat, copy, x.numel(), BLOCK=4096)
        return topk.topk_radix(copy, k)

    result = _grade("topk/radix", copy_then_select, problems.TRAFFIC)
    assert not result.passed
    assert "scratch" in result.causes[0] and "a sort, or a copy of the row" in result.causes[0]


# --- the same verdict whatever the inputs ------------------------------------------------


@pytest.fixture(scope="module")
def negative_mutant(tmp_path_factory):
    return _mutant(tmp_path_factory.mktemp("topk_seeds"), *NEGATIVE_BITS, name="seed_negative")


@pytest.mark.parametrize("seed", range(20))
def test_verdicts_do_not_depend_on_the_seed(seed, negative_mutant):
    result = _grade("topk/rows", negative_mutant.topk_rows, problems.NEGATIVE, seed=seed)
    assert "only negative scores come back wrong" in result.causes[0]
    assert _grade("topk/rows", topk.topk_rows, problems.NEGATIVE, problems.SPECIAL,
                  seed=seed).passed


@pytest.mark.cpu("the read count is graded from the interpreter's trace")
def test_random_scores_leave_few_enough_candidates_for_two_reads_on_every_seed():
    """The 2-read bound on topk/radix's traffic case holds when the top byte leaves at most
    the buffer's worth of candidates. Check that on 20 seeds' inputs (the engine's own
    generator), then grade three of them."""
    spec = get_problem("topk/radix")
    (case,) = [c for c in spec.cpu_cases if c.note == problems.TRAFFIC]
    n, k = case.sizes["n"], case.sizes["k"]
    cap = max(8 * max(2, 1 << (k - 1).bit_length()), n // 32)  # m >= the toy card's 8 SMs
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        x, _ = spec.make_inputs(case, generator, torch.device("cpu"))
        keys = host_keys(x)
        counts = torch.stack([torch.bincount(row >> 24, minlength=256) for row in keys])
        at_or_above = counts.flip(-1).cumsum(-1).flip(-1)
        bucket = (at_or_above >= k).sum(-1) - 1
        candidates = at_or_above.gather(1, bucket[:, None])
        assert int(candidates.max()) <= cap, seed
    for seed in range(3):
        assert _grade("topk/radix", topk.topk_radix, problems.TRAFFIC, seed=seed).passed


def host_keys(x: torch.Tensor) -> torch.Tensor:
    """float_key on the host, as int64."""
    bits = x.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    key = torch.where(bits >> 31 == 1, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    return torch.where(x.isnan(), 0xFFFFFFFF, key)


# --- every argument, in both worlds -----------------------------------------------------


@pytest.mark.parametrize("problem_id", ["topk/rows", "topk/radix"])
def test_every_argument_is_exercised_in_both_worlds(problem_id):
    spec = get_problem(problem_id)
    for cases in (spec.cpu_cases, spec.gpu_cases):
        dtypes = {case.dtype for case in cases}
        assert dtypes == {torch.float32, torch.float16, torch.bfloat16}
        assert any("x" in case.transposed for case in cases)  # strided rows
        ks = [(case.sizes["k"], case.sizes["n"]) for case in cases]
        assert any(k == 1 for k, _ in ks) and any(k == n for k, n in ks)
        assert any(k & (k - 1) for k, _ in ks) and any(not k & (k - 1) and k > 1 for k, _ in ks)
        assert any(n < 1024 for _, n in ks)  # rows shorter than a block
        assert any(n % 1024 for _, n in ks)  # a partial last block
        notes = {case.note for case in cases}
        assert {problems.SPECIAL, problems.EQUAL, problems.DUPLICATES, problems.SORTED,
                problems.NARROW, problems.NEGATIVE} <= notes
        assert sum(case.timed for case in cases) <= 1


def test_every_stream_argument_is_exercised_in_both_worlds():
    spec = get_problem("topk/stream")
    for cases in (spec.cpu_cases, spec.gpu_cases):
        assert {case.dtype for case in cases} == {torch.float32, torch.float16, torch.bfloat16}
        assert any(case.sizes["devices"] == 1 for case in cases)
        assert any(case.sizes["devices"] > 1 for case in cases)  # merge() and offset
        assert any(case.sizes["chunk"] < case.sizes["k"] for case in cases)
        assert any(case.sizes["n"] % case.sizes["chunk"] for case in cases)  # a short last
        assert any(case.sizes["k"] == 1 for case in cases)
        assert any(case.sizes["k"] == case.sizes["n"] for case in cases)
        assert any(case.note == problems.SPECIAL for case in cases)
        assert any(case.sizes.get("offset", 0) > 1 << 32 for case in cases)  # past 32 bits
        assert any(case.note == problems.MEMORY for case in cases)  # tests/test_topk_cheats


def test_the_timed_cases_are_the_shapes_of_the_goals():
    timed = {pid: [c for c in get_problem(pid).gpu_cases if c.timed][0]
             for pid in ("topk/rows", "topk/radix", "topk/stream")}
    assert timed["topk/rows"].sizes == {"m": 4096, "n": 32768, "k": 64}
    assert timed["topk/radix"].sizes == {"m": 256, "n": 262144, "k": 1024}
    assert timed["topk/radix"].dtype == timed["topk/rows"].dtype == torch.float32
    assert timed["topk/stream"].sizes["n"] == 1 << 26


def test_a_sort_is_kept_out_by_the_trace_not_by_the_time_bar():
    """A full sort of a row moves it through memory at least log2(n / 4096) times, in and
    out, 16 bytes a score a pass (word and position): at 256 x 262144 that is more than 10
    times the compulsory bytes, under 4% of the roofline. The radix bar (half of what the
    course's kernel measured on an H100, 7%) is no higher than that, so the trace keeps a
    sort out: each pass stores the row again, past the scratch a radix select may write
    (test_a_copy_of_the_scores_in_scratch_fails)."""
    radix, rows = get_problem("topk/radix"), get_problem("topk/rows")
    passes = int(np.log2(262144 / 4096))
    sort_fraction = 4 / (4 + 16 * passes)
    assert radix.levels.passing <= sort_fraction < radix.levels.excellent
    assert radix.trace_check is problems.radix_structure
    assert any(case.note == problems.TRAFFIC for case in radix.cpu_cases)
    # Against torch.topk, radix select must do better than one program per row.
    assert radix.at_least_vs_baseline > rows.at_least_vs_baseline > 0
    assert radix.baseline is not None
