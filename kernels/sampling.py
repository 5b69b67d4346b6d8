"""Top-k and top-p (nucleus) sampling without sorting the vocabulary, as FlashInfer does it.

A language model's next token is drawn from the most probable tokens of its row, cut two
ways at once: the ``top_k`` most probable, and the **nucleus**, the most probable tokens
whose mass before them is below ``top_p``; what both keep is renormalised and drawn from.
The library way sorts every row (128 000 to 256 000 probabilities), counts and sums down
the sorted row, cuts, and draws: a sort moves the row through memory several times and
writes a sorted copy of it. Sampling needs none of that.

**Rejection over a threshold.** Keep the tokens above a probability ``low`` (at first,
all of them). Each round draws a token t from the kept ones, by inverse CDF with one
uniform, then counts the tokens more probable than t and adds up their mass. If fewer
than ``top_k`` are and their mass is below ``top_p``, t is kept by both cuts: accept it.
If not, no token as probable as t or less is: raise ``low`` to p_t and draw again.
Conditioned on acceptance, the draw is exactly p restricted to the kept set and
renormalised (a draw from the kept tokens that lands in the set is a draw from the set);
``low`` rises strictly, so it ends. A round reads the row twice at most: the draw, which
can stop at its token, and the count and mass above it, one pass for both.

How soon: the kept set is a prefix of the row by probability, of mass N (at least
``top_p`` with top-p alone, at least top_k / V with top-k alone, the smaller of the two
with both). A round accepts with probability N over the kept mass, and a rejection
leaves a kept mass that is, in distribution, at most a uniform fraction of the last one
(the mass above a token drawn in proportion to p). So the rounds are, in distribution,
at most 1 + Poisson(ln 1/N), and a row gets -1 with odds at most P(Poisson(ln 1/N) >=
ROUNDS): at ROUNDS = 32, below 1e-38 with top-p alone and top_p >= 0.45, 1e-10 with
top_k = 50 of 128k tokens, 1e-6 at worst (top_k = 1 on a flat row of 128k, N = 1/V).

Ties: a token is kept when the count and the mass of the tokens *strictly* more probable
pass both cuts, so tokens of equal probability are in or out together (a sort would cut
between them in whatever order it left them).

``sort_top_k_top_p_sample`` is the library's way, for the benchmark and to compare draws
with.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rooflab.autograder.device import interpreter_enabled


@triton.jit
def top_k_top_p_kernel(probs_ptr, uniforms_ptr, out_ptr, M, V, ROUNDS, top_k, top_p,
                       stride_pm, stride_um, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    """Program i draws one token for each of rows i·BLOCK_M … (i+1)·BLOCK_M - 1, walking
    each row in chunks of BLOCK_V; round r of a row uses its uniform r. A row that no
    round accepted gets -1: the rounds a row needs are at most 1 + Poisson(ln 1/N), N the
    mass both cuts keep, so 32 leave one row in a million undrawn at worst."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_start = probs_ptr + rows.to(tl.int64) * stride_pm  # past 2**31 on a big batch
    active = rows < M  # rows still drawing
    low = tl.full((BLOCK_M,), -1.0, tl.float32)  # tokens with p > low are kept: all, at first
    kept_mass = tl.full((BLOCK_M,), 1.0, tl.float32)  # their mass
    token = tl.full((BLOCK_M,), -1, tl.int64)
    r = 0
    while (r < ROUNDS) & (tl.max(active.to(tl.int32), 0) > 0):
        u = tl.load(uniforms_ptr + rows * stride_um + r, mask=active, other=0.0)
        # The draw: the first kept token where the running sum of the kept mass passes
        # u · kept_mass. A row stops reading at the chunk that holds its token.
        before = tl.zeros((BLOCK_M,), tl.float32)  # kept mass in the chunks before
        drawn = tl.full((BLOCK_M,), V, tl.int32)  # V: not found yet
        last = tl.zeros((BLOCK_M,), tl.int32)  # the last kept token seen
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            looking = active & (drawn == V)
            p = tl.load(row_start[:, None] + cols[None, :],
                        mask=looking[:, None] & (cols < V)[None, :], other=0.0)
            ### BEGIN SOLUTION
            kept = tl.where(p > low[:, None], p, 0.0)
            ### KEY
            running = before[:, None] + tl.cumsum(kept, 1)
            passed = tl.where(running > (u * kept_mass)[:, None], cols[None, :], V)
            ### END KEY
            drawn = tl.minimum(drawn, tl.min(passed, 1))
            last = tl.maximum(last, tl.max(tl.where(kept > 0, cols[None, :], 0), 1))
            before += tl.sum(kept, 1)
            ### END SOLUTION
        # Rounding can leave u · kept_mass at or past the last running sum: its token.
        drawn = tl.where(drawn < V, drawn, last)
        p_t = tl.load(row_start + drawn, mask=active, other=1.0)
        # The mass of the tokens more probable than the one drawn, and how many they are:
        # top-k costs one more sum in the same pass.
        above = tl.zeros((BLOCK_M,), tl.float32)
        count = tl.zeros((BLOCK_M,), tl.int32)
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            p = tl.load(row_start[:, None] + cols[None, :],
                        mask=active[:, None] & (cols < V)[None, :], other=0.0)
            above += tl.sum(tl.where(p > p_t[:, None], p, 0.0), 1)
            ### BEGIN SOLUTION
            ### KEY
            count += tl.sum((p > p_t[:, None]).to(tl.int32), 1)
            ### END KEY
            ### END SOLUTION
        ### BEGIN SOLUTION
        ### KEY
        accept = active & (above < top_p) & (count < top_k)
        ### END KEY
        token = tl.where(accept, drawn.to(tl.int64), token)
        active = active & ((above >= top_p) | (count >= top_k))
        ### KEY
        # Rejected: no token as probable as the one drawn passes both cuts.
        low = tl.where(active, p_t, low)
        ### END KEY
        kept_mass = tl.where(active, above, kept_mass)
        ### END SOLUTION
        r += 1
    tl.store(out_ptr + rows, token, mask=rows < M)


