"""Lab 05, exercise 4 (topk/sampling): top-k and top-p sampling without a sort, graded in
distribution.

The course's kernel passes, and so does a kernel written another way; each classic slip
fails with its cause named, for 20 seeds. A check costs seconds in the interpreter, so the
20 seeds go through the problem's own inputs, reference and comparison (the verdict on
the draws, which is all ``check`` judges them by, without its trace and replay), on the
case that shows each slip; ``check`` itself grades each kernel once. The slips are
written twice: the library's way (a sort, in plain torch), and in the course's kernel.
A draw that is not renormalised is in the first only: in the kernel (u not scaled by the
kept mass after a rejection) it moves a few per cent of the draws, which a few hundred
draws cannot tell from chance. top_k = 1 is checked token for token: every draw the
arg-max.
"""

import mutants
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from mutants import grade, only

from rooflab.autograder import get_problem
from rooflab.autograder.bench.sampling import sampling_workloads
from rooflab.autograder.problems import sampling as problem
from rooflab.kernels import sampling

SPEC = get_problem("topk/sampling")
PEAKED = only(SPEC, problem.PEAKED)
TIES = only(SPEC, problem.TIES)
FLAT = only(SPEC, problem.FLAT)
K_BINDS = only(SPEC, problem.K_BINDS)
TIES_AT_K = only(SPEC, problem.TIES_AT_K)
CPU = torch.device("cpu")


def causes_by_seed(spec, candidate, seeds=range(20)) -> list[str]:
    """Each seed's verdict on the draws ("" when right), over the spec's cases, seeded as
    ``check`` seeds them."""
    causes = []
    for seed in seeds:
        cause = ""
        for index, case in enumerate(spec.cpu_cases):
            inputs = spec.make_inputs(case, torch.Generator().manual_seed(seed + index), CPU)
            reference = spec.reference(inputs[0].double(), inputs[1], inputs[2],
                                       inputs[3].double())
            cause = cause or spec.compare(candidate(*inputs), reference)
        causes.append(cause)
    return causes


# --- the slips, the library's way --------------------------------------------------------


def sorted_sampler(keep=lambda v, b, t: b < t, first=lambda k: k):
    """Sort, keep the sorted tokens ``keep(values, mass_before, top_p)`` says among the
    ``first(top_k)``, draw by inverse CDF with the first uniform. By default the right
    cuts, but a sort's: tied tokens cut in the order it left them."""

    def sample(probs, top_k, top_p, uniforms):
        values, order = torch.sort(probs, dim=-1, descending=True)
        rank = torch.arange(probs.shape[1])
        kept = torch.where(keep(values, values.cumsum(-1) - values, top_p) & (rank < first(top_k)),
                           values, 0.0)
        running = kept.cumsum(-1)
        position = (running <= uniforms[:, :1] * running[:, -1:]).sum(-1, keepdim=True)
        return order.gather(-1, position.clamp_max(probs.shape[1] - 1)).squeeze(-1)

    return sample


def in_vocabulary_order(probs, top_k, top_p, uniforms):
    """The nucleus taken as a prefix of the row as it lies, not by probability."""
    kept = torch.where(probs.cumsum(-1) - probs < top_p, probs, 0.0)
    running = kept.cumsum(-1)
    return (running <= uniforms[:, :1] * running[:, -1:]).sum(-1).clamp_max(probs.shape[1] - 1)


def not_renormalised(probs, top_k, top_p, uniforms):
    """u over the whole mass, not the nucleus's: past it, the least probable nucleus token."""
    values, order = torch.sort(probs, dim=-1, descending=True)
    inside = values.cumsum(-1) - values < top_p
    running = torch.where(inside, values, 0.0).cumsum(-1)
    position = torch.minimum((running <= uniforms[:, :1]).sum(-1, keepdim=True),
                             inside.sum(-1, keepdim=True) - 1)
    return order.gather(-1, position).squeeze(-1)


