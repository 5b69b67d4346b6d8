"""Lab 05 — top-p (nucleus) sampling without a sort. One token per row of probabilities,
drawn from the row's nucleus for ``top_p`` and renormalised, with the uniforms the grader
hands over (``uniforms[i, r]`` for round r of row i).

The answer is random, so it is graded in distribution. A case holds a few distinct rows,
each repeated for many draws. The grader works out each row's nucleus exactly, in
float64: a token is in when the mass of the tokens strictly more probable than it is
below ``top_p`` (tokens of equal probability are in or out together). Then:

1. every draw must be in its row's nucleus: one outside fails the case, with its cause
   named where the draws show it (top_p not applied, the prefix taken in vocabulary
   order, one token too many);
2. the counts of each row's draws must fit p restricted to the nucleus, renormalised: a
   chi-square test over bins of at least 5 expected draws, failed below a p-value of
   1e-6 (a right kernel fails it about once in a million rows; over 20 seeds the slips
   it is there for came out at 1e-9 and below: a draw not renormalised, the boundary
   left out, tied tokens cut apart);
3. from the trace: the probabilities read about as often as rejection sampling needs
   (a draw and the mass above it, per round, for the rounds its rows expect), nothing
   written beside the answer (a sorted copy of the rows, a cumulative sum), and no load
   of more than 4096 probabilities of a row at once (a vocabulary of 128k does not fit
   one program: walk the row in chunks).

fp32 sums and the float64 reference may disagree about a token whose mass above lies
within 1e-5 of ``top_p`` (on a vocabulary of 128k there are such tokens, of tiny
probability): such a token may be drawn or not; every other one must be where the
float64 reference puts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..evidence import poison
from ..problem import Case, Cost, Draw, Hidden, Levels, Problem, Span, register
from . import traced

SIGNATURE = ("(probs: Tensor[m, V] fp32, top_p: float, uniforms: Tensor[m, rounds] fp32) "
             "-> Tensor[m] int64: one token of each row, from its nucleus; round r of row i "
             "uses uniforms[i, r]")
ROUNDS = 32  # uniforms per row: each round accepts with probability >= top_p
MARGIN = 1e-5  # a token whose mass above is this close to top_p may be in or out
P_VALUE = 1e-6  # a row's draws fail the chi-square test below this
CHUNK = 4096  # the most probabilities of one row a load may touch
# Host code may only allocate, view, fill and copy (the engine's rule); named so that the
# problem says what it forbids above all.
SORTING_OPS = frozenset({"sort", "argsort", "topk", "kthvalue", "msort", "multinomial",
                         "cumsum"})

# What a case's rows are.
PEAKED = "peaked rows: a few probable tokens, in random vocabulary order"
FLAT = "flat rows: a nucleus of most of the vocabulary"
TIES = "tied probabilities across the nucleus's edge"
WIDE = "a vocabulary wider than a chunk"
STRIDED = "rows of a wider tensor (stride > V)"
TIMED = "one draw per row, timed"


# --- inputs -----------------------------------------------------------------------------


def _top_p(case: Case) -> float:
    return case.sizes["top_p_pct"] / 100


def _mass_above(p: torch.Tensor) -> torch.Tensor:
    """For each token of the 1-D float64 ``p``, the mass of the tokens strictly more
    probable than it."""
    values, order = p.sort(descending=True)
    before = values.cumsum(0) - values
    # Equal values take the mass before the first of them.
    first = torch.searchsorted(-values, -values, side="left")
    above = torch.empty_like(p)
    above[order] = before[first]
    return above


def _row(case: Case, v: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """One row of probabilities of the case's kind, fp32, summing to 1."""
    if case.note == TIES:  # 0.3, then four tied at 0.1 straddling top_p, then the rest
        rest = torch.softmax(torch.randn(v - 5, generator=gen, device=device) * 0.5, 0) * 0.3
        row = torch.cat([torch.tensor([0.3, 0.1, 0.1, 0.1, 0.1], device=device), rest])
        return row[torch.randperm(v, generator=gen, device=device)].float()
    if case.note == PEAKED:  # each token about 0.6 times as probable as the one before
        logits = -0.5 * torch.arange(v, device=device) \
            + 0.3 * torch.randn(v, generator=gen, device=device)
        logits = logits[torch.randperm(v, generator=gen, device=device)]
    else:
        scale = 0.7 if case.note == FLAT else 2.0
        logits = torch.randn(v, generator=gen, device=device) * scale
    return torch.softmax(logits, 0)


