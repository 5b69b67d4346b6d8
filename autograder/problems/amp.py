"""Lab 07 — mixed precision. Rounding to bf16 on the bits, what fp16 does to a gradient,
dynamic loss scaling, a training step under autocast, a fused AdamW step on fp32 master
weights, and fp8 quantisation with a per-tensor scale.

Conversions are graded bit for bit against PyTorch's own (``x.to(torch.bfloat16)``,
``x.to(torch.float8_e4m3fn)`` of the scaled and saturated input), except that any NaN
stands for any other: a CPU and a GPU make different NaN bit patterns. The scaler is
graded step by step against ``torch.amp.GradScaler`` itself, on scripted gradients with
infs and NaNs; the training step against a run of the same steps by the grader; the fused
optimizer step against AdamW's maths in float64, within a few fp32 roundings.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..device import interpreter_enabled
from ..evidence import guard, poison
from ..evidence.compare import form_cause, unwritten_cause
from ..evidence.recording import paused
from ..problem import Case, Cost, Levels, Problem, dtype_name, register
from . import traced
from .roofline import real_number

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
E4M3 = torch.float8_e4m3fn

# Conversions that would do an exercise's work in host code: the cast itself (a copy_
# between dtypes converts too).
CASTS = frozenset({"_to_copy", "to", "copy_"})


@contextlib.contextmanager
def _one_cpu_thread() -> Iterator[None]:
    """Run tiny models on one CPU thread: at this size torch's thread pool costs more than
    it saves (many times more on a machine whose cores are busy)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _hex(value: int, digits: int) -> str:
    return f"0x{value & ((1 << 4 * digits) - 1):0{digits}X}"


def _kernels_did_the_work(reads: list[torch.Tensor], writes: list[torch.Tensor],
                          launches: list) -> str:
    """Every byte of ``reads`` was loaded and every byte of ``writes`` stored by a kernel."""
    for t in reads:
        if traced.bytes_moved(launches, t, "load") < t.numel() * t.element_size():
            return ("the kernels did not read all of the input: each element must be read by a "
                    "kernel (host code may only allocate, view, fill and copy)")
    for t in writes:
        if traced.bytes_moved(launches, t, "store") < t.numel() * t.element_size():
            return ("the answer was not all written by a kernel: it must come out of the "
                    "kernels' own stores, not from a copy or a conversion on the host")
    return ""


# === amp/bf16_round ===========================================================================

RANDOM_BITS = "random bit patterns: every sign, exponent and mantissa"
SPECIAL = "ties, NaN payloads, ±inf, ±0, subnormals, the largest numbers"

# fp32 bit patterns a rounding must get right (as signed int32).
_SPECIAL_BITS = [
    0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000,  # exact ties: to even, down and up
    0x3F807FFF, 0x3F808001, 0x3F80FFFF,  # just under and over half, and all ones below
    0x7F800000, 0xFF800000, 0x00000000, 0x80000000,  # ±inf, ±0
    0x7FC00000, 0xFFC00000, 0x7FA00000,  # quiet NaNs, a signalling NaN
    0x7F800001, 0xFF800001, 0x7F80FFFF,  # NaNs whose payload is in the low 16 bits
    0x7FFFFFFF, 0xFFFFFFFF,  # the NaNs that carry out of the top if "rounded"
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000,  # the largest: to inf, stay, tie
    0x00000001, 0x00008000, 0x00018000, 0x807FFFFF, 0x00800000,  # subnormals, min normal
]


def _as_int32(values: list[int]) -> torch.Tensor:
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values],
                        dtype=torch.int32)


def _round_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    shape = tuple(case.sizes.values())
    count = math.prod(shape)
    if case.note in (RANDOM_BITS, SPECIAL):
        bits = torch.randint(-(1 << 31), (1 << 31) - 1, (count,), generator=gen, device=device,
                             dtype=torch.int64).to(torch.int32)
        if case.note == SPECIAL:
            special = _as_int32(_SPECIAL_BITS).to(device)
            picks = torch.randint(len(special), (count,), generator=gen, device=device)
            every_other = torch.arange(count, device=device) % 2 == 0
            bits = torch.where(every_other, special[picks], bits)
            bits[:len(special)] = special[:count]
        # A NaN whose top half is near 0x7FDA may round to 0x7FDA, the bf16 poison that
        # marks memory never written: move those few inputs to another NaN.
        top = (bits >> 16) & 0xFFFF
        near = ((top - 0x7F9A).abs() <= 1) | ((top - 0x7FDA).abs() <= 1)
        bits = torch.where(near, bits ^ 0x40000, bits)
        return (bits.view(torch.float32).reshape(shape),)
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * case.scale
    return (x,)


def _round_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The engine passes the input as float64: back to fp32 is exact (NaNs stay NaNs).
    single = x.float()
    return single, single.to(BF16)


def _round_cost(case: Case) -> Cost:
    return Cost(0, 6 * math.prod(case.sizes.values()))  # 4 bytes read, 2 written


def compare_round(output: object, reference: tuple) -> str:
    """bf16 bits equal to torch's conversion; a NaN wherever the input is NaN."""
    x, want = reference
    wrong = form_cause(output, shape=tuple(x.shape), dtype=BF16, device=x.device) or \
        unwritten_cause(output)
    if wrong:
        return wrong
    got = output.detach().to(x.device).reshape(-1)
    source = x.reshape(-1)
    expected = want.reshape(-1)
    nan = source.isnan()
    lost = nan & ~got.isnan()
    if bool(lost.any()):
        first = int(lost.nonzero()[0])
        value = got[first].float().item()
        kind = ("inf: the payload of this NaN lies in the 16 bits that go, and with them gone "
                "the pattern left is inf's" if math.isinf(value) else
                f"{value}: the rounding carried out of the top bits. ")
        return (f"{int(lost.sum())} NaN inputs came back as numbers, first element {first} as "
                f"{kind}. A NaN must stay a NaN: test for it (exponent all ones, mantissa not "
                "zero) and keep its top half with the quiet bit (0x0040) set")
    got_bits = got.view(torch.int16).int() & 0xFFFF
    want_bits = expected.view(torch.int16).int() & 0xFFFF
    wrong = ~nan & (got_bits != want_bits)
    if not bool(wrong.any()):
        return ""
    bits = source.view(torch.int32).long() & 0xFFFFFFFF
    first = int(wrong.nonzero()[0])
    head = (f"{int(wrong.sum())} of {got.numel()} values differ from torch's conversion, first "
            f"element {first}: fp32 {_hex(int(bits[first]), 8)} ({source[first].item():.9g}) "
            f"should give {_hex(int(want_bits[first]), 4)}, got {_hex(int(got_bits[first]), 4)}")
    truncated = (bits >> 16).int()
    low = bits & 0xFFFF
    if bool((got_bits[wrong] == truncated[wrong]).all()):
        return (f"{head}. Every wrong value is the input with its low 16 bits dropped: that "
                "truncates toward zero (as Triton's interpreter does when it stores fp32 into "
                "bf16). Round to nearest: add 0x7FFF, plus 1 if the lowest bit that stays is "
                "odd, then shift")
    ties = low == 0x8000
    if bool(ties[wrong].all()) and bool((got_bits[wrong] == truncated[wrong] + 1).all()):
        return (f"{head}. Every wrong value is an exact tie (low 16 bits 0x8000) rounded up "
                "where the kept half is even: ties go to the even neighbour. Add 0x7FFF plus "
                "the lowest kept bit, not 0x8000")
    return head


def _round_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    if not isinstance(output, torch.Tensor):
        return ""
    return _kernels_did_the_work([inputs[0]], [output], launches)