def one_too_many(values, before, top_p):
    """The first token past the nucleus kept too (the cut shifted by one)."""
    return torch.cat([torch.ones_like(before[:, :1], dtype=torch.bool),
                      before[:, :-1] < top_p], -1)


SLIPS = [
    ("top_p ignored", PEAKED, sorted_sampler(lambda v, b, t: torch.ones_like(v, dtype=bool)),
     "top_p is not applied"),
    ("boundary left out", PEAKED, sorted_sampler(lambda v, b, t: b + v < t),
     "the boundary is left out"),
    ("one token too many", PEAKED, sorted_sampler(one_too_many),
     "the nucleus has one token too many"),
    ("vocabulary order", FLAT, in_vocabulary_order, "whatever their ids"),
    ("not renormalised", PEAKED, not_renormalised, "One token takes most of the excess"),
    ("ties cut by a sort", TIES, sorted_sampler(),
     "tied tokens are in the nucleus or out of it together (the mass"),
    ("top_k ignored", K_BINDS, sorted_sampler(first=lambda k: 1 << 30), "top_k is not applied"),
    ("k + 1 tokens", K_BINDS, sorted_sampler(first=lambda k: k + 1),
     "6 tokens drawn where top_k = 5"),
    ("the k-th token left out", K_BINDS, sorted_sampler(first=lambda k: k - 1),
     "the k-th token is left out"),
    ("ties at the k-th place cut", TIES_AT_K, sorted_sampler(),
     "tied tokens are in the nucleus or out of it together (the count"),
]


@pytest.mark.parametrize("name,spec,sample,cause", SLIPS, ids=[s[0] for s in SLIPS])
def test_each_slip_fails_with_its_cause_for_20_seeds(name, spec, sample, cause):
    causes = causes_by_seed(spec, sample)
    assert all(cause in found for found in causes), (name, causes)


def test_the_sort_based_sampler_is_right_where_no_tokens_tie():
    """The library's way, the bench's baseline: the comparison takes its draws, 20 seeds."""
    spec = only(SPEC, problem.PEAKED, problem.TOP_K, problem.K_BINDS, problem.P_BINDS)
    assert causes_by_seed(spec, sampling.sort_top_k_top_p_sample) == [""] * 20


def test_the_course_kernel_draws_right_for_20_seeds():
    """Top-p alone, ties at its edge, top-k alone, and top-k cutting before top-p."""
    spec = only(SPEC, problem.PEAKED, problem.TIES, problem.TOP_K, problem.K_BINDS)
    assert causes_by_seed(spec, sampling.top_k_top_p_sample) == [""] * 20


def test_top_k_of_1_is_greedy_for_20_seeds():
    """Every draw the row's most probable token, whatever the rounds it took: the 20 seeds'
    rows in one call (a call costs the interpreter about the same for 200 rows or 4000)."""
    case = only(SPEC, problem.GREEDY).cpu_cases[0]
    inputs = [SPEC.make_inputs(case, torch.Generator().manual_seed(seed), CPU)
              for seed in range(20)]
    probs = torch.cat([probs for probs, *_ in inputs])
    uniforms = torch.cat([uniforms for *_, uniforms in inputs])
    top_k, top_p = inputs[0][1:3]
    assert top_k == 1
    tokens = sampling.top_k_top_p_sample(probs, top_k, top_p, uniforms)
    assert torch.equal(tokens, probs.argmax(-1))


# --- the kernel written another way, and the slips in the kernel ------------------------


