"""Mixed precision: number formats by their bits, loss scaling, master weights, a fused
optimizer step and fp8 quantisation.

Training in 16 bits halves the bytes of every activation and runs the matmuls on tensor
cores at about 15 times an H100's fp32 rate. What it costs is range and precision: fp16 keeps 5
bits of exponent, so small gradients vanish; bf16 keeps 7 bits of mantissa, so a small
update to a large weight vanishes. The ladder:

1. ``bf16_bits``/``bf16_round``: fp32 to bf16 by integer arithmetic on the bits, rounded to
   nearest, ties to even, NaN kept NaN. ``fp16_fate``: what becomes of a gradient in fp16.
2. ``LossScaler``: dynamic loss scaling with ``torch.amp.GradScaler``'s behaviour: multiply
   the loss by a scale so that gradients fit fp16, skip a step whose gradients overflowed
   and halve the scale, double it after a run of good steps.
3. ``train_step``: one step of training under ``torch.autocast``, with fp32 master weights
   and the scaler where the dtype needs it.
4. ``fused_adamw``: unscale, the non-finite check, AdamW on fp32 master weights and the
   bf16 copy of the weights, reading and writing each byte once (plus one read of the
   16-bit gradient for the check): 30 bytes a parameter, where the PyTorch path moves 48.
5. ``fp8_quantize``: bf16 to e4m3 with a per-tensor scale, saturating, in one read, and the
   tensor's amax for the next step's scale (delayed scaling).

Everything here is memory-bound: the floor of each kernel is its bytes over the bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from rooflab.autograder.device import interpreter_enabled

# Triton's interpreter converts fp32 to bf16 and to fp8 by truncating the mantissa (and
# does not saturate fp8): the conversions here are integer arithmetic on the bits, exact
# everywhere. On a GPU the fp8 conversion is one hardware instruction (cvt.rn.satfinite),
# cheaper than the integer version at 3 bytes an element.
INTERPRETED = tl.constexpr(interpreter_enabled())


# %% 1. Formats by their bits -----------------------------------------------------------------

# name: (exponent bits, mantissa bits, has inf). The bias is 2**(exponent bits - 1) - 1.
# e4m3 ("fn": finite) has no inf and one NaN pattern per sign (S.1111.111), which buys it
# one more binade: its largest number is 1.75 * 2**8 = 448.
FORMATS = {
    "fp32": (8, 23, True),
    "tf32": (8, 10, True),
    "bf16": (8, 7, True),
    "fp16": (5, 10, True),
    "fp8 e5m2": (5, 2, True),
    "fp8 e4m3": (4, 3, False),
}


def format_limits(name: str) -> dict[str, float]:
    """The numbers that matter of a format: largest, smallest normal, smallest subnormal,
    and machine epsilon (the spacing just above 1)."""
    exponent, mantissa, has_inf = FORMATS[name]
    bias = (1 << (exponent - 1)) - 1
    top = (1 << exponent) - (2 if has_inf else 1)  # the largest exponent field of a number
    top_mantissa = 2 - 2.0 ** -mantissa if has_inf else 2 - 2.0 ** (1 - mantissa)
    return {"max": top_mantissa * 2.0 ** (top - bias), "min_normal": 2.0 ** (1 - bias),
            "min_subnormal": 2.0 ** (1 - bias - mantissa), "epsilon": 2.0 ** -mantissa}


@triton.jit
def bf16_bits(x):
    """The bits of the fp32 values ``x`` rounded to bf16: to nearest, ties to even; inf
    stays inf, a number too large becomes inf, and every NaN stays a NaN. bf16 is the top
    half of fp32 (same sign and exponent, 7 of the 23 mantissa bits), so rounding is
    integer arithmetic on the 16 bits that go."""
    bits = x.to(tl.uint32, bitcast=True)
    ### BEGIN SOLUTION
    ### KEY
    # Add just under half of the bits that go (0x7FFF), plus one when the lowest bit that
    # stays is odd: a tie then rounds up to even, anything above half rounds up, and a
    # carry out of the mantissa moves into the exponent, as it must.
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    ### END KEY
    # A NaN whose payload lies in the low 16 bits would come out as inf, and 0x7FFFFFFF
    # would carry into the sign: keep the top half and set the quiet bit instead.
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = tl.where(is_nan, (bits >> 16) | 0x40, rounded)
    ### END SOLUTION
    return rounded.to(tl.uint16)


@triton.jit
def bf16_round_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Each program rounds BLOCK values and stores their bf16 bits as int16."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, bf16_bits(x).to(tl.int16, bitcast=True), mask=mask)


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` (fp32, contiguous, any shape) rounded to bf16, as ``x.to(torch.bfloat16)``
    does, computed on the bits."""
    assert x.dtype == torch.float32 and x.is_contiguous(), "a contiguous fp32 tensor"
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    n = x.numel()
    block = 8192 if interpreter_enabled() else 1024
    # The kernel stores the 16 bits as an integer: a store of a float would convert it.
    bf16_round_kernel[(triton.cdiv(n, block),)](x, out.view(torch.int16), n, BLOCK=block)
    return out