def _inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    """The case's distinct rows, each repeated ``draws`` times, in a [rows * draws, V]
    fp32 tensor (a view with a wider stride for STRIDED), top_p, and the uniforms."""
    v, distinct, draws = case.sizes["v"], case.sizes["rows"], case.sizes["draws"]
    rows = [_row(case, v, gen, device) for _ in range(distinct)]
    probs = torch.stack(rows).repeat_interleave(draws, 0)
    if case.note == STRIDED:
        wide = torch.full((probs.shape[0], v + 37), 0.5, device=device)
        wide[:, :v] = probs
        probs = wide[:, :v]
    uniforms = torch.rand(probs.shape[0], ROUNDS, generator=gen, device=device)
    return probs, _top_p(case), uniforms


def _cost(case: Case) -> Cost:
    m, v = case.sizes["rows"] * case.sizes["draws"], case.sizes["v"]
    return Cost(flops=0, bytes=m * v * 4 + m * (4 + 8))  # the rows once; a uniform, a token


# --- the right answer -------------------------------------------------------------------


@dataclass
class Row:
    """One distinct row of a case, and what its draws should look like."""

    p: np.ndarray  # float64, [V]
    nucleus: np.ndarray  # bool, [V]: the mass of the tokens more probable is below top_p
    allowed: np.ndarray  # bool, [V]: the nucleus, and the tokens within MARGIN of its edge
    first: int  # its first row in the batch
    draws: int


@dataclass
class Reference:
    rows: list[Row]
    top_p: float
    v: int
    m: int


def expected_rounds(p: np.ndarray, nucleus: np.ndarray) -> float:
    """The mean number of rounds of rejection sampling on ``p``: from the kept tokens
    (every one at first), a round draws t; it ends if t is in the nucleus, else the
    next round keeps the tokens more probable than t. Worked out over prefixes of the
    row sorted by probability (a kept set is always one)."""
    order = np.argsort(-p, kind="stable")
    values = p[order]
    inside = int(nucleus.sum())
    # above_count[j]: how many tokens are strictly more probable than the j-th.
    above_count = np.searchsorted(-values, -values, side="left")
    mass = np.concatenate([[0.0], np.cumsum(values)])
    rounds = np.ones(len(p) + 1)  # rounds[k]: from the k most probable tokens kept
    weighted = 0.0  # sum over kept tokens outside the nucleus of p_t * rounds after t
    for k in range(inside + 1, len(p) + 1):
        t = k - 1
        weighted += values[t] * rounds[above_count[t]]
        rounds[k] = 1 + weighted / mass[k] if mass[k] > 0 else 1.0
    return float(rounds[len(p)])


def _reference(probs: torch.Tensor, top_p: float, uniforms: torch.Tensor) -> Reference:
    distinct, counts = torch.unique_consecutive(probs, dim=0, return_counts=True)
    rows, first = [], 0
    for p, count in zip(distinct, counts.tolist(), strict=True):
        above = _mass_above(p).cpu().numpy()
        rows.append(Row(p.cpu().numpy(), above < top_p, above < top_p + MARGIN, first, count))
        first += count
    return Reference(rows, top_p, probs.shape[1], probs.shape[0])


# --- comparing draws with it, and naming the classic slips --------------------------------


def chi_square(counts: np.ndarray, expected: np.ndarray) -> tuple[float, int, float]:
    """Pearson's statistic of ``counts`` against ``expected`` (same total), over bins
    of at least 5 expected draws (tokens pooled from the most probable down), its degrees
    of freedom and its p-value."""
    order = np.argsort(-expected, kind="stable")
    bins_observed, bins_expected, o, e = [], [], 0.0, 0.0
    for token in order:
        o, e = o + counts[token], e + expected[token]
        if e >= 5:
            bins_observed.append(o)
            bins_expected.append(e)
            o = e = 0.0
    if bins_expected and e:  # the tail: into the last bin
        bins_observed[-1] += o
        bins_expected[-1] += e
    observed, wanted = np.array(bins_observed), np.array(bins_expected)
    dof = len(wanted) - 1
    if dof < 1:
        return 0.0, 0, 1.0
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return statistic, dof, p_value