@triton.jit
def _from_the_right_kernel(probs_ptr, uniforms_ptr, out_ptr, M, V, ROUNDS, top_k, top_p,
                           stride_pm, stride_um, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    """Right, written otherwise: the draw runs from the row's end (a running sum from the
    right), the rounds are a for loop, and the mass and count above the token are the
    row's less those at or below it."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < M
    low = tl.zeros((BLOCK_M,), tl.float32) - 1.0
    mass = tl.zeros((BLOCK_M,), tl.float32) + 1.0
    token = tl.zeros((BLOCK_M,), tl.int64) - 1
    for r in range(0, ROUNDS):
        if tl.max(live.to(tl.int32), 0) > 0:
            u = tl.load(uniforms_ptr + rows * stride_um + r, mask=live, other=0.0) * mass
            cols = tl.arange(0, BLOCK_V)
            p = tl.load(probs_ptr + rows[:, None] * stride_pm + cols[None, :],
                        mask=live[:, None] & (cols < V)[None, :], other=0.0)
            kept = tl.where(p > low[:, None], p, 0.0)
            after = tl.cumsum(kept, 1, reverse=True)  # the kept mass from here to the end
            drawn = tl.max(tl.where((after > u[:, None]) & (kept > 0), cols[None, :], -1), 1)
            p_t = tl.sum(tl.where(cols[None, :] == drawn[:, None], p, 0.0), 1)
            below = tl.sum(tl.where(p <= p_t[:, None], p, 0.0), 1)
            above = tl.sum(p, 1) - below
            at_or_below = (p <= p_t[:, None]) & (cols < V)[None, :]
            count = V - tl.sum(at_or_below.to(tl.int32), 1)
            passes = (above < top_p) & (count < top_k)
            token = tl.where(live & passes, drawn.to(tl.int64), token)
            live = live & (passes == 0)
            low = tl.where(live, p_t, low)
            mass = tl.where(live, above, mass)
    tl.store(out_ptr + rows, token, mask=rows < M)


def from_the_right(probs, top_k, top_p, uniforms):
    m, v = probs.shape
    out = torch.empty(m, dtype=torch.int64)
    block_v = triton.next_power_of_2(v)
    block_m = max(1, min(triton.next_power_of_2(m), (1 << 16) // block_v))
    _from_the_right_kernel[(triton.cdiv(m, block_m),)](
        probs, uniforms, out, m, v, uniforms.shape[1], top_k, top_p, probs.stride(0),
        uniforms.stride(0), BLOCK_M=block_m, BLOCK_V=block_v)
    return out


def test_a_kernel_written_another_way_passes():
    assert grade(only(SPEC, problem.PEAKED, problem.TIES_AT_K), from_the_right).passed
    assert causes_by_seed(only(SPEC, problem.TIES, problem.TIES_AT_K), from_the_right) == \
        [""] * 20


KERNEL_SLIPS = [
    ("top_p ignored", PEAKED,
     [("accept = active & (above < top_p) & ", "accept = active & "),
      ("active = active & ((above >= top_p) | ", "active = active & ((above < 0) | ")],
     "top_p is not applied"),
    ("top_k ignored", K_BINDS,
     [(" & (count < top_k)", ""), (" | (count >= top_k))", ")")],
     "top_k is not applied"),
    ("the token itself counted", K_BINDS,
     [("count += tl.sum((p > p_t[:, None])", "count += tl.sum((p >= p_t[:, None])")],
     "the k-th token is left out"),
    ("the token's own mass counted", PEAKED,
     [("above += tl.sum(tl.where(p > p_t[:, None]", "above += tl.sum(tl.where(p >= p_t[:, None]")],
     "the boundary is left out"),
    ("the mass before it in vocabulary order", FLAT,
     [("above += tl.sum(tl.where(p > p_t[:, None]",
       "above += tl.sum(tl.where(cols[None, :] < drawn[:, None]")],
     "whatever their ids"),
]


@pytest.mark.parametrize("name,spec,edits,cause", KERNEL_SLIPS, ids=[s[0] for s in KERNEL_SLIPS])
def test_each_slip_in_the_kernel_fails_its_check_with_its_cause_for_20_seeds(
        tmp_path, name, spec, edits, cause):
    slipped = mutants.mutant(tmp_path, "sampling", *edits,
                             name=f"mutant_sampling_{name.replace(' ', '_').replace(chr(39), '')}")
    result = grade(spec, slipped.top_k_top_p_sample, seed=1)
    assert not result.passed and cause in result.message(), result.message()
    causes = causes_by_seed(spec, slipped.top_k_top_p_sample)
    assert all(cause in found for found in causes), causes


# --- how the draws are made: no sort, rows read about as often as the rounds need -------


def test_a_sort_on_the_host_is_named():
    result = grade(PEAKED, sampling.sort_top_k_top_p_sample)
    assert not result.passed and "aten.sort" in result.message(), result.message()


@triton.jit
def _own_uniforms_kernel(out_ptr, N, seed, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.rand(seed, offsets), mask=offsets < N)


def with_its_own_uniforms(probs, top_k, top_p, uniforms):
    """The course's draw, from uniforms a kernel of its own made up (tl.rand)."""
    own = torch.empty_like(uniforms)
    _own_uniforms_kernel[(triton.cdiv(own.numel(), 1024),)](own, own.numel(), 1234, BLOCK=1024)
    return sampling.top_k_top_p_sample(probs, top_k, top_p, own)


def test_a_kernel_drawing_random_numbers_of_its_own_fails():
    """Draws in distribution prove nothing of the uniforms: draws of one row handed the
    same uniforms must give the same token."""
    result = grade(PEAKED, with_its_own_uniforms)
    assert not result.passed and "must not draw random numbers of its own" in \
        result.message(), result.message()
    # For 20 seeds, its draws otherwise right (torch's own generator, seeded apart).
    generator = torch.Generator().manual_seed(7)
    own = lambda probs, k, p, uniforms: sampling.top_k_top_p_sample(  # noqa: E731
        probs, k, p, torch.rand(uniforms.shape, generator=generator))
    for spec in (PEAKED, TIES, K_BINDS):
        causes = causes_by_seed(spec, own)
        assert all("must not draw random numbers of its own" in c for c in causes), causes


def test_the_copies_of_uniforms_are_left_out_of_the_counts_and_agree_for_the_course_kernel():
    case = PEAKED.cpu_cases[0]
    probs, top_k, top_p, uniforms = SPEC.make_inputs(case, torch.Generator().manual_seed(3),
                                                     CPU)
    reference = SPEC.reference(probs.double(), top_k, top_p, uniforms.double())
    for row in reference.rows:
        assert len(row.pairs) == problem.PAIRS and row.draws == row.span - problem.PAIRS
    tokens = sampling.top_k_top_p_sample(probs, top_k, top_p, uniforms)
    assert all(tokens[row.first + a] == tokens[row.first + b]
               for row in reference.rows for a, b in row.pairs)


def test_int32_tokens_cast_to_int64_on_the_host_pass(tmp_path):
    """Host code may cast: the kernel stores int32 ids, the host makes them int64."""
    narrow = mutants.mutant(
        tmp_path, "sampling",
        ("out = torch.empty(m, dtype=torch.int64, device=probs.device)",
         "out = torch.empty(m, dtype=torch.int32, device=probs.device)"),
        ("        num_warps=min(16, max(4, block_m * block_v // 512)))\n    return out\n",
         "        num_warps=min(16, max(4, block_m * block_v // 512)))\n"
         "    return out.to(torch.int64)\n"), name="mutant_sampling_int32")
    result = grade(only(SPEC, problem.PEAKED, problem.STRIDED), narrow.top_k_top_p_sample)
    assert result.passed, result.message()


def test_tokens_no_kernel_stored_fail():
    def host_tokens(probs, top_k, top_p, uniforms):
        tokens = sampling.top_k_top_p_sample(probs, top_k, top_p, uniforms)
        return torch.from_numpy(tokens.numpy().copy())  # the kernel's, made anew by numpy

    result = grade(PEAKED, host_tokens)
    assert not result.passed, result.message()


def test_reading_every_row_again_and_again_fails():
    def four_times(probs, top_k, top_p, uniforms):
        for _ in range(3):
            sampling.top_k_top_p_sample(probs, top_k, top_p, uniforms)
        return sampling.top_k_top_p_sample(probs, top_k, top_p, uniforms)

    result = grade(PEAKED, four_times)
    assert not result.passed and "reads each row" in result.message(), result.message()


@triton.jit
def _copy_rows_kernel(src_ptr, dst_ptr, N, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=offsets < N), mask=offsets < N)


