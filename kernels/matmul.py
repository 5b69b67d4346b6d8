"""Matrix multiplication, C = A @ B, from one row at a time to tiles in a good order.

The ladder, each step a kernel:

1. ``matmul_rows``: a program computes a block of one row of C, walking K one element
   at a time. Every element of A and B is fetched from memory again for every output
   that needs it: 8 bytes per 2 FLOPs in fp32.
2. ``matmul``: a program computes a BLOCK_M × BLOCK_N tile of C, walking K in BLOCK_K
   steps with ``tl.dot``. Each element loaded is used BLOCK_M or BLOCK_N times.
3. The same kernel with grouped program order (``group_m > 1``): programs that run at
   the same time share rows of A and columns of B, so those stay in L2.

Inputs may have any strides; accumulation is in fp32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from rooflab.autograder.device import interpreter_enabled
from rooflab.autograder.model.autotune import autotune_bench


@triton.jit
def matmul_rows_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                       BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    ### BEGIN SOLUTION
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(0, K):
        ### KEY
        a = tl.load(a_ptr + row * stride_am + k * stride_ak).to(tl.float32)  # one element
        ### END KEY
        b = tl.load(b_ptr + k * stride_bk + cols * stride_bn, mask=mask, other=0.0)
        ### KEY
        acc += a * b.to(tl.float32)
        ### END KEY
    ### END SOLUTION
    tl.store(c_ptr + row * stride_cm + cols * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask)


def matmul_rows(a: torch.Tensor, b: torch.Tensor, block_n: int = 64) -> torch.Tensor:
    """a @ b, one program per row of C and block of its columns."""
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "need (M×K) @ (K×N)"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    matmul_rows_kernel[(M, triton.cdiv(N, block_n))](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), BLOCK_N=block_n)
    return c


@triton.jit
def tile_coordinates(pid, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Which tile of C program ``pid`` computes, walking GROUP_M rows of tiles down
    before moving one column right (GROUP_M = 1: plain row-major order)."""
    ### BEGIN SOLUTION
    ### KEY matmul/tiled
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    ### END KEY
    group_size = min(tiles_m - first_m, GROUP_M)  # the last group may be shorter
    ### KEY matmul/grouped
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    ### END KEY
    ### END SOLUTION
    return pid_m, pid_n