register(Problem(
    id="amp/bf16_round", title="fp32 to bf16 on the bits: round to nearest even, NaN kept",
    signature="(x: Tensor fp32, contiguous, any shape) -> Tensor bf16  # as x.to(bfloat16)",
    make_inputs=_round_inputs, reference=_round_reference, cost=_round_cost,
    compare=compare_round, trace_check=_round_structure, library_ops=CASTS,
    solution="rooflab.kernels.amp:bf16_round",
    cpu_cases=[
        Case({"n": 5000}, F32, note="ragged"),
        Case({"n": 4096}, F32, note=SPECIAL),
        Case({"n": 20000}, F32, note=RANDOM_BITS),
        Case({"m": 37, "n": 129}, F32, scale=1e30, note="a matrix of large values"),
        Case({"n": 7}, F32, scale=1e-40, note="fewer than a block, fp32 subnormals"),
    ],
    gpu_cases=[
        Case({"n": 1_000_003}, F32, note="ragged"),
        Case({"n": 1 << 20}, F32, note=SPECIAL),
        Case({"n": 1 << 22}, F32, note=RANDOM_BITS),
        Case({"m": 1023, "n": 4097}, F32, scale=1e30, note="a matrix of large values"),
        Case({"n": 7}, F32, scale=1e-40, note="fewer than a block, fp32 subnormals"),
        Case({"n": 1 << 28}, F32, note="timed", timed=True),
    ],
    # Not measured yet (no GPU at hand): a conversion reads 4 bytes and writes 2 an element,
    # and the integer rounding is a handful of instructions, so the course's kernel is
    # expected near the copy roof and level with torch's own conversion. The bars are set
    # below that until a GPU run says where it lands.
    levels=Levels(passing=0.5, good=0.7, excellent=0.85),
    baseline=lambda x: x.to(BF16), baseline_name="x.to(torch.bfloat16)",
    at_least_vs_baseline=0.7,
    hints=("bf16 is the top 16 bits of fp32. Rounding to nearest means adding half of what "
           "is dropped before dropping it: ties (exactly 0x8000 dropped) go to the neighbour "
           "whose last kept bit is 0. Then look at what adding does to a NaN.",
           "rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16. A NaN (bits & 0x7FFFFFFF "
           "above 0x7F800000) keeps its own top half with the quiet bit 0x40 set, whatever "
           "the rounding would give: tl.where."),
    answer_in=("bf16_bits",),
))


# === amp/underflow ============================================================================

BOUNDARIES = "values at fp16's boundaries: 2^-25, 2^-24, 2^-14, 65504, 65520, exact zeros"
# fp16: smallest subnormal 2**-24; a value at most half of it rounds to 0 (a tie goes to the
# even 0); below 2**-14 - 2**-25 a value rounds to a subnormal; from 65520 on, to inf.
_HALF_TINY, _NORMAL_EDGE, _HALF_HUGE = 2.0**-25, 2.0**-14 - 2.0**-25, 65520.0


def _fate_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    """A gradient whose magnitudes spread over 2^-40 .. 2^8 (log-uniform), signs random, a
    few exact zeros; ``scale`` a power of two, as a loss scaler's is."""
    n = case.sizes["n"]
    exponent = torch.rand(n, generator=gen, device=device, dtype=torch.float64) * 48 - 40
    sign = torch.where(torch.rand(n, generator=gen, device=device) < 0.5, -1.0, 1.0)
    grad = (sign * torch.exp2(exponent)).float()
    grad[torch.rand(n, generator=gen, device=device) < 0.02] = 0.0
    scale = 2.0 ** case.sizes["log2_scale"]
    if case.note == BOUNDARIES:
        edges = torch.tensor([_HALF_TINY, 2.0**-24, 1.5 * 2.0**-25, _NORMAL_EDGE,
                              2.0**-14 - 2.0**-24, 2.0**-14, 65504.0, 65519.0, _HALF_HUGE,
                              1e6, 0.0], dtype=torch.float32, device=device)
        grad[:2 * len(edges)] = torch.cat([edges, -edges]) / scale
    return grad, scale


def _fate_counts(grad: torch.Tensor, scale: float) -> torch.Tensor:
    """Counts (zero, subnormal, inf) by thresholds on |grad * scale|, in float64."""
    magnitude = (grad * scale).abs()
    nonzero = magnitude > 0
    return torch.stack([
        (nonzero & (magnitude <= _HALF_TINY)).sum(),
        ((magnitude > _HALF_TINY) & (magnitude < _NORMAL_EDGE)).sum(),
        ((magnitude >= _HALF_HUGE) & torch.isfinite(magnitude)).sum(),
    ]).double()


def _fate_reference(grad: torch.Tensor, scale: float) -> dict:
    return {"grad": grad, "scale": scale, "fractions": _fate_counts(grad, scale) / grad.numel()}


NAMES = ("underflow", "subnormal", "overflow")


def compare_fate(output: object, reference: dict) -> str:
    want = reference["fractions"]
    grad, scale = reference["grad"], reference["scale"]
    n = grad.numel()
    if not isinstance(output, (tuple, list)) or len(output) != 3:
        return f"return a tuple of three fractions ({', '.join(NAMES)}); got {output!r}"
    got = []
    for name, value in zip(NAMES, output, strict=True):
        number = real_number(value)
        if number is None or not math.isfinite(number):
            return f"{name}: got {value!r}, expected a fraction between 0 and 1"
        got.append(number)
    off = [name for name, g, w in zip(NAMES, got, want.tolist(), strict=True)
           if abs(g - w) > 0.5 / n]
    if not off:
        return ""
    shown = "; ".join(f"{name} {g:.6g}, expected {w:.6g}" for name, g, w
                      in zip(NAMES, got, want.tolist(), strict=True) if name in off)
    return f"{shown} (of {n} elements, scale {scale:g}){_fate_cause(got, grad, scale, n)}"


def _fate_cause(got: list[float], grad: torch.Tensor, scale: float, n: int) -> str:
    """The likely slip, where one explains all three numbers."""
    def same(counts: torch.Tensor) -> bool:
        return all(abs(g - c / n) <= 0.5 / n for g, c in zip(got, counts.tolist(), strict=True))

    magnitude = (grad * scale).abs()
    unscaled = _fate_counts(grad, 1.0)
    if scale != 1.0 and same(unscaled):
        return (": these are the fractions of the gradient itself, without the scale. "
                "Multiply by scale before the cast, as a loss scaler does")
    right = _fate_counts(grad, scale)
    with_zeros = right.clone()
    with_zeros[0] = (magnitude <= _HALF_TINY).sum()
    if same(with_zeros):
        return (": the underflow count includes elements that were zero already; only a "
                "value that was not zero can underflow")
    edge = right.clone()
    edge[0] = ((magnitude > 0) & (magnitude < 2.0**-24)).sum()
    edge[1] = ((magnitude >= 2.0**-24) & (magnitude < _NORMAL_EDGE)).sum()
    if same(edge):
        return (": values between 2^-25 and 2^-24 round up to fp16's smallest subnormal, "
                "2^-24, not to 0: only a magnitude of at most 2^-25 becomes 0")
    below_normal = right.clone()
    below_normal[0] = ((magnitude > 0) & (magnitude < _NORMAL_EDGE)).sum()
    below_normal[1] = 0
    if same(below_normal):
        return (": below fp16's smallest normal number, 2^-14, values become subnormals "
                "(fewer significant bits), not 0: they count as subnormal")
    return ""


register(Problem(
    id="amp/underflow", title="What fp16 does to a gradient: underflow, subnormals, overflow",
    signature="(grad: Tensor fp32, scale: float) -> (underflow, subnormal, overflow): "
              "fractions of all elements",
    make_inputs=_fate_inputs, reference=_fate_reference, cost=lambda case: Cost(0, 0),
    kernel=None, timed=False, compare=compare_fate,
    solution="rooflab.kernels.amp:fp16_fate",
    cpu_cases=[
        Case({"n": 10000, "log2_scale": 0}, F32, note="no scale"),
        Case({"n": 10000, "log2_scale": 16}, F32, note="GradScaler's initial scale"),
        Case({"n": 10000, "log2_scale": 24}, F32, note="a scale large enough to overflow"),
        Case({"n": 5000, "log2_scale": -3}, F32, note="a scale below 1"),
        Case({"n": 1000, "log2_scale": 16}, F32, note=BOUNDARIES),
        Case({"n": 1000, "log2_scale": 0}, F32, note=BOUNDARIES),
    ],
    gpu_cases=[
        Case({"n": 1 << 20, "log2_scale": 0}, F32, note="no scale"),
        Case({"n": 1 << 20, "log2_scale": 16}, F32, note="GradScaler's initial scale"),
        Case({"n": 1 << 20, "log2_scale": 24}, F32, note="a scale large enough to overflow"),
        Case({"n": 5000, "log2_scale": -3}, F32, note="a scale below 1"),
        Case({"n": 1000, "log2_scale": 16}, F32, note=BOUNDARIES),
        Case({"n": 1000, "log2_scale": 0}, F32, note=BOUNDARIES),
    ],
    hints=("Multiply by the scale in fp32, cast to fp16, and compare what you get with what "
           "you had: a value that was not 0 and is 0 now underflowed; one that is not 0 but "
           "below fp16's smallest normal number (2^-14) is a subnormal; a finite one that is "
           "inf now overflowed.",
           "half = (grad * scale).to(torch.float16); underflow: (half == 0) & (scaled != 0); "
           "subnormal: (half != 0) & (half.abs() < 2**-14); overflow: half.isinf() & "
           "scaled.isfinite(). Each count divided by grad.numel()."),
    answer_in=("fp16_fate",),
))