def test_a_copy_of_the_rows_beside_the_answer_fails():
    """A sorted copy is what a sort-based kernel writes; any copy of the rows shows it."""
    def with_a_copy(probs, top_k, top_p, uniforms):
        scratch = torch.empty_like(probs)
        _copy_rows_kernel[(triton.cdiv(probs.numel(), 65536),)](probs, scratch, probs.numel(),
                                                                 BLOCK=65536)
        return sampling.top_k_top_p_sample(probs, top_k, top_p, uniforms)

    result = grade(PEAKED, with_a_copy)
    assert not result.passed and "beside the answer" in result.message(), result.message()


def test_a_whole_row_in_one_load_fails_on_a_wide_vocabulary(tmp_path):
    whole = mutants.mutant(tmp_path, "sampling",
                           ("min(triton.next_power_of_2(v), 1024 if interpreted else 4096)",
                            "triton.next_power_of_2(v)"), name="mutant_sampling_whole_row")
    result = grade(only(SPEC, problem.WIDE), whole.top_k_top_p_sample)
    assert not result.passed and "in chunks of at most 4096" in result.message(), \
        result.message()


def test_expected_rounds_on_a_small_row():
    """p = (0.5, 0.3, 0.2), top_p = 0.6: the nucleus is the first two. The first round
    accepts unless it draws 0.2 (odds 0.2); the second keeps the first two and accepts."""
    p = np.array([0.2, 0.5, 0.3])
    assert problem.expected_rounds(p, np.array([False, True, True])) == pytest.approx(1.2)


