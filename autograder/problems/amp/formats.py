"""Lab 07, the number formats: fp32 to bf16 rounded on the bits (``amp/bf16_round``), and what
fp16 does to a gradient at its boundaries (``amp/underflow``)."""

from __future__ import annotations

import math

import torch

from ...evidence.compare import form_cause, unwritten_cause
from ...problem import Case, Cost, Levels, Problem, register
from ..roofline import real_number
from .common import BF16, CASTS, F32, Diagnosis, hex_bits, kernels_did_the_work

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
            f"element {first}: fp32 {hex_bits(int(bits[first]), 8)} ({source[first].item():.9g}) "
            f"should give {hex_bits(int(want_bits[first]), 4)}, "
            f"got {hex_bits(int(got_bits[first]), 4)}")
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
    return kernels_did_the_work([inputs[0]], [output], launches)


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
    head = f"{shown} (of {n} elements, scale {scale:g})"
    cause = _fate_cause(got, grad, scale, n)
    return Diagnosis(head + cause) if cause else head


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