# === amp/loss_scaler ==========================================================================

SCALER_SIGNATURE = ("LossScaler(init_scale=2.**16, growth_factor=2., backoff_factor=.5, "
                    "growth_interval=2000) with .scale(loss) -> loss * scale, "
                    ".step(optimizer) (unscale the gradients; step unless one is inf or NaN), "
                    ".update(), .get_scale() -> float, .growth_tracker: int")
DEFAULTS = "GradScaler's defaults: a growth after 2000 good steps"
BURSTS = "bursts of overflow, then recovery"
AMP_OPS = ("_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_")


class _OpWatch(TorchDispatchMode):
    """Notes the aten ops that do a scaler's work for it (GradScaler's own kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = func.overloadpacket.__name__
        if name in AMP_OPS:
            self.seen.add(name)
        return func(*args, **(kwargs or {}))


def _scaler_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    """Gradients for every step (steps × 2 parameters × 3 elements, fp32, before scaling),
    with infs and NaNs on some steps, and the scaler's constructor arguments (None: leave
    them at their defaults)."""
    sizes = case.sizes
    steps = sizes["steps"]
    grads = torch.randn((steps, 2, 3), generator=gen, device=device)
    odds = torch.rand(steps, generator=gen, device=device)
    bad = odds < sizes.get("bad_share", 0.0)
    if case.note == DEFAULTS:  # one overflow, then a long run of good steps
        bad = torch.zeros(steps, dtype=torch.bool, device=device)
        bad[1] = True
    elif case.note == BURSTS:
        bad = (torch.arange(steps, device=device) // 5) % 3 == 1
    where = torch.randint(6, (steps,), generator=gen, device=device)
    # inf, -inf and NaN in turn, so that each kind comes up whatever the draw.
    kinds = torch.tensor([float("inf"), float("-inf"), float("nan")], device=device)
    kind = kinds[(bad.cumsum(0) - 1).clamp_min(0) % 3]
    flat = grads.view(steps, 6)
    rows = torch.arange(steps, device=device)
    flat[rows[bad], where[bad]] = kind[bad]
    arguments = tuple(sizes.get(name) for name in ("init_scale", "growth_factor",
                                                   "backoff_factor", "growth_interval"))
    return (grads, *arguments)


def _scaler_kwargs(init_scale, growth_factor, backoff_factor, growth_interval) -> dict:
    given = {"init_scale": init_scale, "growth_factor": growth_factor,
             "backoff_factor": backoff_factor, "growth_interval": growth_interval}
    return {key: value for key, value in given.items() if value is not None}


def _drive(scaler: object, grads: torch.Tensor, tracker: Callable[[object], int | None],
           watch: TorchDispatchMode | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the scripted steps through ``scaler``: each step, the gradients of a loss of 1
    scaled by the scaler (the script times the scale), then step an SGD of rate 1 and
    update. Per step: (scale before, scaled loss, scale after, growth tracker after) and
    the weights after the step. ``watch`` looks at the ops of the first 100 steps."""
    device = grads.device
    with paused():
        weights = [torch.zeros(3, device=device, requires_grad=True) for _ in range(2)]
        sgd = torch.optim.SGD(weights, lr=1.0)
        loss = torch.ones((), device=device)
        script = grads.float()
    states, after = [], []
    for step in range(grads.shape[0]):
        with watch if watch is not None and step < 100 else contextlib.nullcontext():
            before = float(scaler.get_scale())
            scaled = scaler.scale(loss)
            with paused():
                for weight, grad in zip(weights, script[step], strict=True):
                    weight.grad = grad * before
                scaled_value = float(scaled)
            scaler.step(sgd)
            scaler.update()
        with paused():
            count = tracker(scaler)
            states.append((before, scaled_value, float(scaler.get_scale()),
                           float("nan") if count is None else float(count)))
            after.append(torch.cat([w.detach().reshape(-1) for w in weights]))
    with paused():
        return (torch.tensor(states, dtype=torch.float64),
                torch.stack(after).float().cpu())


def _run_scaler(candidate: Callable, inputs: tuple) -> tuple:
    grads, *arguments = inputs
    watch = _OpWatch()
    with _one_cpu_thread():
        with watch:
            scaler = candidate(**_scaler_kwargs(*arguments))
        states, after = _drive(scaler, grads, lambda s: getattr(s, "growth_tracker", None),
                               watch)
    return states, after, ", ".join(sorted(watch.seen))


def _scaler_reference(grads: torch.Tensor, *arguments) -> tuple:
    gradscaler = torch.amp.GradScaler(grads.device.type, **_scaler_kwargs(*arguments))
    with _one_cpu_thread():
        states, after = _drive(gradscaler, grads.float(), lambda s: s._get_growth_tracker())
    return states, after, grads, _scaler_kwargs(*arguments)


def compare_scaler(output: object, reference: tuple) -> str:
    want, want_after, grads, kwargs = reference
    if not (isinstance(output, (tuple, list)) and len(output) == 3):
        return "the scaler could not be driven through the scripted steps"
    got, got_after, library = output
    if library:
        return (f"calls the library (aten.{library}): that is GradScaler's own work; the "
                "exercise is to write it")
    steps = want.shape[0]
    bad = (~torch.isfinite(grads.reshape(steps, -1))).any(dim=1).cpu()
    settings = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5,
                "growth_interval": 2000, **kwargs}
    for step in range(steps):
        g, w = got[step], want[step]
        what = f"step {step} ({'an inf or NaN gradient' if bad[step] else 'finite gradients'})"
        if step == 0 and g[0] != w[0]:
            return (f"the initial scale is {g[0].item():g}, expected {w[0].item():g} (the "
                    "init_scale given, or 2**16 by default)")
        if g[1] != w[1]:
            return (f"{what}: scale(loss) of a loss of 1 gave {g[1].item():g}, expected "
                    f"{w[1].item():g}: the loss times the current scale")
        moved = not torch.equal(got_after[step], got_after[step - 1] if step else
                                torch.zeros_like(got_after[step]))
        if bad[step] and moved:
            return (f"{what}: the weights moved. A step whose gradients hold an inf or a NaN "
                    "must be skipped: torch.isfinite finds both (a test against inf alone "
                    "misses NaN)")
        if not bad[step] and not moved:
            return f"{what}: the step was skipped, but every gradient was finite"
        if not bad[step] and not torch.allclose(got_after[step], want_after[step],
                                                rtol=1e-6, atol=1e-30):
            delta_got = got_after[step] - (got_after[step - 1] if step else 0)
            delta_want = want_after[step] - (want_after[step - 1] if step else 0)
            ratio = float(delta_got.norm() / delta_want.norm().clamp_min(1e-30))
            if abs(ratio / w[0].item() - 1) < 1e-3:
                return (f"{what}: the weights moved {ratio:g} times as far as expected, the "
                        "scale: the optimizer stepped with the scaled gradients. Multiply "
                        "every gradient by 1 / scale before the step")
            return (f"{what}: the weights after the step differ from GradScaler's (moved "
                    f"{ratio:.6g}× as far): the gradients must be multiplied by 1 / scale, "
                    "the reciprocal computed in float64 and rounded to fp32")
        if g[2] != w[2] or (not math.isnan(g[3].item()) and g[3] != w[3]):
            return f"{what}: {_scale_cause(g, w, bool(bad[step]), settings)}"
        if math.isnan(g[3].item()) and step == steps - 1:
            return "the scaler has no growth_tracker attribute: the count of good steps"
    return ""


def _scale_cause(got: torch.Tensor, want: torch.Tensor, bad: bool, settings: dict) -> str:
    before, after, expected = got[0].item(), got[2].item(), want[2].item()
    head = (f"the scale went from {before:g} to {after:g} (growth tracker "
            f"{got[3].item():g}); GradScaler's went to {expected:g} (growth tracker "
            f"{want[3].item():g})")
    grown = before * settings["growth_factor"]
    if bad and after == before:
        return head + ": after a skipped step the scale backs off, × backoff_factor"
    if bad and expected == _single(before * settings["backoff_factor"]) and after != expected \
            and after == before * settings["backoff_factor"]:
        return head + (": GradScaler keeps the scale in fp32 and rounds each product to "
                       "fp32; this one computed it in float64")
    if not bad and not math.isfinite(_single(grown)) and math.isinf(after):
        return head + (": a growth that would take the scale past fp32's largest number is "
                       "not made (the scale is an fp32 number)")
    if not bad and expected == before and after == grown and got[3].item() == 0:
        return head + (": the scale grew before growth_interval good steps in a row; the "
                       "tracker counts steps taken since the scale last changed")
    if not bad and after == before and expected != before:
        return head + (": the scale grows when growth_interval steps in a row were taken: "
                       "count them in growth_tracker, and reset it to 0 when the scale "
                       "changes")
    if after == expected and want[3].item() == 0 and got[3].item() != 0:
        return head + (": the growth tracker restarts at 0 whenever the scale changes, after "
                       "a skipped step and after a growth")
    return head