# --- `rooflab bench sampling` ----------------------------------------------------------


def test_the_bench_workloads_build_on_a_cpu_and_answer_in_nucleus():
    loads = sampling_workloads("cpu")  # nothing allocated yet
    assert [load.shape for load in loads] == ["64x128256 top_k=50 top_p=0.9",
                                              "256x128256 top_k=50 top_p=0.9"]
    for load in loads:
        assert next(iter(load.kernels)).startswith("torch.sort")  # the baseline, first
        assert load.cost.bytes == int(load.shape.split("x")[0]) * (128256 * 4 + 12)
    # The callables on a small input of the same kind: every token in its nucleus, the
    # smallest nucleus value worked out as the bench does, with both cuts.
    probs = torch.softmax(torch.randn(4, 300) * 2, -1)
    values = probs.sort(-1, descending=True).values
    inside = (torch.arange(300) < 50) & (values.cumsum(-1) - values < 0.9)
    smallest = torch.where(inside, values, 2.0).min(-1).values
    inputs = (probs, 50, 0.9, torch.rand(4, 32), smallest)
    for kernel in loads[0].kernels.values():
        assert torch.equal(kernel(*inputs), loads[0].reference(*inputs))


def test_the_bench_cut_is_the_graders_where_tokens_tie_at_the_k_th_place():
    """A sort keeps one of the tokens tied at the k-th place; the smallest value it keeps
    is the smallest the grader's nucleus holds, so every tied token passes the check."""
    probs = torch.tensor([[0.4, 0.2, 0.2, 0.2]])
    values = probs.sort(-1, descending=True).values
    inside = (torch.arange(4) < 2) & (values.cumsum(-1) - values < 1.0)
    smallest = torch.where(inside, values, 2.0).min(-1).values
    reference = problem._reference(probs.double(), 2, 1.0, None)
    assert torch.equal(probs[0] >= smallest, torch.from_numpy(reference.rows[0].nucleus))
