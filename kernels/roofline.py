"""Lab 00's answers: the FLOPs and compulsory bytes of four operations, the time floor
they set on a card, and a timer that measures a GPU kernel honestly.

Plain Python: counting comes before any kernel. The lab inlines each function into its
notebook, its body the learner's exercise, so the signatures stay as a learner first
meets them (the docstrings say what each argument is).
"""

from __future__ import annotations

import statistics
import time


def cost_vector_add(n, dtype_bytes):
    """FLOPs and compulsory bytes of out = x + y, all three of n elements."""
    ### BEGIN SOLUTION
    flops = n  # one addition per output element
    ### KEY
    nbytes = 3 * n * dtype_bytes  # read x, read y, write out
    ### END KEY
    return flops, nbytes
    ### END SOLUTION


def cost_softmax(rows, cols, dtype_bytes):
    """FLOPs and compulsory bytes of a softmax over each row of a rows x cols matrix."""
    ### BEGIN SOLUTION
    elements = rows * cols
    ### KEY
    flops = 5 * elements  # max, subtract, exp, sum, divide
    nbytes = 2 * elements * dtype_bytes  # input read once, output written once
    ### END KEY
    return flops, nbytes
    ### END SOLUTION


def cost_matmul(m, n, k, dtype_bytes):
    """FLOPs and compulsory bytes of C (m x n) = A (m x k) @ B (k x n)."""
    ### BEGIN SOLUTION
    ### KEY
    flops = 2 * m * n * k  # m*n dot products of length k: k multiplies, k additions
    ### END KEY
    nbytes = (m * k + k * n + m * n) * dtype_bytes  # read A and B, write C
    return flops, nbytes
    ### END SOLUTION


def cost_attention(batch, heads, seq, head_dim, dtype_bytes, causal):
    """FLOPs (the two matmuls only) and compulsory bytes (Q, K, V in; O out)."""
    ### BEGIN SOLUTION
    ### KEY
    flops = 4 * batch * heads * seq * seq * head_dim  # 2 matmuls of 2*S*S*D per head
    ### END KEY
    if causal:
        flops //= 2  # only the lower triangle of the scores is computed
    ### KEY
    nbytes = 4 * batch * heads * seq * head_dim * dtype_bytes  # Q, K, V read; O written
    ### END KEY
    return flops, nbytes
    ### END SOLUTION


def time_floor(flops, nbytes, peak_flops, bandwidth):
    """The least time the work can take, in seconds, and the bound: "memory" or "compute"."""
    ### BEGIN SOLUTION
    compute_s = flops / peak_flops
    memory_s = nbytes / bandwidth
    ### KEY
    return max(compute_s, memory_s), ("compute" if compute_s >= memory_s else "memory")
    ### END KEY
    ### END SOLUTION


def measure(launch, synchronize):
    """Seconds per run of launch(): synchronised, after a warm-up, median of many runs."""
    ### BEGIN SOLUTION
    for _ in range(10):  # warm-up: compilation, allocation, clocks
        launch()
    synchronize()
    times = []
    for _ in range(50):
        ### KEY
        start = time.perf_counter()
        ### END KEY
        launch()
    ### KEY
        synchronize()  # wait for this run's work before reading the clock
        times.append(time.perf_counter() - start)
    return statistics.median(times)
    ### END KEY
    ### END SOLUTION