@triton.jit
def epilogue(acc, bias_ptr, rn, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """What happens to a finished tile of C while it is still in registers: add a bias per
    column, then apply an activation. Fused here, it costs no memory traffic; as separate
    kernels, each would read and write all of C once more."""
    if HAS_BIAS:
        ### BEGIN SOLUTION
        ### KEY
        bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0)
        ### END KEY
        acc += bias[None, :].to(tl.float32)
        ### END SOLUTION
    if ACTIVATION == "relu":
        ### BEGIN SOLUTION
        ### KEY
        acc = tl.maximum(acc, 0.0)
        ### END KEY
        ### END SOLUTION
    if ACTIVATION == "gelu":  # tanh approximation, tanh from exp(-2|u|) so nothing overflows
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        e = tl.exp(-2.0 * tl.abs(u))
        tanh = (1.0 - e) / (1.0 + e)
        acc = 0.5 * acc * (1.0 + tl.where(u >= 0, tanh, -tanh))
    return acc


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
):
    pid_m, pid_n = tile_coordinates(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N),
                                    GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ### BEGIN SOLUTION
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ### KEY
    for k0 in range(0, K, BLOCK_K):
    ### END KEY
        k = k0 + rk
        ### KEY
        a = tl.load(a_ptr + rm[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        ### END KEY
        b = tl.load(b_ptr + k[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
        if UPCAST:  # the interpreter gets bf16 dots wrong; fp32 ones right (no TF32)
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        ### KEY
        acc += tl.dot(a, b, input_precision=INPUT_PRECISION)
        ### END KEY
    ### END SOLUTION
    acc = epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACTIVATION)  # off until step 7
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _launch_arguments(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
                      activation: str, precision: str) -> tuple[torch.Tensor, tuple, dict]:
    """The output and the arguments every launch of ``matmul_kernel`` shares."""
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "need (M×K) @ (K×N)"
    assert a.dtype == b.dtype, "a and b must share a dtype"
    assert activation in ACTIVATIONS, f"activation must be one of {ACTIVATIONS}"
    assert precision in ("tf32", "tf32x3", "ieee"), "precision: tf32, tf32x3 or ieee"
    M, K = a.shape
    N = b.shape[1]
    if bias is not None:
        assert bias.shape == (N,), f"bias must have shape ({N},)"
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    args = (a, b, c, c if bias is None else bias, M, N, K,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    constants = dict(UPCAST=interpreter_enabled() and a.dtype == torch.bfloat16,
                     INPUT_PRECISION=precision, HAS_BIAS=bias is not None,
                     ACTIVATION=activation)
    return c, args, constants


ACTIVATIONS = ("none", "relu", "gelu")


def matmul(
    a: torch.Tensor, b: torch.Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32,
    group_m: int = 1, num_warps: int = 4, num_stages: int = 3,
    bias: torch.Tensor | None = None, activation: str = "none", precision: str = "tf32",
) -> torch.Tensor:
    """activation(a @ b + bias) for 2-D a (M×K) and b (K×N) of any strides, one tile of C
    per program, programs in row-major order (``group_m=1``) or grouped (``group_m > 1``).
    ``precision`` applies to fp32 inputs on a GPU: "tf32" (tensor cores, 10-bit mantissa),
    "tf32x3" (three TF32 products, about fp32's accuracy) or "ieee" (CUDA cores)."""
    c, args, constants = _launch_arguments(a, b, bias, activation, precision)
    M, N = c.shape
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    matmul_kernel[grid](*args, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                        GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages,
                        **constants)
    return c


def matmul_grouped(a: torch.Tensor, b: torch.Tensor, group_m: int = 4) -> torch.Tensor:
    """a @ b with programs in groups of ``group_m`` rows of tiles, for L2 reuse."""
    return matmul(a, b, group_m=group_m)


def matmul_tensor_core(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with tiles shaped for the matrix units: big enough to feed them, small enough
    to fit one SM's shared memory and registers, fp16/bf16 tiles straight into ``tl.dot``."""
    ### BEGIN SOLUTION
    ### KEY
    # 128×128 fp32 accumulator / (8 warps × 32 threads) = 64 registers a thread.
    # Shared memory: 3 stages × (128×64 + 64×128) × 2 B = 96 KiB for fp16/bf16;
    # fp32 (TF32) tiles are twice as wide in bytes, so half the K: also 96 KiB.
    block_k = 64 if a.element_size() == 2 else 32
    ### END KEY
    return matmul(a, b, block_m=128, block_n=128, block_k=block_k, group_m=8,
                  num_warps=8, num_stages=3)
    ### END SOLUTION


def matmul_bias_relu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """relu(a @ b + bias) in one kernel: the epilogue runs on the tile in registers."""
    return matmul(a, b, bias=bias, activation="relu")


def matmul_configs() -> list[triton.Config]:
    """Candidates for the autotuner: tile shapes, warps and pipeline stages. Big square
    tiles for big square problems; narrow ones for skinny problems, where big tiles would
    leave most SMs idle; more stages where BLOCK_K is small, so loads stay ahead of the
    tensor cores."""
    ### BEGIN SOLUTION
    ### KEY
    def config(bm: int, bn: int, bk: int, warps: int, stages: int) -> triton.Config:
        return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                             num_warps=warps, num_stages=stages)
    ### END KEY

    return [
        ### KEY
        config(128, 256, 64, 8, 3),  # Hopper's sweet spot for large fp16/bf16
        ### END KEY
        config(256, 128, 64, 8, 3),
        config(128, 128, 64, 8, 4),
        config(128, 128, 32, 4, 4),
        config(128, 64, 64, 4, 4),
        config(64, 128, 64, 4, 4),
        config(64, 64, 64, 4, 4),
        ### KEY
        config(32, 128, 64, 4, 4),  # a short M (a few tokens): don't waste rows of the tile
        ### END KEY
        config(64, 32, 128, 4, 4),  # a short N
    ]
    ### END SOLUTION


@functools.cache
def _tuned_matmul_kernel():
    # Built on first use: on a GPU the autotuner times every config with do_bench (the
    # median, cached per key); on a CPU it asks the traffic model instead. The key holds
    # what changes the best config: the shape, the layout (a transposed input is walked
    # differently), the precision and the epilogue; Triton adds the dtypes.
    return triton.autotune(
        configs=matmul_configs(),
        key=["M", "N", "K", "stride_ak", "stride_bn", "INPUT_PRECISION", "HAS_BIAS",
             "ACTIVATION"],
        do_bench=autotune_bench())(matmul_kernel)


def matmul_autotuned(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                     activation: str = "none", precision: str = "tf32") -> torch.Tensor:
    """The playground matmul: activation(a @ b + bias) in fp16, bf16 or fp32 (TF32 unless
    ``precision`` says otherwise), any shape and strides, the tile configuration chosen per
    shape, dtype, layout and epilogue by the autotuner."""
    c, args, constants = _launch_arguments(a, b, bias, activation, precision)
    M, N = c.shape

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    _tuned_matmul_kernel()[grid](*args, **constants)
    return c