def fp16_fate(grad: torch.Tensor, scale: float = 1.0) -> tuple[float, float, float]:
    """What becomes of the fp32 gradient ``grad`` multiplied by ``scale`` (in fp32, as a
    loss scale multiplies it) and stored in fp16. Returns three fractions of all its
    elements: those that were not zero and become 0 (underflow), those that become fp16
    subnormals (below 2**-14: fewer than 11 significant bits left), and finite ones that
    become inf (overflow)."""
    ### BEGIN SOLUTION
    scaled = grad.float() * scale
    half = scaled.to(torch.float16)
    count = grad.numel()
    ### KEY
    underflow = int(((half == 0) & (scaled != 0)).sum()) / count
    subnormal = int(((half != 0) & (half.abs() < 2.0**-14)).sum()) / count
    ### END KEY
    overflow = int((half.isinf() & scaled.isfinite()).sum()) / count
    ### END SOLUTION
    return underflow, subnormal, overflow


# %% 2. Dynamic loss scaling ------------------------------------------------------------------


class LossScaler:
    """Dynamic loss scaling, as ``torch.amp.GradScaler`` does it, for one optimizer.

    ``scale(loss)`` multiplies the loss by the scale before ``backward``, so that small
    gradients stay above fp16's smallest numbers. ``step(optimizer)`` divides the gradients
    by the scale again (multiplying by its reciprocal, computed in float64 and rounded to
    fp32) and steps, unless a gradient is inf or NaN: then the step is skipped, and the
    weights do not move. ``update()`` then halves the scale after a skipped step
    (``backoff_factor``), or multiplies it by ``growth_factor`` once ``growth_interval``
    steps in a row were taken; a growth that would make the scale inf is not made. The
    scale is an fp32 number, as GradScaler keeps it.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self._scale = _fp32(init_scale)
        self.growth_tracker = 0  # steps taken in a row since the last change of the scale
        self.found_inf = False  # whether the last step() found an inf or a NaN

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale the optimizer's gradients in place; step if they are all finite.
        Returns whether the step was taken."""
        ### BEGIN SOLUTION
        inverse = _fp32(1.0 / self._scale)
        self.found_inf = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    ### KEY
                    # Checked before unscaling, as GradScaler does.
                    if not bool(torch.isfinite(p.grad).all()):
                        self.found_inf = True
                    ### END KEY
                    p.grad.mul_(inverse)
        ### KEY
        if not self.found_inf:
            optimizer.step()
        ### END KEY
        ### END SOLUTION
        return not self.found_inf

    def update(self) -> None:
        """Back off after a skipped step; grow after ``growth_interval`` good ones."""
        ### BEGIN SOLUTION
        ### KEY
        if self.found_inf:
            self._scale = _fp32(self._scale * self.backoff_factor)
        ### END KEY
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        ### KEY
        if self.growth_tracker == self.growth_interval:
            grown = _fp32(self._scale * self.growth_factor)
        ### END KEY
            if math.isfinite(grown):
                self._scale = grown
            self.growth_tracker = 0
        ### END SOLUTION


def _fp32(value: float) -> float:
    """``value`` rounded to the nearest fp32 number (inf past fp32's range)."""
    return torch.tensor(value, dtype=torch.float64).float().item()


# %% 3. Training in mixed precision ----------------------------------------------------------