def _single(value: float) -> float:
    return torch.tensor(value, dtype=torch.float64).to(torch.float32).item()


SCALER_CASES = [
    Case({"steps": 2010}, F32, note=DEFAULTS),
    Case({"steps": 60, "init_scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
          "growth_interval": 3, "bad_share": 0.3}, F32, note="infs and NaNs at random"),
    Case({"steps": 45, "init_scale": 3.0, "growth_factor": 3.0, "backoff_factor": 0.3,
          "growth_interval": 4}, F32, note=BURSTS),
    Case({"steps": 12, "init_scale": 2.0**126, "growth_factor": 4.0,
          "backoff_factor": 0.25, "growth_interval": 1}, F32,
         note="a scale near fp32's largest number"),
]

register(Problem(
    id="amp/loss_scaler", title="Dynamic loss scaling, step by step as GradScaler",
    signature=SCALER_SIGNATURE, make_inputs=_scaler_inputs, reference=_scaler_reference,
    cost=lambda case: Cost(0, 0), invoke=_run_scaler, compare=compare_scaler,
    kernel=None, timed=False, solution="rooflab.kernels.amp:LossScaler",
    # The scaler's arithmetic is the same on either device: the same cases in both worlds.
    cpu_cases=SCALER_CASES, gpu_cases=SCALER_CASES,
    hints=("step: a gradient that is inf or NaN after the backward means the scale was too "
           "large; every gradient is multiplied by 1 / scale, and the optimizer steps only "
           "if all were finite. update: after a skipped step, scale *= backoff_factor; after "
           "growth_interval steps taken in a row, scale *= growth_factor.",
           "Keep the scale an fp32 number, as GradScaler does: round every product to fp32 "
           "(torch.tensor(x, dtype=torch.float64).float().item()), and do not grow it to "
           "inf. growth_tracker counts the steps taken since the scale last changed; a skip "
           "or a growth sets it back to 0."),
    answer_in=("LossScaler",),
))


# === amp/train_step ===========================================================================

TRAIN_SIGNATURE = ("(model, optimizer, scaler: GradScaler | None, loss_fn, x, y, dtype) -> "
                   "float loss: one step, the forward and loss under torch.autocast(dtype) "
                   "(none for fp32), fp32 weights, the scaler stepping when given")
IN_BF16 = "bf16 autocast, AdamW"
IN_FP32 = "fp32, no autocast, AdamW"
IN_FP16_SGD = "fp16 autocast with a GradScaler started at 2^24 (the first steps overflow), SGD"
IN_FP16_TINY = "fp16 autocast with a GradScaler, a loss summed over 2^20 samples, AdamW"
IN_FP16_BARE = "fp16 autocast, no scaler, AdamW"
_TRAINING = {IN_FP32: (F32, "adamw", None), IN_BF16: (BF16, "adamw", None),
             IN_FP16_SGD: (F16, "sgd", 2.0**24), IN_FP16_TINY: (F16, "adamw", 2.0**16),
             IN_FP16_BARE: (F16, "adamw", None)}
D_IN, WIDTH, CLASSES = 16, 32, 8


def _train_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    """Batches for every step, the seed of the model, and the case's note (which says the
    dtype, the optimizer, the scaler and the loss); the candidate gets none of it
    directly: ``_run_training`` builds the model and calls it step by step."""
    steps, batch = case.sizes["steps"], case.sizes["batch"]
    xs = torch.randn((steps, batch, D_IN), generator=gen, device=device)
    ys = torch.randint(CLASSES, (steps, batch), generator=gen, device=device)
    seed = int(torch.randint(1 << 30, (1,), generator=gen, device=device))
    return xs, ys, seed, case.note


def _network(seed: int, device: torch.device) -> torch.nn.Module:
    """Three Linear layers with GELU between them, from ``seed`` (the caller's random
    state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Linear(D_IN, WIDTH), torch.nn.GELU(),
                                  torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                                  torch.nn.Linear(WIDTH, CLASSES))
    return net.to(device)


def _loss_for(note: str) -> Callable:
    if note == IN_FP16_TINY:  # one micro-batch of a batch of 2**20 samples
        return lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction="sum") \
            / 2.0**20
    return torch.nn.functional.cross_entropy


@dataclass
class _Setup:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None


def _setup(note: str, seed: int, device: torch.device) -> _Setup:
    dtype, kind, init_scale = _TRAINING[note]
    model = _network(seed, device)
    optimizer = (torch.optim.SGD(model.parameters(), lr=0.05) if kind == "sgd" else
                 torch.optim.AdamW(model.parameters(), lr=3e-3))
    scaler = None if init_scale is None else torch.amp.GradScaler(device.type,
                                                                  init_scale=init_scale)
    return _Setup(model, optimizer, scaler)


class _MatmulDtypes(TorchDispatchMode):
    """The dtypes the matmuls of a forward and backward ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        if func.overloadpacket.__name__ in ("mm", "addmm", "bmm", "baddbmm", "matmul"):
            self.seen.add(dtype_name(args[-1].dtype))
        return func(*args, **(kwargs or {}))


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]).cpu()