def top_k_top_p_sample(probs: torch.Tensor, top_k: int, top_p: float,
                       uniforms: torch.Tensor) -> torch.Tensor:
    """One token of each row of ``probs`` ([m, V] fp32, rows summing to 1), drawn from
    the tokens with fewer than ``top_k`` more probable than them and less than ``top_p``
    of mass above them, as int64 ids [m] (top_k >= V: no top-k; top_p = 1: no top-p).
    ``uniforms`` ([m, rounds] fp32, in [0, 1)) are the randomness: round r of row i uses
    ``uniforms[i, r]``.

    Chunks of up to 4096 probabilities a row (1024 in the interpreter); where a row is
    shorter, several rows share a program. On a GPU, one program per row at a vocabulary
    of 128k: with fewer rows than multiprocessors, most of the chip waits (FlashInfer
    has the same limit, one thread block per row).
    """
    assert probs.dim() == 2 and uniforms.dim() == 2 and uniforms.shape[0] == probs.shape[0]
    assert probs.dtype == torch.float32 and uniforms.dtype == torch.float32
    m, v = probs.shape
    out = torch.empty(m, dtype=torch.int64, device=probs.device)
    interpreted = interpreter_enabled()
    block_v = min(triton.next_power_of_2(v), 1024 if interpreted else 4096)
    # In the interpreter a program costs about the same whatever its tile (numpy's work, a
    # few hundred operations a round whatever their size): as many rows each as fit.
    tile = 1 << 18 if interpreted else 4096
    block_m = max(1, min(triton.next_power_of_2(m), tile // block_v))
    top_k_top_p_kernel[(triton.cdiv(m, block_m),)](
        probs, uniforms, out, m, v, uniforms.shape[1], min(top_k, v), top_p, probs.stride(0),
        uniforms.stride(0), BLOCK_M=block_m, BLOCK_V=block_v,
        num_warps=min(16, max(4, block_m * block_v // 512)))
    return out


def sort_top_k_top_p_sample(probs: torch.Tensor, top_k: int, top_p: float,
                            uniforms: torch.Tensor) -> torch.Tensor:
    """The library's way: sort each row, keep its first ``top_k`` tokens, cut them where
    the mass before a token reaches ``top_p``, renormalise, and draw by inverse CDF with
    ``uniforms[:, 0]``. It sorts and writes [m, V] several times over (the sorted values,
    their order, their sum). A sort cuts between tied tokens where the rule keeps them
    together: the draws differ only on rows that tie at an edge."""
    values, order = torch.sort(probs, dim=-1, descending=True)
    cumulative = values.cumsum(dim=-1)
    first_k = torch.arange(probs.shape[1], device=probs.device) < top_k
    kept = torch.where(first_k & (cumulative - values < top_p), values, 0.0)
    # The first token of the sorted row whose running sum passes u times the kept mass.
    running = kept.cumsum(dim=-1)
    u = uniforms[:, :1] * running[:, -1:]
    position = (running <= u).sum(dim=-1, keepdim=True).clamp_max(probs.shape[1] - 1)
    return order.gather(-1, position).squeeze(-1)
