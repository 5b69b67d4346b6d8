"""Lab 03 — softmax. Memory-bound: graded against the bandwidth roof; the checks include
rows of large magnitude, where a softmax that does not subtract the row max overflows."""

from __future__ import annotations

import torch

from ..problem import (
    Case,
    Cost,
    Draw,
    Hidden,
    Levels,
    Problem,
    Span,
    Structure,
    random_tensor,
    register,
)
from . import traced

# What a wrong softmax looks like, and why: the engine adds this to a failing case.
OVERFLOW = ("exp overflows for inputs above ~88.7 (fp32): subtract the row max before exp; "
            "softmax(x) = softmax(x - max(x)), and then every exp is at most 1")


# Rows that start with a long run of -inf (masked positions, as in attention): a one-pass
# softmax meets whole blocks whose max is -inf, and -inf - (-inf) is NaN. The run
# (``masked`` in the case's sizes) is longer than any block a kernel walking the row would
# take, so the bug shows whatever the block size.
MASKED_START = "each row starts with a long run of masked (-inf) positions"


def _inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    m, n = case.sizes["m"], case.sizes["n"]
    if "x" in case.transposed:  # a strided view: rows n apart in memory, columns 1 apart
        return (random_tensor((n, m), case.dtype, gen, device, case.scale).T,)
    x = random_tensor((m, n), case.dtype, gen, device, case.scale)
    if "masked" in case.sizes:
        x[:, :case.sizes["masked"]] = float("-inf")
    return (x,)


def _cost(case: Case) -> Cost:
    m, n = case.sizes["m"], case.sizes["n"]
    size = case.dtype.itemsize
    # max, subtract, exp, add, divide: 5 FLOPs an element, far below any ridge.
    return Cost(flops=5 * m * n, bytes=2 * m * n * size)


def _overflowed(x: torch.Tensor, got: torch.Tensor) -> bool:
    """Does the output look like exp(x) overflowing, and only that? Then each row that went
    wrong holds values above ~88.7, its outputs are NaN where exp(x) was inf (inf / inf)
    and 0 elsewhere (finite / inf), and nothing is inf."""
    bad_rows = ~torch.isfinite(got).all(dim=-1)
    if not bad_rows.any() or torch.isinf(got).any():
        return False
    rows, outputs = x[bad_rows].double(), got[bad_rows]
    finite = torch.isfinite(outputs)
    return bool((rows.nan_to_num(neginf=0.0).amax(dim=-1) > 80).all()
                and (outputs[finite] == 0).all())


def diagnose_for(online: bool):
    """The usual causes of a wrong softmax, named from what the output looks like, and
    only when it looks like them; the advice fits the exercise (one block a row, or a
    running max and sum over the blocks of a row)."""

    def diagnose(inputs: tuple, output: torch.Tensor, reference: torch.Tensor) -> str:
        (x,) = inputs
        got = output.double()
        if torch.isnan(got).any() and torch.isinf(x).any() and torch.isfinite(reference).all():
            return ("NaN where the row starts with -inf: while every value seen so far is "
                    "-inf, the running max is -inf and exp(x - max) is exp(-inf - (-inf)) = "
                    "NaN; subtract 0 instead until the max is finite")
        if _overflowed(x, got):
            return OVERFLOW
        sums = got.sum(dim=-1)
        if torch.isfinite(sums).all() and (sums - 1).abs().max() > 1e-2:
            advice = ("Masked lanes must add nothing (load them as -inf, so exp gives 0)")
            if online:
                advice += ("; and whenever a block raises the running max from m_old to "
                           "m_new, rescale the running sum by exp(m_old - m_new)")
            return (f"rows sum to {sums.min():.3g}…{sums.max():.3g}, not 1: the denominator "
                    f"is wrong. {advice}")
        return ""

    return diagnose


def online_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """softmax/online, from the trace: the row is walked in blocks, the statistics take
    one pass over x (the max and the sum together), and nothing the size of x is kept in
    memory between passes."""
    (x,) = inputs
    m, n = case.sizes["m"], case.sizes["n"]
    x_bytes, y_bytes = m * n * x.element_size(), output.numel() * output.element_size()
    loaded = traced.bytes_moved(launches, x, "load")
    if loaded > 2 * x_bytes:
        return (f"reads x {loaded / x_bytes:.1f} times: the max and the sum in passes of their "
                "own. One pass over the blocks of a row can keep both (rescale the running "
                "sum whenever the max grows); a second writes the output")
    beyond = traced.requested(launches) - loaded - y_bytes
    if beyond > 64 * m:  # a few numbers a row (a max, a sum) are fine; a copy of x is not
        return (f"moves {beyond:,} bytes besides reading x and writing the output, "
                f"{beyond / x_bytes:.1f}× the size of x: an intermediate kept in memory "
                "between passes. Keep the running max and sum in registers")
    widest = traced.widest_load(launches, x)
    if n > 2048 and widest >= n:
        return (f"loads a whole row ({n:,} elements) at once: that is the fused softmax "
                "(softmax/fused). This exercise is for rows longer than any block: walk each "
                "row in blocks of a fixed size, up to 2048 elements here")
    return ""