def _record(run_step: Callable, setup: _Setup, xs: torch.Tensor, ys: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    steps = xs.shape[0]
    losses = torch.zeros(steps, dtype=torch.float64)
    weights = torch.zeros((steps, _flat(setup.model).numel()), dtype=torch.float32)
    scales = torch.full((steps,), float("nan"), dtype=torch.float64)
    watch = _MatmulDtypes()
    for step in range(steps):
        with watch:
            loss = run_step(xs[step], ys[step])
        with paused():
            value = real_number(loss)
            losses[step] = float("nan") if value is None else value
            weights[step] = _flat(setup.model)
            if setup.scaler is not None:
                scales[step] = setup.scaler.get_scale()
    return losses, weights, scales, ",".join(sorted(watch.seen))


def _run_training(candidate: Callable, inputs: tuple) -> tuple:
    xs, ys, seed, note = inputs
    dtype = _TRAINING[note][0]
    with paused():
        setup = _setup(note, seed, xs.device)
        loss_fn = _loss_for(note)
    with _one_cpu_thread():
        record = _record(lambda x, y: candidate(setup.model, setup.optimizer, setup.scaler,
                                                loss_fn, x, y, dtype), setup, xs, ys)
    kinds = ",".join(sorted({dtype_name(p.dtype) for p in setup.model.parameters()}))
    return (*record, kinds)


def _grader_step(setup: _Setup, loss_fn: Callable, dtype: torch.dtype, zero: bool = True,
                 unscale: bool = True) -> Callable:
    """The step as the grader takes it (``zero`` and ``unscale`` off: two classic slips)."""
    def run(x: torch.Tensor, y: torch.Tensor) -> float:
        if zero:
            for p in setup.model.parameters():
                p.grad = None
        cast = torch.autocast(x.device.type, dtype=dtype) if dtype != F32 else \
            torch.autocast(x.device.type, enabled=False)
        with cast:
            value = loss_fn(setup.model(x.float()), y)
        if setup.scaler is None:
            value.backward()
            setup.optimizer.step()
        elif unscale:
            setup.scaler.scale(value).backward()
            setup.scaler.unscale_(setup.optimizer)
            setup.scaler.step(setup.optimizer)
            setup.scaler.update()
        else:
            setup.scaler.scale(value).backward()
            setup.optimizer.step()
            setup.scaler.update()
        return float(value.detach())

    return run


def _train_reference(xs: torch.Tensor, ys: torch.Tensor, seed: int, note: str) -> dict:
    dtype = _TRAINING[note][0]
    setup = _setup(note, seed, xs.device)
    with _one_cpu_thread():
        losses, weights, scales, _ = _record(_grader_step(setup, _loss_for(note), dtype),
                                             setup, xs.float(), ys)
    return {"losses": losses, "weights": weights, "scales": scales, "dtype": dtype,
            "note": note, "inputs": (xs.float(), ys, seed), "start": _flat(
                _network(seed, xs.device))}


def _train_compare(output: object, reference: dict) -> str:
    if not (isinstance(output, (tuple, list)) and len(output) == 5):
        return "the step could not be run on the grader's model"
    losses, weights, scales, matmuls, kinds = output
    dtype = reference["dtype"]
    name = dtype_name(dtype)
    if kinds != "fp32":
        return (f"the model's weights are {kinds} after the steps: keep the fp32 master "
                "weights; autocast casts them for each matmul, and the optimizer updates them "
                "in fp32")
    used = set(matmuls.split(",")) - {""}
    if dtype == F32 and used - {"fp32"}:
        return (f"the matmuls of an fp32 step ran in {', '.join(sorted(used))}: with dtype "
                "float32 there is no autocast")
    if dtype != F32 and used != {name}:
        return (f"the matmuls ran in {', '.join(sorted(used)) or 'nothing'}, not {name}: run the "
                f"forward and the loss under torch.autocast(device_type, dtype={name})")
    want_losses, want_weights = reference["losses"], reference["weights"]
    want_scales = reference["scales"]
    steps = want_losses.numel()
    tight = dtype == F32
    for step in range(steps):
        if not torch.isfinite(weights[step]).all() and torch.isfinite(want_weights[step]).all():
            return (f"the weights hold NaN or inf after step {step}, a step whose gradients "
                    "overflowed: step through the scaler (scaler.step(optimizer)), which skips "
                    "a step with an inf or NaN gradient")
        if not math.isnan(want_scales[step].item()) and scales[step] != want_scales[step]:
            if step and scales[step] == scales[step - 1] == scales[0]:
                return (f"the scale never changed ({scales[0].item():g}) while gradients "
                        "overflowed: call scaler.update() after each step")
            return (f"after step {step} the scale is {scales[step].item():g}, expected "
                    f"{want_scales[step].item():g}: scaler.scale(loss).backward(), then "
                    "scaler.step(optimizer), then scaler.update(), once each per step")
        got, want = losses[step].item(), want_losses[step].item()
        if math.isfinite(want) and not math.isclose(got, want, rel_tol=1e-5 if tight else 1e-2,
                                                    abs_tol=1e-12):
            return _train_cause(step, got, want, output, reference)
    start = reference["start"]
    moved = (weights[-1] - start).norm()
    drift = (weights[-1] - want_weights[-1]).norm() / (want_weights[-1] - start).norm()
    if drift > (1e-4 if tight else 5e-2):
        return (f"the weights after {steps} steps are {drift:.1%} (of the distance they moved, "
                f"{moved:.3g}) away from the grader's run of the same steps"
                + _train_cause(steps - 1, None, None, output, reference, prefix=": "))
    return ""


def _train_cause(step: int, got: float | None, want: float | None, output: tuple,
                 reference: dict, prefix: str = "") -> str:
    head = "" if got is None else \
        f"the loss of step {step} is {got:.6g}, where the grader's run has {want:.6g}"
    scales = reference["scales"]
    if got is not None and not math.isnan(scales[step].item()):
        for scale in {scales[step].item(), scales[step - 1].item() if step else 0.0}:
            if scale and math.isclose(got, want * scale, rel_tol=1e-2):
                return head + (": the loss returned is the scaled one; return the loss itself")
    for slip, words in ((dict(zero=False), "the gradients accumulate from step to step: "
                         "zero them (optimizer.zero_grad()) at the start of each step"),
                        (dict(unscale=False), "the optimizer stepped with the scaled "
                         "gradients: step through scaler.step(optimizer), which unscales "
                         "them first")):
        if "unscale" in slip and math.isnan(scales[0].item()):
            continue
        xs, ys, seed = reference["inputs"]
        setup = _setup(reference["note"], seed, xs.device)
        run = _grader_step(setup, _loss_for(reference["note"]), reference["dtype"], **slip)
        with _one_cpu_thread():
            losses, _, _, _ = _record(run, setup, xs, ys)
        same = torch.allclose(output[0][:step + 1], losses[:step + 1], rtol=1e-3,
                              equal_nan=True)
        if same:
            return head + (prefix or ": ") + words
    if got is None:
        return ""
    return head + (": the forward and the loss under autocast, backward, then the "
                   "optimizer's step, once each")


def _train_problem(note: str, steps: int = 8, batch: int = 32) -> Case:
    return Case({"steps": steps, "batch": batch}, None, note=note)


register(Problem(
    id="amp/train_step", title="A training step in mixed precision: autocast, fp32 weights, "
                               "the scaler",
    signature=TRAIN_SIGNATURE, make_inputs=_train_inputs, reference=_train_reference,
    cost=lambda case: Cost(0, 0), invoke=_run_training, compare=_train_compare,
    kernel=None, timed=False, solution="rooflab.kernels.amp:train_step",
    cpu_cases=[
        _train_problem(IN_FP32), _train_problem(IN_BF16), _train_problem(IN_FP16_SGD, 10),
        _train_problem(IN_FP16_TINY), _train_problem(IN_FP16_BARE, 4),
    ],
    gpu_cases=[
        _train_problem(IN_FP32), _train_problem(IN_BF16), _train_problem(IN_FP16_SGD, 10),
        _train_problem(IN_FP16_TINY), _train_problem(IN_FP16_BARE, 4),
    ],
    hints=("Zero the gradients, then the forward and the loss inside "
           "torch.autocast(x.device.type, dtype=dtype) (enabled only when dtype is not "
           "float32); the backward and the step outside it. The weights stay fp32.",
           "Without a scaler: loss.backward(); optimizer.step(). With one: "
           "scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update(). Return "
           "loss.item(), the loss before scaling."),
    answer_in=("train_step",),
))




# === amp/fused_adamw ==========================================================================

ADAMW_SIGNATURE = ("(param fp32, grad fp16|bf16|fp32, exp_avg fp32, exp_avg_sq fp32, "
                   "param_bf16 bf16: Tensor[n] each, scale: Tensor[1] fp32, step: int, lr, "
                   "beta1, beta2, eps, weight_decay) -> found_inf: Tensor[1] fp32; updates "
                   "param, exp_avg, exp_avg_sq and param_bf16 in place, unless a gradient is "
                   "inf or NaN")
INF_LAST = "an inf in the last gradient: every weight must stay as it was"
NAN_FIRST = "a NaN in the first block of gradients"
NEG_INF = "a -inf in the middle"
EVERYWHERE = "overflow everywhere: infs and NaNs in every block"
SMALL_GRADS = "tiny gradients: eps decides the step"
ADAMW_TRAFFIC = "several blocks, traced for traffic"


@dataclass
class AdamWState:
    """One optimizer step to take: the tensors (inside guard bands, which the compare
    checks), what they held before any step, and the hyperparameters. ``calls`` counts the
    steps taken on these tensors (a timed run takes many: the reference takes as many)."""

    tensors: dict[str, guard.Guarded]
    initial: dict[str, torch.Tensor]
    step: int
    hyper: dict[str, float]
    calls: int = 0
    baseline: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name].view


_ORDER = ("param", "grad", "exp_avg", "exp_avg_sq", "param_bf16", "scale")