def mlp(d_in: int, width: int, depth: int, d_out: int, seed: int = 0,
        device: str | torch.device = "cpu") -> torch.nn.Sequential:
    """The lab's model: ``depth`` Linear + GELU layers of ``width``, then a Linear to
    ``d_out`` logits, fp32 weights, initialised from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    layers: list[torch.nn.Module] = []
    sizes = [d_in] + [width] * depth
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.GELU()]
    layers.append(torch.nn.Linear(sizes[-1], d_out))
    model = torch.nn.Sequential(*layers)
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                bound = 1 / math.sqrt(layer.in_features)
                layer.weight.copy_((torch.rand(layer.weight.shape, generator=generator) * 2 - 1)
                                   * bound)
                layer.bias.zero_()
    return model.to(device)


def teacher_task(n: int, d_in: int, classes: int, seed: int = 1,
                 device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points in ``d_in`` dimensions and their class among ``classes``: the largest
    output of a random one-layer teacher, plus noise (so that the task cannot be learnt
    to zero loss)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=generator)
    teacher = torch.randn(d_in, classes, generator=generator)
    noise = 0.3 * torch.randn(n, classes, generator=generator)
    return x.to(device), (torch.tanh(x @ teacher) + noise).argmax(dim=1).to(device)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: object | None, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor,
               dtype: torch.dtype) -> float:
    """One training step in ``dtype``: the forward and the loss under ``torch.autocast``
    (no autocast for fp32), the backward, and the optimizer step on the fp32 weights.
    With a ``scaler`` (a GradScaler or a LossScaler), the loss is scaled before backward
    and the scaler steps and updates. Returns the loss, unscaled, as a float."""
    ### BEGIN SOLUTION
    optimizer.zero_grad(set_to_none=True)
    ### KEY
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32):
    ### END KEY
        loss = loss_fn(model(x), y)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        ### KEY
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        ### END KEY
    ### END SOLUTION
    return loss.item()


# %% 4. The optimizer step in one pass -------------------------------------------------------

@triton.jit
def nonfinite_kernel(grad_ptr, found_ptr, n, BLOCK: tl.constexpr):
    """Set ``found_ptr[0]`` to 1.0 if any of the ``n`` gradients is inf or NaN. Reads the
    gradient once; a block with none writes nothing."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(grad_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    ### BEGIN SOLUTION
    ### KEY
    # NaN is the one value unequal to itself; inf is beyond fp32's largest number.
    bad = (g != g) | (tl.abs(g) > 3.4028234663852886e38)
    ### END KEY
    if tl.sum(bad.to(tl.int32), axis=0) > 0:
        # Several programs may find one. Each raises the flag to the same 1.0 (an atomic
        # here; a plain store of 1.0 would do too), and none ever lowers it.
        tl.atomic_max(found_ptr, 1.0)
    ### END SOLUTION


@triton.jit
def adamw_kernel(param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, bf16_ptr, found_ptr,
                 scale_ptr, n, decay, beta1, beta2, eps, step_size, bias2_sqrt,
                 BLOCK: tl.constexpr):
    """One AdamW step on BLOCK fp32 master weights, in place, and their bf16 copy; nothing
    at all when the check found a non-finite gradient anywhere."""
    if tl.load(found_ptr) == 0:
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(param_ptr + offsets, mask=mask)
        m = tl.load(exp_avg_ptr + offsets, mask=mask)
        v = tl.load(exp_avg_sq_ptr + offsets, mask=mask)
        ### BEGIN SOLUTION
        ### KEY
        g = g * (1.0 / tl.load(scale_ptr))  # unscale
        ### END KEY
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        ### KEY
        # AdamW: the decay shrinks the weight itself, apart from the gradient.
        w = w * decay - step_size * m / (tl.sqrt(v) / bias2_sqrt + eps)
        ### END KEY
        ### END SOLUTION
        tl.store(param_ptr + offsets, w, mask=mask)
        tl.store(exp_avg_ptr + offsets, m, mask=mask)
        tl.store(exp_avg_sq_ptr + offsets, v, mask=mask)
        tl.store(bf16_ptr + offsets, bf16_bits(w).to(tl.int16, bitcast=True), mask=mask)


