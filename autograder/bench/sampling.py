"""``rooflab bench sampling``: top-k and top-p sampling without a sort against the
library's way (``torch.sort``, a running count and sum, a cut, a draw), on a GPU.

Each workload draws one token per row of fp32 probabilities at a vocabulary of 128 256
(Llama 3's) for 64 and 256 rows, top_k = 50 and top_p = 0.9, as vLLM's sampling is
commonly set. FlashInfer, whose algorithm this is, reports more than halving vLLM's whole
sampling time on one H100 with it (its blog, "Sorting-Free GPU Kernels for LLM Sampling",
2025); a sort-based sampler spends most of its time sorting and writing each row.

A draw is random, and the two ways draw different tokens from the same uniforms: what
the benchmark checks, before and after timing, is that every token is in its row's
nucleus. So each callable returns, per row, 1.0 where the token's probability is at least
the smallest in the nucleus (worked out once, when the inputs are made) and 0.0 where not:
a gather of one value a row, next to reading the rows. That is the grader's rule, ties
and all: a sort cuts between tied tokens, but it keeps the first of each tied group the
rule keeps and none of a group it cuts, so the smallest value kept is the rule's. Cost:
the rows read once, a uniform read and a token written per row.
"""

from __future__ import annotations

import torch

from ..problem import Cost
from .workload import Workload

VOCAB, TOP_K, TOP_P, ROUNDS = 128256, 50, 0.9, 32


def _inputs(m: int, device: str) -> tuple:
    """Probabilities (softmax of normal logits × 2), top_k, top_p, the uniforms, and each
    row's smallest nucleus probability."""
    probs = torch.softmax(torch.randn(m, VOCAB, device=device) * 2.0, dim=-1)
    values = probs.sort(dim=-1, descending=True).values
    first_k = torch.arange(VOCAB, device=device) < TOP_K
    inside = first_k & (values.cumsum(dim=-1) - values < TOP_P)
    smallest = torch.where(inside, values, float("inf")).min(dim=-1).values
    return probs, TOP_K, TOP_P, torch.rand(m, ROUNDS, device=device), smallest


def _in_nucleus(sample):
    """A sampler as the benchmark calls it: 1.0 per row whose token is in the nucleus."""

    def run(probs, top_k, top_p, uniforms, smallest):
        tokens = sample(probs, top_k, top_p, uniforms)
        return (probs.gather(1, tokens[:, None]).squeeze(1) >= smallest).float()

    return run


def _all_in(probs, top_k, top_p, uniforms, smallest) -> torch.Tensor:
    return torch.ones(probs.shape[0], device=probs.device)


def sampling_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.sampling import sort_top_k_top_p_sample, top_k_top_p_sample

    return [Workload(
        f"{m}x{VOCAB} top_k={TOP_K} top_p={TOP_P}", torch.float32,
        Cost(0, m * VOCAB * 4 + m * (4 + 8)), lambda m=m: _inputs(m, device),
        {"torch.sort top-k top-p sampling": _in_nucleus(sort_top_k_top_p_sample),
         "rooflab top_k_top_p_sample (no sort)": _in_nucleus(top_k_top_p_sample)},
        _all_in) for m in (64, 256)]