def _adamw_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    sizes = case.sizes
    n = sizes["n"]
    scale = float(sizes.get("scale", 2.0**16))

    def randn(std: float = 1.0) -> torch.Tensor:
        return torch.randn(n, generator=gen, device=device) * std

    grad_size = 1e-7 if case.note == SMALL_GRADS else 1e-3
    weights = randn()
    values = {
        "param": weights,
        "grad": (randn(grad_size) * scale).to(case.dtype),
        "exp_avg": randn(grad_size / 10),
        "exp_avg_sq": randn(grad_size).square() * 0.5,
        "param_bf16": weights.to(BF16),
        "scale": torch.tensor([scale], device=device),
    }
    grad = values["grad"]
    if case.note == INF_LAST:
        grad[-1] = float("inf")
    elif case.note == NAN_FIRST:
        grad[3] = float("nan")
    elif case.note == NEG_INF:
        grad[n // 2] = float("-inf")
    elif case.note == EVERYWHERE:
        picks = torch.rand(n, generator=gen, device=device)
        grad[picks < 0.01] = float("inf")
        grad[picks > 0.99] = float("nan")
    hyper = {"lr": sizes.get("lr", 1e-3), "beta1": sizes.get("beta1", 0.9),
             "beta2": sizes.get("beta2", 0.999), "eps": sizes.get("eps", 1e-8),
             "weight_decay": sizes.get("weight_decay", 1e-2)}
    guarded = {name: guard.copy(values[name], name) for name in _ORDER}
    initial = {name: values[name].clone() for name in _ORDER}
    return (AdamWState(guarded, initial, sizes.get("step", 1), hyper),)


def _run_adamw(candidate: Callable, inputs: tuple) -> tuple:
    (state,) = inputs
    state.calls += 1
    h = state.hyper
    found = candidate(*(state[name] for name in _ORDER), state.step, h["lr"], h["beta1"],
                      h["beta2"], h["eps"], h["weight_decay"])
    with paused():
        outside = ", ".join(name for name, g in state.tensors.items() if g.margins_hit())
    return (found, state["param"], state["exp_avg"], state["exp_avg_sq"], state["param_bf16"],
            outside)


def adamw_float64(w: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                  scale: float, step: int, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, variant: str = "") -> tuple:
    """AdamW's step in float64 (``variant``: one of the classic slips, for diagnosis)."""
    unscaled = g if variant == "no unscale" else g / scale
    if variant == "l2":
        unscaled = unscaled + weight_decay * w
    m_new = beta1 * m + (1 - beta1) * unscaled
    v_new = beta2 * v + (1 - beta2) * unscaled * unscaled
    corrected_m = m_new if variant == "no bias correction" else m_new / (1 - beta1**step)
    corrected_v = v_new if variant == "no bias correction" else v_new / (1 - beta2**step)
    if variant == "eps inside":
        denominator = torch.sqrt(corrected_v + eps)
    else:
        denominator = torch.sqrt(corrected_v) + eps
    decay = 1.0 if variant in ("l2", "no decay") else 1 - lr * weight_decay
    return w * decay - lr * corrected_m / denominator, m_new, v_new


def _adamw_reference(state: AdamWState) -> dict:
    start = {name: t.double() for name, t in state.initial.items()}
    calls = max(1, state.calls)  # a recheck in another process never called the candidate
    finite = bool(torch.isfinite(start["grad"]).all())
    w, m, v = start["param"], start["exp_avg"], start["exp_avg_sq"]
    if finite:
        for _ in range(calls):
            w, m, v = adamw_float64(w, start["grad"], m, v, float(start["scale"]), state.step,
                                    **state.hyper)
    return {"state": state, "found": not finite, "param": w, "exp_avg": m, "exp_avg_sq": v,
            "calls": calls}


def _ulps(x: torch.Tensor) -> torch.Tensor:
    """fp32's spacing at |x| (its smallest normal spacing near 0)."""
    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(2.0**-126))) - 23)


def _rne_bf16(w: torch.Tensor) -> torch.Tensor:
    return w.float().to(BF16)


def compare_adamw(output: object, reference: dict) -> str:
    state: AdamWState = reference["state"]
    start = state.initial
    if not (isinstance(output, (tuple, list)) and len(output) == 6):
        return "the step could not be run on the grader's tensors"
    found, param, exp_avg, exp_avg_sq, param_bf16, outside = output
    if outside:
        return (f"wrote outside {outside} (into the poisoned margins around it): a store "
                "without a mask, or an offset past the end")
    if not isinstance(found, torch.Tensor) or found.numel() != 1 or found.dtype != F32:
        return "return found_inf: a one-element fp32 tensor, 1.0 if a gradient was inf or NaN"
    flag = found.item()
    if flag not in (0.0, 1.0):
        return f"found_inf is {flag}, expected 0.0 or 1.0"
    if flag != float(reference["found"]):
        return ("found_inf is 0.0, but a gradient is inf or NaN: NaN is not above any number "
                "(x != x finds it), and inf is beyond fp32's largest number"
                if reference["found"] else "found_inf is 1.0, but every gradient is finite")
    tensors = {"param": param, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
               "param_bf16": param_bf16}
    if reference["found"]:
        return _unchanged(tensors, start)
    for name, tensor in tensors.items():
        if bool(poison.unwritten_mask(tensor).any()):
            return f"{name} holds poison: it was never written"
    h = state.hyper
    unscaled = start["grad"].double() / float(start["scale"])
    # Each result within a few fp32 roundings of its own size, and, for the terms that
    # carry a (1 - beta), 3e-5 of that term: beta held in fp32 moves 1 - beta by up to
    # 1.3e-5 of itself (1 - fp32(0.999) is 1.29e-5 away from 0.001).
    checks = [("exp_avg", exp_avg, reference["exp_avg"],
               (h["beta1"] * start["exp_avg"].double()).abs() + ((1 - h["beta1"]) * unscaled).abs(),
               ((1 - h["beta1"]) * unscaled).abs()),
              ("exp_avg_sq", exp_avg_sq, reference["exp_avg_sq"], reference["exp_avg_sq"],
               (1 - h["beta2"]) * unscaled.square()),
              ("param", param, reference["param"], reference["param"],
               4 * (reference["param"] - start["param"].double()).abs())]
    slack = 8 * reference["calls"]
    for name, got, want, size, term in checks:
        error = (got.double() - want).abs()
        allowed = slack * _ulps(size.float()).double() + 3e-5 * slack / 8 * term
        wrong = ~(error <= allowed)
        if bool(wrong.any()):
            i = int(wrong.nonzero()[0])
            head = (f"{name}: {int(wrong.sum())} of {got.numel()} values off, first at {i}: got "
                    f"{got[i].item():.9g}, expected {want[i].item():.9g} (was "
                    f"{start[name][i].item():.9g})")
            return head + _adamw_cause(output, reference)
    copy_bits = param_bf16.view(torch.int16)
    if not torch.equal(copy_bits, _rne_bf16(param).view(torch.int16)):
        wrong = copy_bits != _rne_bf16(param).view(torch.int16)
        head = (f"param_bf16: {int(wrong.sum())} of {param.numel()} values are not the new "
                "fp32 weight rounded to nearest even")
        truncated = (param.float().view(torch.int32) >> 16).to(torch.int16)
        if torch.equal(copy_bits[wrong], truncated[wrong]):
            return head + (": they are truncated (a store of fp32 into bf16 truncates in "
                           "Triton's interpreter). Round on the bits, as in bf16_bits, and "
                           "store the 16 bits")
        if torch.equal(param_bf16, start["param_bf16"]):
            return head + ": it still holds the old weights; write the copy of the new ones"
        return head
    return ""


def _unchanged(tensors: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> str:
    """A step with a non-finite gradient changes nothing, bit for bit."""
    grad = start["grad"]
    first_bad = int((~torch.isfinite(grad)).nonzero()[0])
    for name, tensor in tensors.items():
        before = start[name].to(tensor.device)
        same = (tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int32)
                == before.view(torch.int16 if before.element_size() == 2 else torch.int32))
        if not bool(same.all()):
            changed = (~same).nonzero().flatten()
            where = ""
            if int(changed.max()) < first_bad:
                where = (f", all before the first non-finite gradient (element {first_bad}): "
                         "the blocks updated before a program met it. No program can know "
                         "of an inf in another's block: check the whole gradient first (one "
                         "launch), then step (a second, that does nothing if one was found)")
            return (f"a gradient is inf or NaN, yet {name} changed in {changed.numel()} "
                    f"places{where}. Such a step must leave every weight, moment and copy "
                    "as it was")
    return ""


def _adamw_cause(output: tuple, reference: dict) -> str:
    """Which classic slip reproduces the candidate's numbers, if one does."""
    state: AdamWState = reference["state"]
    start = {name: t.double() for name, t in state.initial.items()}
    got = [output[1].double(), output[2].double(), output[3].double()]
    scale = float(start["scale"])
    words = {
        "no unscale": "the gradient was not unscaled: multiply it by 1 / scale first",
        "no bias correction": ("the moments are used without bias correction: divide m by "
                               "1 - beta1**step and v by 1 - beta2**step (step counts from 1)"),
        "l2": ("the weight decay was added to the gradient (Adam with L2); AdamW decays the "
               "weight itself: w * (1 - lr * weight_decay), apart from the gradient"),
        "eps inside": "eps goes outside the square root: sqrt(v_hat) + eps",
        "no decay": "the weight decay is missing: w * (1 - lr * weight_decay)",
    }
    for variant, text in words.items():
        if variant == "no unscale" and scale == 1.0:
            continue
        w, m, v = start["param"], start["exp_avg"], start["exp_avg_sq"]
        for _ in range(reference["calls"]):
            w, m, v = adamw_float64(w, start["grad"], m, v, scale, state.step, **state.hyper,
                                    variant=variant)
        distance = [(a - b).norm() / b.norm().clamp_min(1e-300) for a, b in zip(got, (w, m, v),
                                                                                 strict=True)]
        moved = (reference["param"] - start["param"]).norm() / start["param"].norm()
        if max(distance[1:]) < 1e-4 and distance[0] < 1e-2 * max(moved, 1e-30):
            return f": {text}"
    return ""