def fused_adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                exp_avg_sq: torch.Tensor, param_bf16: torch.Tensor, scale: torch.Tensor,
                step: int, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                eps: float = 1e-8, weight_decay: float = 1e-2) -> torch.Tensor:
    """One AdamW step (``torch.optim.AdamW``'s maths) on the fp32 master weights
    ``param``, in place, from ``grad`` (fp16, bf16 or fp32: the gradient of the loss times
    ``scale``, a one-element fp32 tensor), with the moments ``exp_avg`` and ``exp_avg_sq``
    (fp32, in place), writing the new weights rounded to bf16 into ``param_bf16``.
    ``step`` counts this step, from 1. If any gradient is inf or NaN, nothing changes.
    Returns found_inf: a one-element fp32 tensor, 1.0 if a gradient was inf or NaN.

    Two launches: the check reads the gradient (2 bytes a parameter for fp16), then the
    step reads the gradient, the weight and both moments and writes all three and the
    bf16 copy (28 bytes). The check must see every gradient before any weight changes, and
    a program cannot wait for the others of its own launch."""
    n = param.numel()
    for t in (param, grad, exp_avg, exp_avg_sq, param_bf16):
        assert t.is_contiguous() and t.numel() == n, "flat buffers of the same length"
    found_inf = torch.zeros(1, dtype=torch.float32, device=param.device)
    block = 8192 if interpreter_enabled() else 1024
    grid = (triton.cdiv(n, block),)
    nonfinite_kernel[grid](grad, found_inf, n, BLOCK=block)
    # The step's constants, on the host in float64 (no GPU work, no sync).
    step_size = lr / (1 - beta1**step)
    bias2_sqrt = math.sqrt(1 - beta2**step)
    adamw_kernel[grid](param, grad, exp_avg, exp_avg_sq, param_bf16.view(torch.int16),
                       found_inf, scale, n, 1 - lr * weight_decay, beta1, beta2, eps,
                       step_size, bias2_sqrt, BLOCK=block)
    return found_inf


# %% 5. FP8 -----------------------------------------------------------------------------------

E4M3_MAX = 448.0


@triton.jit
def e4m3_bits(y):
    """The bits (uint8) of fp32 ``y`` in fp8 e4m3fn, rounded to nearest, ties to even,
    saturating: anything beyond ±448 (inf too) becomes ±448; NaN stays NaN."""
    if INTERPRETED:
        bits = y.to(tl.uint32, bitcast=True)
        sign = (bits >> 24) & 0x80
        magnitude = bits & 0x7FFFFFFF
        nan = magnitude > 0x7F800000
        magnitude = tl.minimum(magnitude, 0x43E00000)  # 448 = 1.75 * 2**8
        # Normal numbers (from 2**-6): round 23 mantissa bits to 3, as for bf16, and move
        # the exponent from fp32's bias (127) to e4m3's (7): subtract 120 << 3.
        normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - (120 << 3)
        # Below 2**-6 e4m3 counts in steps of 2**-9. Adding 2**14, whose fp32 spacing is
        # 2**-9, rounds |y| to that grid (the hardware's round to nearest even), and the
        # count of steps is then the difference of the integer bits.
        tiny = (magnitude.to(tl.float32, bitcast=True) + 16384.0).to(tl.uint32, bitcast=True)
        code = tl.where(magnitude >= 0x3C800000, normal, tiny - 0x46800000)
        code = tl.where(nan, 0x7F, code) | sign
        return code.to(tl.uint8)
    else:
        # cvt.rn.satfinite: to nearest even, saturating, NaN kept.
        return y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)


@triton.jit
def fp8_quantize_kernel(x_ptr, scale_ptr, q_ptr, amax_ptr, n, BLOCK: tl.constexpr):
    """Quantise BLOCK elements of x to e4m3 with the given scale, and fold their largest
    magnitude into amax."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    ### BEGIN SOLUTION
    ### KEY
    # e4m3 has no inf: e4m3_bits saturates, anything beyond ±448 becomes ±448.
    tl.store(q_ptr + offsets, e4m3_bits(x * tl.load(scale_ptr)), mask=mask)
    ### END KEY
    # This step's amax, for the next step's scale. Masked lanes hold 0: they never win.
    tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0))
    ### END SOLUTION


def fp8_quantize(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (contiguous, bf16, fp16 or fp32) times ``scale`` (a one-element fp32 tensor,
    chosen from an earlier step's amax) in fp8 e4m3fn, saturating at ±448, and the amax
    of ``x`` (one-element fp32) for a later step's scale. One read of ``x``."""
    assert x.is_contiguous(), "a contiguous tensor"
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    n = x.numel()
    block = 8192 if interpreter_enabled() else 2048
    fp8_quantize_kernel[(triton.cdiv(n, block),)](x, scale, q.view(torch.uint8), amax, n,
                                                  BLOCK=block)
    return q, amax


