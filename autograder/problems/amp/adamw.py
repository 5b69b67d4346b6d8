"""Lab 07, the fused optimizer: unscale, check for infs and NaNs, and an AdamW step on fp32
master weights with a bf16 copy, graded against AdamW's maths in float64
(``amp/fused_adamw``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...evidence import guard, poison
from ...evidence.recording import paused
from ...problem import Case, Cost, Levels, Problem, register
from .. import traced
from .common import BF16, CASTS, F16, F32, Diagnosis

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
FEWER = "fewer than a block"
NO_DECAY = "a scale that is not a power of two, no weight decay"


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
        "scale": torch.tensor([scale], device=device),
    }
    hyper = {"lr": sizes.get("lr", 1e-3), "beta1": sizes.get("beta1", 0.9),
             "beta2": sizes.get("beta2", 0.999), "eps": sizes.get("eps", 1e-8),
             "weight_decay": sizes.get("weight_decay", 1e-2)}
    ties = _put_ties(values, gen)
    _put_cancellations(values, gen, ties, hyper["beta1"], scale)
    values["param_bf16"] = weights.to(BF16)
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
    guarded = {name: guard.copy(values[name], name) for name in _ORDER}
    initial = {name: values[name].clone() for name in _ORDER}
    return (AdamWState(guarded, initial, sizes.get("step", 1), hyper),)


def _put_ties(values: dict[str, torch.Tensor], gen: torch.Generator) -> torch.Tensor:
    """Make one weight in 16 (at least four) a bf16 tie: an fp32 number exactly halfway
    between two bf16 numbers, half of them with an even lower neighbour (round to nearest
    even goes down, away from zero goes up) and half with an odd one. Their gradient and
    moments are 0 (a row of an embedding no token used), so where the weight decay is 0
    the step leaves them exactly as they are, however it is computed: the bf16 copy of
    the new weights then holds ties on every seed."""
    weights = values["param"]
    n = weights.numel()
    count = min(n, max(4, n // 16))
    where = torch.randperm(n, generator=gen, device=weights.device)[:count]
    upper = (weights[where].to(BF16).view(torch.int16).to(torch.int32) & 0xFFFF) & ~1
    upper[1::2] |= 1  # odd lower neighbours too: a tie that truncation rounds wrongly
    weights[where] = (upper << 16 | 0x8000).view(torch.float32)
    for name in ("grad", "exp_avg", "exp_avg_sq"):
        values[name][where] = 0
    return where


def _put_cancellations(values: dict[str, torch.Tensor], gen: torch.Generator,
                       ties: torch.Tensor, beta1: float, scale: float) -> None:
    """Make one weight in 64 (at least two, none of them a tie) small, with a first moment
    that the new gradient all but cancels: beta1 * m + (1 - beta1) * g keeps about a
    thousandth of either term. A correct step in fp32, with beta1 held in fp32 as a kernel
    holds it, then carries an error of a few fp32 roundings of those terms into a weight
    whose own rounding is tiny: the compare must allow for it (an H100 met one such weight
    among 2^26 random ones)."""
    weights = values["param"]
    n = weights.numel()
    free = torch.ones(n, dtype=torch.bool, device=weights.device)
    free[ties] = False
    candidates = free.nonzero().flatten()
    count = min(candidates.numel(), max(2, n // 64))
    where = candidates[torch.randperm(candidates.numel(), generator=gen,
                                      device=weights.device)[:count]]
    unscaled = values["grad"][where].double() / scale
    kept = 1e-3 * torch.randn(count, generator=gen, device=weights.device).double()
    values["exp_avg"][where] = (-(1 - beta1) / beta1 * unscaled * (1 + kept)).float()
    weights[where] *= 1e-4


class _Bands:
    """The poisoned margins around a step's tensors, to read once the step is judged. An
    answer sent to a grader in another process keeps only this class's repr: the margins
    are read where the candidate's memory is, in the check's own process."""

    def __init__(self, tensors: dict[str, guard.Guarded]):
        self.tensors = tensors

    def outside(self) -> str:
        with paused():
            return ", ".join(name for name, g in self.tensors.items() if g.margins_hit())

    def __repr__(self) -> str:
        return "guard bands, read in the check's own process"


def _run_adamw(candidate: Callable, inputs: tuple) -> tuple:
    (state,) = inputs
    state.calls += 1
    h = state.hyper
    found = candidate(*(state[name] for name in _ORDER), state.step, h["lr"], h["beta1"],
                      h["beta2"], h["eps"], h["weight_decay"])
    # The guard bands are read in the compare, not here: this call is what a timed run
    # repeats, and reading them here would add a host sync to every step timed.
    return (found, state["param"], state["exp_avg"], state["exp_avg_sq"], state["param_bf16"],
            _Bands(state.tensors))


def adamw_float64(w: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                  scale: float, step: int, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, variant: str = "") -> tuple:
    """AdamW's step in float64 (``variant``: one of the classic slips, for diagnosis)."""
    unscaled = g if variant == "no unscale" else g / scale
    if variant == "l2":
        unscaled = unscaled + weight_decay * w
    m_new = beta1 * m + (1 - beta1) * unscaled
    v_new = beta2 * v + (1 - beta2) * unscaled * unscaled
    corrected_m = (m_new if variant in ("no bias correction", "no m correction")
                   else m_new / (1 - beta1**step))
    corrected_v = (v_new if variant in ("no bias correction", "no v correction")
                   else v_new / (1 - beta2**step))
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
    found, param, exp_avg, exp_avg_sq, param_bf16, bands = output
    outside = bands.outside() if isinstance(bands, _Bands) else ""
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
    m_terms = ((h["beta1"] * start["exp_avg"].double()).abs()
               + ((1 - h["beta1"]) * unscaled).abs())
    checks = [("exp_avg", exp_avg, reference["exp_avg"], m_terms,
               ((1 - h["beta1"]) * unscaled).abs(), 0.0),
              ("exp_avg_sq", exp_avg_sq, reference["exp_avg_sq"], reference["exp_avg_sq"],
               (1 - h["beta2"]) * unscaled.square(), 0.0),
              ("param", param, reference["param"], reference["param"],
               4 * (reference["param"] - start["param"].double()).abs(),
               _carried_from_m(state, reference, unscaled, m_terms))]
    slack = 8 * reference["calls"]
    for name, got, want, size, term, carried in checks:
        error = (got.double() - want).abs()
        allowed = (slack * _ulps(size.float()).double() + 3e-5 * slack / 8 * term
                   + slack * carried)
        wrong = ~(error <= allowed)
        if bool(wrong.any()):
            i = int(wrong.nonzero()[0])
            head = (f"{name}: {int(wrong.sum())} of {got.numel()} values off, first at {i}: got "
                    f"{got[i].item():.9g}, expected {want[i].item():.9g} (was "
                    f"{start[name][i].item():.9g})")
            cause = _adamw_cause(output, reference)
            return Diagnosis(head + cause) if cause else head
    copy_bits = param_bf16.view(torch.int16)
    if not torch.equal(copy_bits, _rne_bf16(param).view(torch.int16)):
        wrong = copy_bits != _rne_bf16(param).view(torch.int16)
        head = (f"param_bf16: {int(wrong.sum())} of {param.numel()} values are not the new "
                "fp32 weight rounded to nearest even")
        bits = param.float().view(torch.int32)
        truncated = (bits >> 16).to(torch.int16)
        if torch.equal(copy_bits[wrong], truncated[wrong]):
            return Diagnosis(head + (
                ": they are truncated (a store of fp32 into bf16 truncates in Triton's "
                "interpreter). Round on the bits, as in bf16_bits, and store the 16 bits"))
        if bool(((bits[wrong] & 0xFFFF) == 0x8000).all()) and torch.equal(
                copy_bits[wrong], (truncated[wrong] + 1).to(torch.int16)):
            return Diagnosis(head + (
                ": each is a tie, exactly halfway between two bf16 numbers, rounded away "
                "from zero; a tie goes to the neighbour whose last bit is 0 (add 0x7FFF "
                "plus the lowest bit that stays)"))
        if torch.equal(param_bf16, start["param_bf16"]):
            return head + ": it still holds the old weights; write the copy of the new ones"
        return head
    return ""