def _outside_cause(row: Row, index: int, counts: np.ndarray, top_p: float) -> str:
    """Draws outside the nucleus: which, and the cause the draws show, if any."""
    p, nucleus = row.p, row.nucleus
    outside = np.flatnonzero((counts > 0) & ~row.allowed)
    worst = outside[np.argmax(counts[outside])]
    head = (f"row {index} (rows {row.first}..{row.first + row.draws - 1}): drew token "
            f"{worst} (p = {p[worst]:.4g}) {int(counts[worst])} times, outside the nucleus "
            f"of top_p = {top_p:g} ({int(nucleus.sum())} tokens, the most probable ones "
            "whose mass before them is below top_p)")
    out_mass = float(p[~nucleus].sum())
    drawn_out = int(counts[~nucleus].sum())
    in_vocab_order = np.cumsum(p) - p < top_p  # a prefix of the row as it lies
    unseen = nucleus & ~in_vocab_order  # nucleus tokens past that prefix
    expected_there = float(p[unseen].sum() / p[nucleus].sum()) * row.draws
    if bool(in_vocab_order[counts > 0].all()) and counts[unseen].sum() == 0 and \
            expected_there >= 10:
        return (f"{head}. Every draw lies in the first tokens of the row in vocabulary order "
                "whose mass before them is below top_p, and the nucleus tokens past them never "
                f"came, where {expected_there:.0f} draws were expected: the nucleus is the "
                "most probable tokens, whatever their ids")
    most_probable_out = int(np.argmax(np.where(nucleus, -1.0, p)))
    others = (out_mass - p[worst]) / out_mass * drawn_out  # if the whole row were drawn
    if len(outside) == 1 and worst == most_probable_out and drawn_out >= 5 and others >= 5:
        return (f"{head}. It is the most probable token outside, and the only one drawn: the "
                "nucleus has one token too many. A token is in when the mass of the tokens "
                "more probable than it is below top_p (the mass before it, not with it)")
    beyond = float(p[~in_vocab_order].sum()) * row.draws  # if the whole row were drawn
    share = drawn_out / row.draws
    # Named only where the draws can tell: at least 20 expected outside.
    whole = out_mass * row.draws >= 20 and \
        abs(share - out_mass) <= 3 * np.sqrt(out_mass * (1 - out_mass) / row.draws) and \
        chi_square(counts, p * row.draws)[2] >= 1e-3
    if whole and beyond >= 5 and counts[~in_vocab_order].sum() > 0:
        return (f"{head}. {share:.0%} of the draws are outside, and they "
                f"follow the whole distribution (which puts {out_mass:.0%} of its mass "
                "there): top_p is not applied")
    return head


def _missing_cause(row: Row, counts: np.ndarray, expected: np.ndarray) -> str:
    """Nucleus tokens never drawn where many draws were expected: the boundary left out,
    or tied tokens cut apart."""
    p, nucleus = row.p, row.nucleus
    edge = nucleus & (p <= p[nucleus].min())
    if bool((counts[edge] == 0).all()) and expected[edge].sum() >= 15:
        return (f"its least probable nucleus token{'s' if edge.sum() > 1 else ''} "
                f"({', '.join(str(t) for t in np.flatnonzero(edge))}) never came, where "
                f"{expected[edge].sum():.0f} draws were expected: the boundary is left out. A "
                "token is in when the mass of the tokens strictly more probable than it is "
                "below top_p: its own mass does not count, nor that of tokens tied with it")
    for value in np.unique(p[nucleus]):
        tied = nucleus & (p == value)
        missing = tied & (counts == 0) & (expected >= 15)
        if tied.sum() > 1 and missing.any() and (tied & (counts > 0)).any():
            return (f"of the {int(tied.sum())} tokens tied at p = {value:.4g}, "
                    f"{', '.join(str(t) for t in np.flatnonzero(missing))} never came while "
                    "the others did: tied tokens are in the nucleus or out of it together "
                    "(the mass strictly above them decides), not cut in the order a sort "
                    "left them")
    return ""