def scale_from_amax(amax: torch.Tensor, margin: int = 0) -> torch.Tensor:
    """The per-tensor scale that maps ``amax`` to e4m3's largest number, less ``margin``
    powers of two of headroom: 448 / amax / 2**margin (Transformer Engine's recipe). An
    amax of 0 or a non-finite one keeps the scale at 1."""
    scale = E4M3_MAX / amax / 2.0**margin
    usable = torch.isfinite(amax) & (amax > 0)
    return torch.where(usable, scale, torch.ones_like(scale))


# %% 6. A block-scaled FP8 matmul ---------------------------------------------------------

# DeepSeek-V3's recipe: one scale per 1 × 128 block of the activations (a row's stretch of
# K) and one per 128 × 128 block of the weights, so an outlier spoils 128 values, not a
# tensor. The scales dequantise: the value is the fp8 number times its block's scale.
SCALE_BLOCK = 128


def quantize_blockwise(x: torch.Tensor, rows: int, cols: int = SCALE_BLOCK
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (2-D, floating) in fp8 e4m3 with one scale per ``rows`` × ``cols`` block:
    (q, scales), x ≈ q · scale of its block, each block's amax mapped to 448. Host code,
    to make a block-scaled matmul's inputs."""
    m, n = x.shape
    blocks = x.float().new_zeros(triton.cdiv(m, rows) * rows, triton.cdiv(n, cols) * cols)
    blocks[:m, :n] = x.float()
    tiles = blocks.view(blocks.shape[0] // rows, rows, blocks.shape[1] // cols, cols)
    amax = tiles.abs().amax(dim=(1, 3)).clamp_min(1e-30)
    scales = amax / E4M3_MAX
    q = (tiles / scales[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).view_as(blocks)
    return q[:m, :n].to(torch.float8_e4m3fn), scales


@triton.jit
def fp8_block_matmul_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K,
                            stride_am, stride_ak, stride_bk, stride_bn, stride_sam, stride_sak,
                            stride_sbk, stride_sbn, stride_cm, stride_cn,
                            SCALE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    """One BLOCK_M × BLOCK_N tile of C = Σ over K blocks of (A_q · B_q over the block) ×
    the block's scales. BLOCK_N divides SCALE_BLOCK: one weight scale per K block."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, SCALE_BLOCK)
    weight_column = (pid_n * BLOCK_N) // SCALE_BLOCK
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, SCALE_BLOCK)):
        k = kb * SCALE_BLOCK + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
        ### BEGIN SOLUTION
        # fp8 × fp8 on the tensor cores, summed in fp32 over this K block only: the
        # scales differ from one block to the next, so each block's sum is scaled apart
        # before it joins the others (and the tensor cores' partial sums, less precise
        # than fp32 on an H100, never run longer than a block).
        a_scale = tl.load(a_scale_ptr + rm * stride_sam + kb * stride_sak, mask=rm < M,
                          other=0.0)
        b_scale = tl.load(b_scale_ptr + kb * stride_sbk + weight_column * stride_sbn)
        ### KEY
        partial = tl.dot(a, b, out_dtype=tl.float32)
        acc += partial * a_scale[:, None] * b_scale
        ### END KEY
        ### END SOLUTION
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def fp8_block_matmul(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                     b_scale: torch.Tensor) -> torch.Tensor:
    """C (fp32, M × N) = A · B for block-scaled fp8 operands: ``a`` (M × K, e4m3) with
    ``a_scale`` (M × ceil(K/128), one per 1 × 128 block), ``b`` (K × N, e4m3, any strides)
    with ``b_scale`` (ceil(K/128) × ceil(N/128), one per 128 × 128 block); A's value is
    a · its block's scale, and so is B's."""
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=torch.float32, device=a.device)
    block_m, block_n = (32, 64) if interpreter_enabled() else (64, 128)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    fp8_block_matmul_kernel[grid](
        a, a_scale, b, b_scale, c, m, n, k, a.stride(0), a.stride(1), b.stride(0),
        b.stride(1), a_scale.stride(0), a_scale.stride(1), b_scale.stride(0),
        b_scale.stride(1), c.stride(0), c.stride(1), SCALE_BLOCK=SCALE_BLOCK,
        BLOCK_M=block_m, BLOCK_N=block_n)
    return c
