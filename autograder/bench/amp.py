"""``rooflab bench amp``: lab 07's kernels against PyTorch's mixed-precision path, on a GPU.

``amp_workloads(device)`` gives the workloads, each with PyTorch's way first (the
baseline) and the goal the lab states:

* an AdamW step on 2**30 parameters with fp16 gradients: PyTorch's path (grad.float(),
  unscale_, AdamW(fused=True), the bf16 copy: 48 bytes a parameter) against the course's
  fused_adamw (30). Goal: at least 80% of the copy roof, and 1.3× PyTorch;
* fp8 quantisation of 2**30 bf16 values: x.abs().max() and the scaled, saturated
  .to(float8_e4m3fn) against fp8_quantize (one read, the scale of an earlier step's amax).
  Goal: at least 85% of the copy roof;
* a block-scaled fp8 matmul (4096³, and 8192 × 7168 × 2048): the course's kernel against
  the same product in bf16 and against ``torch._scaled_mm`` with one scale per tensor
  (every block's scale is the same here, so all three compute one product). Its roofline
  is the card's fp8 peak, from the datasheet: ``rooflab roofline`` measures none;
* a training step of the lab's MLP (1024 → 8 × 4096 → 1024, a batch of 8192) in fp32 with
  TF32 off, in bf16 autocast, and in fp16 autocast with GradScaler. Goal: bf16 at least
  twice as fast as fp32; both are reported.

Every kernel returns one tensor the benchmark compares with the baseline's before and
after timing: the bf16 copy of the weights, the fp8 values, the loss. The optimizer and
training workloads step in place: each timed call is one more step from where the last
left off, with a learning rate small enough that the answers stay comparable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ..problem import Cost
from .workload import NotAvailable, Workload

PARAMS = 1 << 30  # about a billion parameters (or values)
LR = 1e-5
# The step both optimizers take, counted from 1: its bias corrections must be the same.
STEP = 10
MLP = {"d_in": 1024, "width": 4096, "depth": 8, "d_out": 1024, "batch": 8192}


# --- the optimizer step -----------------------------------------------------------------------


class TorchAdamW:
    """PyTorch's optimizer for one workload's weights, and the fp32 gradient it needs,
    made on first use and freed with the workload's inputs."""

    def __init__(self) -> None:
        self.optimizer: torch.optim.Optimizer | None = None

    def setup(self, param: torch.Tensor, exp_avg: torch.Tensor,
              exp_avg_sq: torch.Tensor) -> torch.optim.Optimizer:
        if self.optimizer is None:
            param.grad = torch.empty_like(param)
            self.optimizer = torch.optim.AdamW([param], lr=LR,
                                               fused=param.device.type == "cuda")
            # AdamW counts the step it is about to take from the state's: STEP - 1 before it.
            self.optimizer.state[param] = {"step": torch.tensor(float(STEP - 1),
                                                                device=param.device),
                                           "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        return self.optimizer


def adamw_inputs(n: int, device: str) -> tuple:
    """fp32 master weights, an fp16 gradient of a loss scaled by 2**16, both moments, the
    bf16 copy, the scale, and a place for PyTorch's optimizer."""
    param = torch.randn(n, device=device)
    grad = (torch.randn(n, device=device) * 1e-3 * 2**16).half()
    exp_avg = torch.randn(n, device=device) * 1e-4
    exp_avg_sq = torch.rand(n, device=device) * 1e-6
    return (param, grad, exp_avg, exp_avg_sq, param.to(torch.bfloat16),
            torch.tensor([2.0**16], device=device), TorchAdamW())


def torch_adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                     exp_avg_sq: torch.Tensor, param_bf16: torch.Tensor, scale: torch.Tensor,
                     holder: TorchAdamW) -> torch.Tensor:
    """PyTorch's path to the same step: copy the fp16 gradient into an fp32 one (GradScaler
    does not unscale fp16 gradients), unscale and check it as GradScaler does, step
    AdamW(fused=True) unless something overflowed (a host sync, as GradScaler's), and copy
    the weights into bf16. About 48 bytes a parameter."""
    optimizer = holder.setup(param, exp_avg, exp_avg_sq)
    master_grad = param.grad
    master_grad.copy_(grad)
    found = torch.zeros(1, device=param.device)
    torch._amp_foreach_non_finite_check_and_unscale_([master_grad], found, scale.reciprocal())
    if not found.item():
        optimizer.step()
    param_bf16.copy_(param)
    return param_bf16