def _adamw_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    """Each byte once: the weight and both moments read once and written once, the copy
    written once, the gradient read at most twice (the check, then the step); at most two
    launches."""
    (state,) = inputs
    if state.calls > 1 or not launches:
        return ""
    n = state["param"].numel()
    finite = bool(torch.isfinite(state.initial["grad"]).all())
    limits = {"param": (1, 1), "exp_avg": (1, 1), "exp_avg_sq": (1, 1), "grad": (2, 0),
              "param_bf16": (0, 1)}
    for name, (reads, writes) in limits.items():
        t = state[name]
        size = n * t.element_size()
        loaded = traced.bytes_moved(launches, t, "load")
        stored = traced.bytes_moved(launches, t, "store")
        if loaded > reads * size:
            return (f"reads {name} {loaded / size:.1f} times: " + (
                "once for the check and once for the step at most" if name == "grad" else
                "once is enough: load it once, update it in registers, store it once"))
        if stored > writes * size:
            return f"writes {name} {stored / size:.1f} times: once is enough"
        if finite and writes and stored < size:
            return (f"{name} was not all written by the kernels: the step must come out of "
                    "the kernels' own stores, not from host code")
    total = traced.requested(launches)
    budget = 26 + 2 * state["grad"].element_size()
    per = total / n
    if per > budget + 1:
        return (f"moves {per:.1f} bytes a parameter, more than the {budget} of reading the "
                "weight and both moments once, writing them and the bf16 copy once, and "
                "reading the gradient twice (check, step)")
    if len(launches) > 2:
        return (f"{len(launches)} launches: a step is two at most, the check and the update "
                "(each launch reads its inputs from memory again)")
    return ""


def _adamw_cost(case: Case) -> Cost:
    n = case.sizes["n"]
    # The weight and both moments read and written, the gradient read once, the bf16 copy
    # written: 28 bytes a parameter with a 16-bit gradient. About 16 FLOPs a parameter.
    return Cost(16 * n, n * (24 + 2 + case.dtype.itemsize))


def _torch_adamw(state: AdamWState) -> torch.Tensor:
    """The PyTorch path: the gradient copied into fp32 (GradScaler will not unscale fp16
    gradients), GradScaler's unscale and check, AdamW(fused=True) if all is finite, and the
    bf16 copy of the weights."""
    if not state.baseline:
        master = state["param"]
        master.grad = torch.empty_like(master)
        state.baseline["optimizer"] = torch.optim.AdamW([master], fused=True, **{
            k: state.hyper[k] for k in ("lr", "eps", "weight_decay")},
            betas=(state.hyper["beta1"], state.hyper["beta2"]))
        state.baseline["optimizer"].state[master] = {
            "step": torch.tensor(float(state.step - 1), device=master.device),
            "exp_avg": state["exp_avg"],
            "exp_avg_sq": state["exp_avg_sq"]}
    master = state["param"]
    master.grad.copy_(state["grad"])
    found = torch.zeros(1, device=master.device)
    torch._amp_foreach_non_finite_check_and_unscale_([master.grad], found,
                                                     state["scale"].reciprocal())
    if not found.item():
        state.baseline["optimizer"].step()
    state["param_bf16"].copy_(master)
    return state["param_bf16"]


register(Problem(
    id="amp/fused_adamw", title="Unscale, check and AdamW on fp32 master weights, and the "
                                "bf16 copy: each byte once",
    signature=ADAMW_SIGNATURE, make_inputs=_adamw_inputs, reference=_adamw_reference,
    cost=_adamw_cost, invoke=_run_adamw, compare=compare_adamw,
    trace_check=_adamw_structure,
    library_ops=CASTS | {"_fused_adamw_", "_fused_adam_", "_amp_foreach_non_finite_check_"
                         "and_unscale_"},
    solution="rooflab.kernels.amp:fused_adamw",
    cpu_cases=[
        Case({"n": 5000}, F16, note="the first step: bias corrections at their largest"),
        Case({"n": 3001, "step": 1000, "lr": 3e-4, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6,
              "weight_decay": 0.1, "scale": 1.0}, F32, note="step 1000, other betas"),
        Case({"n": 4000, "step": 10, "scale": 3.0, "weight_decay": 0.0}, F16,
             note="a scale that is not a power of two, no weight decay"),
        Case({"n": 2000, "step": 3, "eps": 1e-6, "scale": 1.0}, F32, note=SMALL_GRADS),
        Case({"n": 20000, "step": 5}, F16, note=INF_LAST),
        Case({"n": 3000, "step": 2}, F16, note=NAN_FIRST),
        Case({"n": 9000, "step": 7, "scale": 1.0}, F32, note=NEG_INF),
        Case({"n": 4 * 8192, "step": 3}, F16, note=EVERYWHERE),
        Case({"n": 100, "step": 4}, F16, note="fewer than a block"),
        Case({"n": 3 * 8192 + 5, "step": 2}, F16, note=ADAMW_TRAFFIC),
        Case({"n": 3000, "step": 2, "scale": 1.0}, BF16),
    ],
    gpu_cases=[
        Case({"n": 1_000_003}, F16, note="the first step: bias corrections at their largest"),
        Case({"n": 300_001, "step": 1000, "lr": 3e-4, "beta1": 0.8, "beta2": 0.95,
              "eps": 1e-6, "weight_decay": 0.1, "scale": 1.0}, F32,
             note="step 1000, other betas"),
        Case({"n": 400_000, "step": 10, "scale": 3.0, "weight_decay": 0.0}, F16,
             note="a scale that is not a power of two, no weight decay"),
        Case({"n": 200_000, "step": 3, "eps": 1e-6, "scale": 1.0}, F32, note=SMALL_GRADS),
        Case({"n": 1 << 22, "step": 5}, F16, note=INF_LAST),
        Case({"n": 300_000, "step": 2}, F16, note=NAN_FIRST),
        Case({"n": 900_000, "step": 7, "scale": 1.0}, F32, note=NEG_INF),
        Case({"n": 1 << 20, "step": 3}, F16, note=EVERYWHERE),
        Case({"n": 100, "step": 4}, F16, note="fewer than a block"),
        Case({"n": 1_000_000, "step": 2, "scale": 1.0}, BF16),
        Case({"n": 1 << 26, "step": 100}, F16, note="timed", timed=True),
    ],
    # Not measured yet (no GPU at hand). The course's kernels move 30 bytes a parameter
    # against 28 compulsory, so up to 93% of the copy roof; the goal is 80%, and 1.3× the
    # PyTorch path (fp32 copy of the gradient, unscale_, AdamW(fused=True), bf16 copy: 48
    # bytes a parameter and a host sync). The bars are set below both until measured.
    levels=Levels(passing=0.4, good=0.7, excellent=0.8),
    baseline=_torch_adamw, baseline_name="grad.float() + unscale_ + AdamW(fused=True) + copy",
    at_least_vs_baseline=1.0,
    hints=("Two launches. The check reads the gradient and raises found_inf (an atomic: "
           "several programs may find one). The step reads found_inf first and does nothing "
           "if it is set; otherwise it unscales, updates m and v, the weight, and writes the "
           "bf16 copy, each loaded once and stored once.",
           "g = grad * (1 / scale); m = beta1 * m + (1 - beta1) * g; v = beta2 * v + "
           "(1 - beta2) * g * g; w = w * (1 - lr * weight_decay) - step_size * m / "
           "(sqrt(v) / sqrt(1 - beta2**step) + eps), step_size = lr / (1 - beta1**step). The "
           "copy: bf16_bits(w), stored as int16."),
    answer_in=("nonfinite_kernel", "adamw_kernel"),
))


# === amp/fp8_quantize =========================================================================

FP8_SIGNATURE = ("(x: Tensor bf16, contiguous, scale: Tensor[1] fp32) -> (q: Tensor "
                 "float8_e4m3fn, x's shape: x * scale rounded, saturating at ±448; amax: "
                 "Tensor[1] fp32, the largest |x|)")
DELAYED = "delayed scaling: the scale of a smaller amax, so the largest values saturate"
CURRENT = "the scale of this tensor's own amax: nothing saturates"
TINY_SCALE = "a small scale: many e4m3 subnormals"
OUTLIERS = "a few outliers 1000 times the rest"
FP8_TRAFFIC = "traced for traffic"