def _row_cause(row: Row, index: int, tokens: np.ndarray, top_p: float) -> str:
    counts = np.bincount(tokens, minlength=len(row.p)).astype(np.float64)
    if bool((counts[~row.allowed] > 0).any()):
        return _outside_cause(row, index, counts, top_p)
    expected = np.where(row.allowed, row.p, 0.0)
    expected *= row.draws / expected.sum()
    statistic, dof, p_value = chi_square(counts, expected)
    if p_value >= P_VALUE:
        return ""
    head = (f"row {index}: the draws do not follow p restricted to the nucleus, renormalised "
            f"(chi-square {statistic:.1f} on {dof} degrees of freedom, p-value "
            f"{p_value:.1e}, below {P_VALUE:g})")
    missing = _missing_cause(row, counts, expected)
    if missing:
        return f"{head}: {missing}"
    excess = counts - expected
    worst = int(np.argmax(excess))
    line = (f"{head}: token {worst} came {int(counts[worst])} times, expected "
            f"{expected[worst]:.1f}")
    if excess[worst] > 0.5 * excess[excess > 0].sum():
        line += (". One token takes most of the excess: the shape of a draw whose u went past "
                 "the kept tokens' mass and fell back on one token (after a rejection, a round "
                 "draws from the kept tokens only: u times their mass, not times 1)")
    return line


def compare(output: object, reference: Reference) -> str:
    """"" if the draws are right, else what is wrong and, where they show it, why."""
    if not isinstance(output, torch.Tensor):
        return f"returned {type(output).__name__}, expected a tensor of token ids"
    if tuple(output.shape) != (reference.m,) or output.dtype != torch.int64:
        return (f"returned shape {tuple(output.shape)} {str(output.dtype).removeprefix('torch.')}"
                f", expected ({reference.m},) int64: one token id per row")
    unwritten = poison.unwritten_mask(output)
    if bool(unwritten.any()):
        return (f"{int(unwritten.sum())} of {reference.m} tokens were never written (they "
                "hold the poison that fills fresh memory during a check): a missing row?")
    tokens = output.cpu().numpy()
    bad = np.flatnonzero((tokens < 0) | (tokens >= reference.v))
    if len(bad):
        return (f"row {bad[0]}: token {tokens[bad[0]]} is not a token id (V = {reference.v})"
                + (f": no round accepted in the {ROUNDS} given, which happens once in "
                   f"{1 / (1 - reference.top_p) ** ROUNDS:.0e} rows; is the acceptance test "
                   "right?" if tokens[bad[0]] == -1 else ""))
    wrong = [cause for index, row in enumerate(reference.rows)
             if (cause := _row_cause(row, index, tokens[row.first:row.first + row.draws],
                                     reference.top_p))]
    # The first row whose draws name a cause (". " follows what is wrong), else the first.
    return next((cause for cause in wrong if ". " in cause), wrong[0] if wrong else "")


# --- what the trace shows ---------------------------------------------------------------


