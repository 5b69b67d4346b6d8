"""Step 2 of the matmul ladder, in CUDA C: which thread computes which element of C.

One thread per element of C, each walking K on its own, exactly as naive as step 1. The
only difference between the two kernels is the line that turns a thread's global index
``i`` into the ``row`` and ``col`` it computes:

* ``i % M, i / M`` (consecutive threads walk *down* a column of C): the 32 threads of a
  warp read A at 32 different rows, 32 sectors for 128 useful bytes, and write C 32
  rows apart. Every access is scattered.
* consecutive threads walking *along* a row of C (``ALONG_THE_ROWS``): the warp reads one
  element of A (a broadcast), 32 consecutive elements of B and writes 32 consecutive
  elements of C: 4 sectors each, every byte used. That is coalescing.

Triton makes this choice for you (its compiler lays threads along the contiguous axis of
each tile); in CUDA C, it is one line. The kernels run on a GPU (through CuPy); on a CPU,
NVRTC compiles them and the grader says "needs a GPU".
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from rooflab.autograder.device.cuda import CudaKernel

# The kernel every mapping shares; {mapping} declares `row` and `col` from `i`.
THREAD_PER_ELEMENT = r"""
extern "C" __global__ void {name}(const float* a, const float* b, float* c,
                                  int M, int N, int K,
                                  long long sam, long long sak, long long sbk, long long sbn) {{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)M * N) return;
{mapping}
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {{
        acc += a[row * sam + k * sak] * b[k * sbk + col * sbn];
    }}
    c[row * N + col] = acc;
}}
"""

# Consecutive threads take consecutive rows: uncoalesced.
DOWN_THE_COLUMNS = """
    long long row = i % M, col = i / M;
"""

# Consecutive threads take consecutive columns: coalesced.
ALONG_THE_ROWS = """
    // BEGIN SOLUTION
    // KEY
    long long row = i / N, col = i % N;
    // END KEY
    // END SOLUTION
"""


class CudaMatmul:
    """a @ b for fp32 matrices of any strides, one CUDA thread per element of C, threads
    mapped to elements by ``mapping`` (CUDA C that sets ``row`` and ``col`` from ``i``)."""

    THREADS = 256

    def __init__(self, mapping: str, name: str = "matmul_thread_per_element") -> None:
        self.kernel = CudaKernel(THREAD_PER_ELEMENT.format(name=name, mapping=mapping), name)
        self.cuda_kernels = [self.kernel]  # what the grader compile-checks on a CPU

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "need (M×K) @ (K×N)"
        assert a.dtype == b.dtype == torch.float32, "the CUDA C kernels take fp32"
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), dtype=a.dtype, device=a.device)
        if c.numel():
            strides = [np.int64(s) for s in (*a.stride(), *b.stride())]  # `long long`
            self.kernel((triton.cdiv(M * N, self.THREADS),), (self.THREADS,),
                        (a, b, c, M, N, K, *strides))
        return c


matmul_cuda_uncoalesced = CudaMatmul(DOWN_THE_COLUMNS, "matmul_down_the_columns")
matmul_cuda_coalesced = CudaMatmul(ALONG_THE_ROWS, "matmul_along_the_rows")