def _fp8_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    shape = tuple(v for k, v in case.sizes.items() if k in ("m", "n"))
    x = torch.randn(shape, generator=gen, device=device) * case.scale
    if case.note == OUTLIERS:
        picks = torch.rand(shape, generator=gen, device=device) < 0.001
        x = torch.where(picks, x * 1000, x)
        # The largest sits a quarter of the way in, never in the last block alone: an
        # amax taken from one block must miss it, whatever the draw.
        x.view(-1)[x.numel() // 4] = -2 * x.abs().max()
    x = x.to(BF16)
    if x.numel() > 2:  # signed zeros too
        x.view(-1)[:2] = torch.tensor([0.0, -0.0], dtype=BF16, device=device)
    amax = float(x.float().abs().max())
    scale = {DELAYED: 448.0 / (amax * 0.6), CURRENT: 448.0 / amax,
             TINY_SCALE: 2.0**-6 / amax * 3}.get(case.note, 448.0 / amax / 2)
    return x, torch.tensor([scale], dtype=torch.float32, device=device)


def _fp8_reference(x: torch.Tensor, scale: torch.Tensor) -> dict:
    product = x.float() * scale.float()
    q = product.clamp(-448.0, 448.0).to(E4M3)
    return {"x": x, "scale": scale.float(), "q": q, "amax": x.abs().max().float()}


def _fp8_cost(case: Case) -> Cost:
    n = math.prod(v for k, v in case.sizes.items() if k in ("m", "n"))
    return Cost(3 * n, 3 * n + 8)  # 2 bytes read and 1 written an element


def compare_fp8(output: object, reference: dict) -> str:
    x, want_q = reference["x"], reference["q"]
    if not (isinstance(output, (tuple, list)) and len(output) == 2
            and all(isinstance(t, torch.Tensor) for t in output)):
        return "return (q, amax): a float8_e4m3fn tensor and a one-element fp32 tensor"
    q, amax = output
    if q.dtype != E4M3:
        return f"q: dtype {dtype_name(q.dtype)}, expected float8_e4m3fn"
    if tuple(q.shape) != tuple(x.shape):
        return f"q: shape {tuple(q.shape)}, expected {tuple(x.shape)}"
    if amax.dtype != F32 or amax.numel() != 1:
        return "amax: expected a one-element fp32 tensor"
    got = q.detach().to(x.device).reshape(-1).view(torch.uint8).int()
    want = want_q.reshape(-1).view(torch.uint8).int()
    wrong = got != want
    if bool(wrong.any()):
        return _fp8_cause(got, want, wrong, reference)
    want_amax = reference["amax"].item()
    got_amax = amax.item()
    if got_amax != want_amax:
        head = f"amax is {got_amax!r}, expected {want_amax!r}, the largest |x|"
        if math.isclose(got_amax, want_amax * reference["scale"].item(), rel_tol=1e-6):
            return head + (": it is the amax of the scaled values. Record the amax of x "
                           "itself: the next step's scale is 448 / amax")
        if got_amax < want_amax:
            return head + (": it misses some elements. Fold each block's largest |x| into it "
                           "with tl.atomic_max (start it at 0)")
        return head
    return ""


def _fp8_cause(got: torch.Tensor, want: torch.Tensor, wrong: torch.Tensor,
               reference: dict) -> str:
    x, scale = reference["x"].reshape(-1).float(), reference["scale"].float()
    product = x * scale
    i = int(wrong.nonzero()[0])
    head = (f"{int(wrong.sum())} of {got.numel()} values differ from torch's e4m3 conversion "
            f"of x * scale saturated at ±448, first element {i}: x * scale = "
            f"{product[i].item():.6g}, expected {_hex(int(want[i]), 2)}, got "
            f"{_hex(int(got[i]), 2)}")
    beyond = product.abs() > 448
    nan_codes = (got & 0x7F) == 0x7F
    if bool((wrong <= beyond).all()) and bool(nan_codes[wrong].all()):
        return head + (": every wrong value is beyond ±448 and came back as NaN. e4m3 has no "
                       "inf: clamp x * scale to ±448 before converting")
    divided = (x / scale).clamp(-448.0, 448.0).to(E4M3).view(torch.uint8).int()
    if bool((got == divided).all()):
        return head + ": x was divided by the scale; multiply it"
    magnitude, expected = got & 0x7F, want & 0x7F
    below = expected[wrong] - magnitude[wrong]
    # One code too large in magnitude, for x * scale exactly between the two: a tie rounded
    # away from the even code.
    decoded = (lambda codes: codes.to(torch.uint8).view(E4M3).float().abs())  # noqa: E731
    tie = (below == -1) & (product[wrong].abs() * 2 == decoded(want[wrong])
                           + decoded(got[wrong]))
    if interpreter_enabled() and bool((((below > 0) & (below <= 8)) | tie).all()):
        return head + (": every wrong value is smaller in magnitude than the right one, by "
                       "at most a binade, or a tie rounded away from the even code: not "
                       "rounded to nearest even. Here .to(tl.float8e4nv) is Triton's "
                       "interpreter's conversion, which does not round so (nor saturate); "
                       "e4m3_bits rounds on the bits")
    return head


def _fp8_structure(case: Case, inputs: tuple, launches: list, output: object) -> str:
    x = inputs[0]
    if not (isinstance(output, (tuple, list)) and len(output) == 2):
        return ""
    done = _kernels_did_the_work([x], [output[0]], launches)
    if done:
        return done
    loaded = traced.bytes_moved(launches, x, "load")
    if loaded > x.numel() * x.element_size():
        return (f"reads x {loaded / (x.numel() * x.element_size()):.1f} times: one read can "
                "scale, convert and take the amax together (delayed scaling uses an earlier "
                "step's amax, so nothing needs this one's first)")
    return ""


def _torch_fp8(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().max().float().reshape(1)
    return (x.float() * scale).clamp(-448.0, 448.0).to(E4M3), amax


register(Problem(
    id="amp/fp8_quantize", title="bf16 to fp8 e4m3 with a per-tensor scale, saturating, and "
                                 "the amax for the next step: one read",
    signature=FP8_SIGNATURE, make_inputs=_fp8_inputs, reference=_fp8_reference,
    cost=_fp8_cost, compare=compare_fp8, trace_check=_fp8_structure,
    library_ops=CASTS, solution="rooflab.kernels.amp:fp8_quantize",
    cpu_cases=[
        Case({"n": 10000}, E4M3, note=DELAYED),
        Case({"n": 6000}, E4M3, note=CURRENT),
        Case({"m": 33, "n": 257}, E4M3, scale=0.01, note=TINY_SCALE),
        Case({"n": 20000}, E4M3, note=OUTLIERS),
        Case({"n": 5}, E4M3, scale=100.0, note="fewer than a block"),
        Case({"n": 4 * 8192}, E4M3, note=FP8_TRAFFIC),
    ],
    gpu_cases=[
        Case({"n": 1_000_003}, E4M3, note=DELAYED),
        Case({"n": 600_000}, E4M3, note=CURRENT),
        Case({"m": 1023, "n": 2049}, E4M3, scale=0.01, note=TINY_SCALE),
        Case({"n": 1 << 22}, E4M3, note=OUTLIERS),
        Case({"n": 5}, E4M3, scale=100.0, note="fewer than a block"),
        Case({"n": 1 << 28}, E4M3, note="timed", timed=True),
    ],
    # Not measured yet (no GPU at hand). One read of 2 bytes and one write of 1 an element;
    # the goal is 85% of the copy roof. PyTorch's abs().max() and scaled conversion make
    # several passes and temporaries (about 30 bytes an element). The bars are set below
    # the goal until measured.
    levels=Levels(passing=0.4, good=0.7, excellent=0.85),
    baseline=_torch_fp8, baseline_name="x.abs().max() + (x * scale).clamp().to(float8)",
    at_least_vs_baseline=2.0,
    hints=("One pass over x: each block loads x (as fp32), multiplies it by the scale, "
           "converts with e4m3_bits (which saturates at ±448: e4m3 has no inf) and stores "
           "the bytes; and it folds its largest |x| into amax with an atomic. The scale came "
           "from an earlier step: nothing waits for this step's amax.",
           "tl.store(q_ptr + offsets, e4m3_bits(x * tl.load(scale_ptr)), mask=mask), then "
           "tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0)): masked lanes loaded 0, "
           "which never wins."),
    answer_in=("fp8_quantize_kernel",),
))