def widest_row_load(launches: list, probs: torch.Tensor) -> int:
    """The most probabilities of one row that one load of one program touched."""
    start, _ = traced._span(probs)
    row_bytes = probs.stride(0) * probs.element_size()
    end = start + probs.shape[0] * row_bytes
    widest = 0
    for launch in launches:
        for access in launch.accesses:
            if access.kind != "load":
                continue
            hit = access.addresses[(access.addresses >= start) & (access.addresses < end)
                                   & access.active]
            if hit.size:
                rows = ((hit - start) // row_bytes).astype(np.int64)
                widest = max(widest, int(np.bincount(rows).max()))
    return widest


def structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """From the trace: the kernels drew the tokens, read the rows about as often as
    rejection sampling needs, wrote nothing beside the answer, and walked rows in chunks."""
    probs, top_p, _ = inputs
    if isinstance(output, torch.Tensor) and \
            traced.bytes_moved(launches, output, "store") < output.nbytes:
        return ("the tokens were not written by a kernel: the answer must come out of the "
                "kernel's own stores")
    reference = _reference(probs.double(), top_p, inputs[2])
    row_bytes = probs.shape[1] * probs.element_size()
    reads = traced.bytes_moved(launches, probs, "load") / (probs.shape[0] * row_bytes)
    rounds = float(np.mean([expected_rounds(row.p, row.nucleus) for row in reference.rows]))
    allowed = 2 * rounds + 2
    if reads > allowed:
        return (f"reads each row {reads:.1f} times on average; rejection sampling needs about "
                f"{2 * rounds:.1f} here (its rows expect {rounds:.2f} rounds, each a draw and "
                "the mass above the token drawn, one read each), and {allowed:.1f} are "
                "allowed. A sort, or a search of the threshold by bisection, reads far more")
    scratch = traced.requested(launches, "store") - traced.bytes_moved(launches, output,
                                                                        "store")
    if scratch > probs.shape[0] * row_bytes // 4:
        return (f"writes {scratch:,} bytes beside the answer, {scratch / probs.nbytes:.2f}× "
                "the rows: a sorted copy, or a cumulative sum, of the probabilities. Rejection "
                "sampling keeps a threshold and a few sums per row, nothing the size of a row")
    widest = widest_row_load(launches, probs)
    if widest > CHUNK:
        return (f"loads {widest} probabilities of one row at once: on a GPU a vocabulary of "
                f"128k does not fit one program. Walk each row in chunks of at most {CHUNK}")
    return ""


# --- the problem ------------------------------------------------------------------------


def _case(v: int, rows: int, draws: int, top_p_pct: int, note: str, **fields) -> Case:
    return Case({"v": v, "rows": rows, "draws": draws, "top_p_pct": top_p_pct},
                torch.float32, note=note, **fields)


def _sort_sample(probs: torch.Tensor, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    from rooflab.kernels.sampling import sort_top_p_sample

    return sort_top_p_sample(probs, top_p, uniforms)


register(Problem(
    id="topk/top_p", title="Top-p sampling without a sort: rejection over a threshold",
    signature=SIGNATURE, make_inputs=_inputs, reference=_reference, cost=_cost,
    compare=compare, trace_check=structure, library_ops=SORTING_OPS,
    solution="rooflab.kernels.sampling:top_p_sample",
    cpu_cases=[
        _case(100, 3, 300, 70, PEAKED),
        _case(256, 2, 300, 90, FLAT),
        _case(64, 2, 400, 45, TIES),
        _case(5000, 2, 32, 80, WIDE),
        _case(300, 2, 100, 85, STRIDED),
    ],
    gpu_cases=[
        _case(32000, 4, 2048, 70, PEAKED),
        _case(50257, 2, 2048, 90, FLAT),
        _case(128256, 2, 1024, 45, TIES),
        _case(151936, 2, 256, 80, WIDE),
        _case(32000, 2, 1024, 85, STRIDED),
        _case(128256, 256, 1, 90, TIMED, timed=True),
    ],
    # Odd vocabularies (no power-of-two chunk divides them), any top_p: plain random rows.
    hidden=Hidden(cpu=Draw({"v": Span(65, 999, odd=True), "rows": Span(2, 3),
                            "draws": Span(100, 200), "top_p_pct": Span(60, 95)}),
                  gpu=Draw({"v": Span(30001, 160001, odd=True), "rows": Span(2, 4),
                            "draws": Span(512, 1024), "top_p_pct": Span(60, 95)})),
    # Nothing measured yet. The kernel reads a row about 2 × the rounds its distribution
    # needs (one to three on flat rows); torch.sort-based sampling sorts and writes every
    # row several times. FlashInfer reports more than halving vLLM's sampling time on one
    # H100 with this algorithm. The bars are low until a GPU has measured it (`rooflab
    # bench sampling`).
    levels=Levels(passing=0.1, good=0.25, excellent=0.4),
    baseline=_sort_sample, baseline_name="torch.sort-based top-p sampling",
    at_least_vs_baseline=1.5,
    hints=("Keep a threshold `low` per row (at first below every probability) and the mass of "
           "the tokens above it. A round draws from the kept tokens by inverse CDF: the first "
           "where the running sum of kept probabilities passes u times their mass. Then add up "
           "the mass of the tokens more probable than the one drawn: below top_p, accept; else "
           "it becomes the new threshold and its mass the new kept mass.",
           "In each chunk: kept = tl.where(p > low[:, None], p, 0.0); running = before[:, None] "
           "+ tl.cumsum(kept, 1); the first column where running > u * kept_mass is the "
           "candidate (tl.min of the columns that pass, V where none does). After the pass of "
           "the mass above: accept = active & (above < top_p); the rejected rows take low = "
           "p_t and kept_mass = above."),
    answer_in=("top_p_kernel",),
))