SOFTMAX_OPS = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax", "exp", "sum",
                         "amax", "max", "div", "sub", "logsumexp"})


def _softmax_problem(id: str, title: str, **fields) -> Problem:
    return register(Problem(
        id=id, title=title, signature="(x: Tensor[m, n]) -> Tensor[m, n]  # softmax(x, dim=-1)",
        make_inputs=_inputs, reference=lambda x: torch.softmax(x, dim=-1), cost=_cost,
        library_ops=SOFTMAX_OPS, out_contiguous=True, **fields))


LARGE = "large magnitudes: exp overflows unless the row max is subtracted"

_softmax_problem(
    "softmax/fused", "Fused softmax: one read, one write, one program per row",
    diagnose=diagnose_for(online=False),
    solution="rooflab.kernels.softmax:softmax_fused",
    cpu_cases=[
        Case({"m": 7, "n": 100}, torch.float32),
        Case({"m": 33, "n": 781}, torch.float32, note="ragged rows"),
        Case({"m": 16, "n": 1025}, torch.float16, note="just past a power of two"),
        Case({"m": 20, "n": 300}, torch.float32, transposed=("x",), note="strided rows"),
        Case({"m": 8, "n": 300}, torch.float32, scale=1000.0, note=LARGE),
        Case({"m": 8, "n": 200}, torch.float16, scale=300.0, note=LARGE),
        Case({"m": 64, "n": 512}, torch.float32, note="traced for traffic"),
        Case({"m": 9, "n": 130}, torch.bfloat16),
    ],
    gpu_cases=[
        Case({"m": 1823, "n": 781}, torch.float32, note="ragged rows"),
        Case({"m": 4096, "n": 1000}, torch.float32, scale=1000.0, note=LARGE),
        Case({"m": 4096, "n": 4096}, torch.bfloat16),
        Case({"m": 16384, "n": 8192}, torch.float16, note="timed: rows fit one block",
             timed=True),
    ],
    # Odd row lengths: the block is the next power of two, its tail masked as -inf.
    hidden=Hidden(cpu=Draw({"m": Span(3, 13), "n": Span(129, 999, odd=True)}, count=2),
                  gpu=Draw({"m": Span(1000, 4000), "n": Span(1001, 8191, odd=True)})),
    # One read and one write of HBM: at least 70% of the measured copy bandwidth.
    levels=Levels(passing=0.7, good=0.8, excellent=0.9),
    # Three passes through memory move 2.5–3.5× the compulsory bytes; one pass, 1×. On a
    # card whose L2 is small next to these rows, as a real L2 is next to real tensors.
    structure=Structure(dram_over_compulsory=1.3, l2_bytes=16 * 1024, sm_count=8),
    hints=("One program per row: load the whole row as one block (BLOCK = the next power "
           "of two ≥ n), masked lanes as -inf so they add nothing to the max or the sum.",
           "Subtract the row max before exp: then every exp is ≤ 1 and nothing overflows; "
           "the result is the same, since the factor exp(-max) cancels."),
    answer_in=("softmax_fused_kernel",),
)

_softmax_problem(
    "softmax/online", "Online softmax: rows longer than a block, running max and sum",
    diagnose=diagnose_for(online=True),
    solution="rooflab.kernels.softmax:softmax_online",
    cpu_cases=[
        Case({"m": 4, "n": 3000}, torch.float32, note="three blocks a row"),
        Case({"m": 3, "n": 2100}, torch.float16, scale=300.0, note=LARGE),
        Case({"m": 5, "n": 1030}, torch.float32, transposed=("x",), note="strided rows"),
        Case({"m": 2, "n": 4096}, torch.float32, scale=8.0, note="the max grows along the row"),
        Case({"m": 3, "n": 20000, "masked": 17000}, torch.float32, note=MASKED_START),
        Case({"m": 3, "n": 2000}, torch.bfloat16),
    ],
    gpu_cases=[
        Case({"m": 64, "n": 200003}, torch.float32, note="ragged, long rows"),
        Case({"m": 64, "n": 140000, "masked": 135000}, torch.float32, note=MASKED_START),
        Case({"m": 512, "n": 100000}, torch.float32, scale=1000.0, note=LARGE),
        Case({"m": 1024, "n": 65536}, torch.bfloat16, note="timed", timed=True),
    ],
    # It reads x twice (once for the statistics, once to write): at rows this long the
    # second read mostly misses L2, 3 of every 2 compulsory bytes, about 67% of the roof at
    # best. The course's kernel (blocks of 1024) reached 43% on an H200: the bar leaves it
    # a margin of 10% of the bar, and `rooflab bench softmax` times wider blocks.
    levels=Levels(passing=0.35, good=0.5, excellent=0.6),
    trace_check=online_structure,
    hints=("Walk the row in blocks. Keep two scalars: m, the max so far, and d, the sum of "
           "exp(x - m) so far. A second loop writes exp(x - m) / d.",
           "When a block raises the max from m to m_new, every term already in d was "
           "computed against the old max: multiply d by exp(m - m_new) before adding the "
           "block's own sum of exp(x - m_new)."),
    answer_in=("softmax_online_kernel",),
)