def _carried_from_m(state: AdamWState, reference: dict, unscaled: torch.Tensor,
                    m_terms: torch.Tensor) -> torch.Tensor:
    """How far a right fp32 step may move a weight through its first moment. m's error is
    one of the size of its two terms, not of their sum, which can all but cancel: beta1
    held in fp32 (0.9 is 2.4e-8 off) moves both terms, and each fp32 operation rounds at
    most half a unit of the terms' size. The weight moves by that error times the step
    size over the denominator (an H100 met one weight in 2^26 past the bound without
    this)."""
    h, start = state.hyper, state.initial
    held = torch.tensor(h["beta1"], dtype=torch.float32).item()
    m_error = (abs(held - h["beta1"]) * (start["exp_avg"].double().abs() + unscaled.abs())
               + 2.0**-22 * m_terms)
    denominator = (reference["exp_avg_sq"] / (1 - h["beta2"] ** state.step)).sqrt() + h["eps"]
    return h["lr"] / (1 - h["beta1"] ** state.step) * m_error / denominator


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
        "no m correction": ("m is used without its bias correction (v has its own): divide m "
                            "by 1 - beta1**step (step counts from 1)"),
        "no v correction": ("v is used without its bias correction (m has its own): divide v "
                            "by 1 - beta2**step (step counts from 1), under the square root"),
        "l2": ("the weight decay was added to the gradient (Adam with L2); AdamW decays the "
               "weight itself: w * (1 - lr * weight_decay), apart from the gradient"),
        "eps inside": "eps goes outside the square root: sqrt(v_hat) + eps",
        "no decay": "the weight decay is missing: w * (1 - lr * weight_decay)",
    }
    # A slip is named only where it explains the numbers far better than the right maths
    # does: at step 100, 1 - beta1**step is 0.99997, and a step without m's correction is
    # all but the right one.
    right = (got[0] - reference["param"]).norm() / reference["param"].norm().clamp_min(1e-300)
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
        if (max(distance[1:]) < 1e-4 and distance[0] < 1e-2 * max(moved, 1e-30)
                and distance[0] < 0.1 * right):
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
        Case({"n": 4000, "step": 10, "scale": 3.0, "weight_decay": 0.0}, F16, note=NO_DECAY),
        Case({"n": 2000, "step": 3, "eps": 1e-6, "scale": 1.0}, F32, note=SMALL_GRADS),
        Case({"n": 20000, "step": 5}, F16, note=INF_LAST),
        Case({"n": 3000, "step": 2}, F16, note=NAN_FIRST),
        Case({"n": 9000, "step": 7, "scale": 1.0}, F32, note=NEG_INF),
        Case({"n": 2 * 8192, "step": 3}, F16, note=EVERYWHERE),
        Case({"n": 100, "step": 4, "weight_decay": 0.0}, F16, note=FEWER),
        Case({"n": 3 * 8192 + 5, "step": 2}, F16, note=ADAMW_TRAFFIC),  # the largest: traced
        Case({"n": 3000, "step": 2, "scale": 1.0}, BF16),
    ],
    gpu_cases=[
        Case({"n": 1_000_003}, F16, note="the first step: bias corrections at their largest"),
        Case({"n": 300_001, "step": 1000, "lr": 3e-4, "beta1": 0.8, "beta2": 0.95,
              "eps": 1e-6, "weight_decay": 0.1, "scale": 1.0}, F32,
             note="step 1000, other betas"),
        Case({"n": 400_000, "step": 10, "scale": 3.0, "weight_decay": 0.0}, F16,
             note=NO_DECAY),
        Case({"n": 200_000, "step": 3, "eps": 1e-6, "scale": 1.0}, F32, note=SMALL_GRADS),
        Case({"n": 1 << 22, "step": 5}, F16, note=INF_LAST),
        Case({"n": 300_000, "step": 2}, F16, note=NAN_FIRST),
        Case({"n": 900_000, "step": 7, "scale": 1.0}, F32, note=NEG_INF),
        Case({"n": 1 << 20, "step": 3}, F16, note=EVERYWHERE),
        Case({"n": 100, "step": 4, "weight_decay": 0.0}, F16, note=FEWER),
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
    hints=("Two launches. The check reads the gradient and raises found_inf to 1.0 (several "
           "programs may find one: each stores the same 1.0, or takes an atomic max; none "
           "lowers it). The step reads found_inf first and does nothing "
           "if it is set; otherwise it unscales, updates m and v, the weight, and writes the "
           "bf16 copy, each loaded once and stored once.",
           "g = grad * (1 / scale); m = beta1 * m + (1 - beta1) * g; v = beta2 * v + "
           "(1 - beta2) * g * g; w = w * (1 - lr * weight_decay) - step_size * m / "
           "(sqrt(v) / sqrt(1 - beta2**step) + eps), step_size = lr / (1 - beta1**step). The "
           "copy: bf16_bits(w), stored as int16."),
    answer_in=("nonfinite_kernel", "adamw_kernel"),
))