def rooflab_adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                       exp_avg_sq: torch.Tensor, param_bf16: torch.Tensor,
                       scale: torch.Tensor, holder: TorchAdamW) -> torch.Tensor:
    from rooflab.kernels.amp import fused_adamw

    fused_adamw(param, grad, exp_avg, exp_avg_sq, param_bf16, scale, STEP, lr=LR)
    return param_bf16


def adamw_cost(n: int) -> Cost:
    """Read the weight, both moments and the fp16 gradient; write the weight, both moments
    and the bf16 copy: 28 bytes a parameter."""
    return Cost(16 * n, 28 * n)


# --- fp8 ------------------------------------------------------------------------------------


def fp8_inputs(n: int, device: str) -> tuple:
    """bf16 activations, and the scale an earlier step's amax of 3 gave: values beyond 3
    (about 0.3% of them) saturate, as when the amax has grown since (delayed scaling)."""
    x = torch.randn(n, device=device, dtype=torch.bfloat16)
    return x, torch.tensor([448.0 / 3.0], device=device)


def torch_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """PyTorch's way: the amax for the next step, then the scaled, saturated conversion."""
    x.abs().max()
    return (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def rooflab_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    from rooflab.kernels.amp import fp8_quantize

    return fp8_quantize(x, scale)[0]


# --- a training step --------------------------------------------------------------------------


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """True fp32 matmuls (PyTorch's default for matmul; set here so that it is sure)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def training_inputs(device: str, d_in: int = MLP["d_in"], width: int = MLP["width"],
                    depth: int = MLP["depth"], d_out: int = MLP["d_out"],
                    batch: int = MLP["batch"]) -> tuple:
    """The lab's model at a GPU's size, its optimizer, and a batch."""
    from rooflab.kernels.amp import mlp, teacher_task

    model = mlp(d_in, width, depth, d_out, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=device == "cuda")
    x, y = teacher_task(batch, d_in, d_out, device=device)
    return model, optimizer, x, y


def training_step(dtype: torch.dtype) -> Callable:
    """One step of the lab's ``train_step`` in ``dtype`` (fp16 with a GradScaler, kept per
    model), returning the loss as a tensor."""
    scalers: dict[int, torch.amp.GradScaler] = {}

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
             y: torch.Tensor) -> torch.Tensor:
        from rooflab.kernels.amp import train_step

        scaler = None
        if dtype == torch.float16:
            scaler = scalers.setdefault(id(model), torch.amp.GradScaler(x.device.type))
        with no_tf32():
            loss = train_step(model, optimizer, scaler, torch.nn.functional.cross_entropy, x,
                              y, dtype)
        return torch.tensor(loss)

    return step


def training_cost(d_in: int = MLP["d_in"], width: int = MLP["width"], depth: int = MLP["depth"],
                  d_out: int = MLP["d_out"], batch: int = MLP["batch"]) -> Cost:
    """6 FLOPs a weight and a sample (forward 2, backward 4); the bytes of the optimizer's
    step on fp32 weights (16 a parameter) and of the batch."""
    params = d_in * width + (depth - 1) * width * width + width * d_out
    return Cost(6 * params * batch, 16 * params + 4 * batch * (d_in + 1), "bf16")


# --- the block-scaled fp8 matmul --------------------------------------------------------------

FP8_GEMMS = [(4096, 4096, 4096), (8192, 7168, 2048)]  # M, N, K: square, and a wide weight


def fp8_gemm_inputs(m: int, n: int, k: int, device: str) -> tuple:
    """fp8 activations (M × K) and weights stored N × K, as a Linear keeps them, each with
    its block scales; the same scale in every block, so the library's matmul with one scale
    per tensor computes the same product and the timings compare like with like."""
    from rooflab.kernels.amp import SCALE_BLOCK

    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=generator, device=device).clamp(-4, 4) * 100
    w = torch.randn(n, k, generator=generator, device=device).clamp(-4, 4) * 100
    a_q, w_q = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    blocks = -(-k // SCALE_BLOCK)
    a_scale = torch.full((m, blocks), 1 / 64, device=device)
    b_scale = torch.full((blocks, -(-n // SCALE_BLOCK)), 1 / 64, device=device)
    return a_q, a_scale, w_q.t(), b_scale


def torch_bf16_gemm(a_q, a_scale, b_q, b_scale) -> torch.Tensor:
    """The same product in bf16, from dequantised operands: what fp8 is meant to beat."""
    a = a_q.to(torch.bfloat16) * a_scale[0, 0].to(torch.bfloat16)
    b = b_q.to(torch.bfloat16) * b_scale[0, 0].to(torch.bfloat16)
    return (a @ b).float()


def torch_scaled_mm(a_q, a_scale, b_q, b_scale) -> torch.Tensor:
    """PyTorch's fp8 matmul with one scale per tensor (cuBLASLt): the speed a block-scaled
    kernel aims for."""
    if not hasattr(torch, "_scaled_mm"):
        raise NotAvailable("this torch has no torch._scaled_mm")
    one = torch.ones((), device=a_q.device)
    return torch._scaled_mm(a_q, b_q, scale_a=one * a_scale[0, 0], scale_b=one * b_scale[0, 0],
                            out_dtype=torch.bfloat16).float()


def rooflab_fp8_gemm(a_q, a_scale, b_q, b_scale) -> torch.Tensor:
    from rooflab.kernels.amp import fp8_block_matmul

    return fp8_block_matmul(a_q, a_scale, b_q, b_scale)


def fp8_gemm_cost(m: int, n: int, k: int) -> Cost:
    scales = 4 * (m * -(-k // 128) + -(-k // 128) * -(-n // 128))
    return Cost(2.0 * m * n * k, m * k + n * k + scales + 4 * m * n, "fp8")


# --- the workloads ----------------------------------------------------------------------------


def amp_workloads(device: str) -> list[Workload]:
    """The workloads of ``rooflab bench amp``, each with PyTorch's way first."""
    n = PARAMS
    return [
        Workload(f"adamw n={n} fp16 grads", torch.float32, adamw_cost(n),
                 lambda: adamw_inputs(n, device),
                 {"torch grad.float() + unscale_ + AdamW(fused) + copy": torch_adamw_step,
                  "rooflab fused_adamw": rooflab_adamw_step},
                 torch_adamw_step),
        Workload(f"fp8 n={n}", torch.bfloat16, Cost(3 * n, 3 * n),
                 lambda: fp8_inputs(n, device),
                 {"torch abs().max() + scaled .to(float8_e4m3fn)": torch_fp8,
                  "rooflab fp8_quantize (delayed scale, one read)": rooflab_fp8},
                 torch_fp8),
        *(Workload(f"fp8 gemm m={m} n={n} k={k}", torch.float8_e4m3fn,
                   fp8_gemm_cost(m, n, k), lambda m=m, n=n, k=k: fp8_gemm_inputs(m, n, k, device),
                   {"torch bf16 matmul (dequantised)": torch_bf16_gemm,
                    "torch._scaled_mm (one scale per tensor)": torch_scaled_mm,
                    "rooflab fp8_block_matmul (1x128, 128x128 scales)": rooflab_fp8_gemm},
                   torch_bf16_gemm,
                   library=("torch bf16 matmul (dequantised)",
                            "torch._scaled_mm (one scale per tensor)"))
          for m, n, k in FP8_GEMMS),
        Workload("train mlp {d_in}-{width}x{depth}-{d_out} batch {batch}".format(**MLP),
                 torch.float32, training_cost(), lambda: training_inputs(device),
                 {"fp32 (TF32 off)": training_step(torch.float32),
                  "bf16 autocast": training_step(torch.bfloat16),
                  "fp16 autocast + GradScaler": training_step(torch.float16)},
                 training_step(torch.float32)),
    ]
