"""Lab 07, scaling and the training step: dynamic loss scaling, step by step as
``torch.amp.GradScaler`` (``amp/loss_scaler``), and a training step under autocast with
fp32 weights (``amp/train_step``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...device import one_cpu_thread
from ...evidence.recording import paused
from ...problem import Case, Cost, Problem, dtype_name, register
from ..roofline import real_number
from .common import BF16, F16, F32, Diagnosis

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
    with infs and NaNs on some steps, the weights each step starts from, and the scaler's
    constructor arguments (None: leave them at their defaults)."""
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
    # Weights of about 1, and 3 to 6 away from 0: the decay's share of a step, about a
    # third, is never lost in the rounding of the gradient's.
    sign = torch.where(torch.rand((2, 3), generator=gen, device=device) < 0.5, -1.0, 1.0)
    start = sign * (3.0 + 3.0 * torch.rand((2, 3), generator=gen, device=device))
    arguments = tuple(sizes.get(name) for name in ("init_scale", "growth_factor",
                                                   "backoff_factor", "growth_interval"))
    return (grads, start, *arguments)


def _scaler_kwargs(init_scale, growth_factor, backoff_factor, growth_interval) -> dict:
    given = {"init_scale": init_scale, "growth_factor": growth_factor,
             "backoff_factor": backoff_factor, "growth_interval": growth_interval}
    return {key: value for key, value in given.items() if value is not None}


# The optimizer the scaler steps: SGD of rate 1 with weight decay. Without the decay, a
# learning rate divided by the scale would take the same step as gradients unscaled.
LR, WEIGHT_DECAY = 1.0, 0.1


class _WatchedSGD:
    """SGD of rate LR with weight decay, as ``torch.optim.SGD`` steps (the decay added to
    the gradient), noting at each step the gradients it steps with (what the scaler left
    in ``.grad``), its learning rate and its weight decay. A plain class with what a
    scaler uses of an optimizer (``param_groups``, ``step``, ``zero_grad``): torch.optim's
    own machinery (hooks, profiling, foreach dispatch) costs far more than a step of six
    numbers, and a check takes thousands of steps while every Python call is watched."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.param_groups = [{"params": list(params), "lr": LR, "weight_decay": WEIGHT_DECAY}]
        self.state: dict = {}
        self.seen: list[tuple] = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        for weight in self.param_groups[0]["params"]:
            if weight.grad is not None:
                weight.grad = None if set_to_none else weight.grad.zero_()

    def step(self, closure: Callable | None = None) -> None:
        with paused(), torch.no_grad():
            group = self.param_groups[0]
            weights, rate, decay = group["params"], group["lr"], group["weight_decay"]
            self.seen.append(([w.grad.detach().clone() if w.grad is not None else None
                               for w in weights], rate, decay))
            for weight in weights:
                if weight.grad is not None:
                    weight.add_(weight.grad.add(weight, alpha=decay), alpha=-rate)

    def stepped_with(self, first: int, last: int) -> list[float]:
        """What the last step among steps ``first`` to ``last`` (not included) stepped
        with: the six gradients, lr and weight decay, and the count of steps; NaN but the
        count if there was none."""
        if last == first:
            return [float("nan")] * (SEEN - 1) + [0.0]
        grads, rate, decay = self.seen[last - 1]
        values = [torch.full((3,), float("nan")) if g is None else g.float().reshape(-1).cpu()
                  for g in grads]
        return [*torch.cat(values).double().tolist(), float(rate), float(decay),
                float(last - first)]


SEEN = 6 + 2 + 1  # per step: the gradients stepped with, lr, weight decay; the steps taken


def _drive(scaler: object, grads: torch.Tensor, start: torch.Tensor,
           tracker: Callable[[object], int | None], watch: TorchDispatchMode | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the scripted steps through ``scaler``: each step, the weights back at ``start``
    and the gradients of a loss of 1 scaled by the scaler (the script times the scale),
    then step the watched SGD and update. Per step: (scale before, scaled loss, scale
    after, growth tracker after), the weights after the step, and what the optimizer
    stepped with (``stepped_with``). ``watch`` looks at the ops of the first 100 steps."""
    device = grads.device
    with paused():
        weights = [torch.zeros(3, device=device, requires_grad=True) for _ in range(2)]
        sgd = _WatchedSGD(weights)
        loss = torch.ones((), device=device)
        script, begin = grads.float(), start.float()
    states, after, taken = [], [], [0]
    for step in range(grads.shape[0]):
        with paused(), torch.no_grad():
            for weight, value in zip(weights, begin, strict=True):
                weight.copy_(value)
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
            taken.append(len(sgd.seen))
    with paused():
        seen = [sgd.stepped_with(first, last)
                for first, last in zip(taken, taken[1:], strict=False)]
        return (torch.tensor(states, dtype=torch.float64),
                torch.stack(after).float().cpu(), torch.tensor(seen, dtype=torch.float64))


def _run_scaler(candidate: Callable, inputs: tuple) -> tuple:
    grads, start, *arguments = inputs
    watch = _OpWatch()
    with one_cpu_thread():
        with watch:
            scaler = candidate(**_scaler_kwargs(*arguments))
        states, after, seen = _drive(scaler, grads, start,
                                     lambda s: getattr(s, "growth_tracker", None), watch)
    return states, after, seen, ", ".join(sorted(watch.seen))


def _scaler_reference(grads: torch.Tensor, start: torch.Tensor, *arguments) -> tuple:
    gradscaler = torch.amp.GradScaler(grads.device.type, **_scaler_kwargs(*arguments))
    with one_cpu_thread():
        states, after, seen = _drive(gradscaler, grads.float(), start.float(),
                                     lambda s: s._get_growth_tracker())
    return states, after, seen, start.float().cpu().reshape(-1), _scaler_kwargs(*arguments)


def _ulps(x: torch.Tensor) -> torch.Tensor:
    """fp32's spacing at |x| (its smallest normal spacing near 0), in float64."""
    x = x.double().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(x)) - 23)


# How far an unscaled gradient may be from GradScaler's: it multiplies by the fp32
# reciprocal of the scale, two roundings; a division by the scale is one rounding, and
# the two differ by an ulp or two where the scale is not a power of two.
ULPS = 4


def compare_scaler(output: object, reference: tuple) -> str:
    want, want_after, want_seen, start, kwargs = reference
    if not (isinstance(output, (tuple, list)) and len(output) == 4):
        return "the scaler could not be driven through the scripted steps"
    got, got_after, got_seen, library = output
    if library:
        return (f"calls the library (aten.{library}): that is GradScaler's own work; the "
                "exercise is to write it")
    settings = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5,
                "growth_interval": 2000, **kwargs}
    suspect = _suspect_steps(got, got_after, got_seen, want, want_after, want_seen, start)
    for step in suspect.nonzero().flatten().tolist():  # the others pass every test below
        g, w = got[step], want[step]
        stepped = bool(want_seen[step, -1] > 0)  # GradScaler stepped: all were finite
        what = f"step {step} ({'finite gradients' if stepped else 'an inf or NaN gradient'})"
        if step == 0 and g[0] != w[0]:
            return (f"the initial scale is {g[0].item():g}, expected {w[0].item():g} (the "
                    "init_scale given, or 2**16 by default)")
        if g[1] != w[1]:
            return (f"{what}: scale(loss) of a loss of 1 gave {g[1].item():g}, expected "
                    f"{w[1].item():g}: the loss times the current scale")
        wrong = _step_cause(got_after[step], got_seen[step], want_after[step],
                            want_seen[step], start, g[0].item())
        if wrong:
            return f"{what}: {wrong}"
        if g[2] != w[2] or (not math.isnan(g[3].item()) and g[3] != w[3]):
            return f"{what}: {_scale_cause(g, w, not stepped, settings)}"
        if math.isnan(g[3].item()) and step == want.shape[0] - 1:
            return "the scaler has no growth_tracker attribute: the count of good steps"
    return ""


def _suspect_steps(got: torch.Tensor, got_after: torch.Tensor, got_seen: torch.Tensor,
                   want: torch.Tensor, want_after: torch.Tensor, want_seen: torch.Tensor,
                   start: torch.Tensor) -> torch.Tensor:
    """The steps where one of compare_scaler's tests may fail, all at once (a step by
    step look at 2 000 steps takes a second)."""
    stepped = want_seen[:, -1] > 0
    moved = (got_after != start).any(dim=1)
    grads, want_grads = got_seen[:, :6], want_seen[:, :6]
    near = ((grads - want_grads).abs() <= ULPS * _ulps(want_grads)).all(dim=1)
    settings = (got_seen[:, 6:8] == want_seen[:, 6:8]).all(dim=1)
    room = ULPS * (_ulps(want_after) + _ulps(start) + _ulps(want_grads.float()))
    weights = ((got_after.double() - want_after.double()).abs() <= room).all(dim=1)
    step_ok = torch.where(stepped, (got_seen[:, -1] == 1) & near & settings & weights, ~moved)
    tracker = got[:, 3].isnan() | (got[:, 3] == want[:, 3])
    suspect = ~step_ok | (got[:, 1] != want[:, 1]) | (got[:, 2] != want[:, 2]) | ~tracker
    suspect[0] |= bool(got[0, 0] != want[0, 0])
    suspect[-1] |= bool(got[-1, 3].isnan())
    return suspect


def _step_cause(got_after: torch.Tensor, got_seen: torch.Tensor, want_after: torch.Tensor,
                want_seen: torch.Tensor, start: torch.Tensor, scale: float) -> str:
    """What is wrong with one step's optimizer step, from the weights after it and what
    the optimizer stepped with, or "". The gradients and weights may be a few fp32
    roundings from GradScaler's: dividing by the scale is as right as multiplying by its
    reciprocal."""
    moved = not torch.equal(got_after, start)
    if want_seen[-1] == 0:
        if moved:
            return ("the weights moved. A step whose gradients hold an inf or a NaN must be "
                    "skipped: torch.isfinite finds both (a test against inf alone misses NaN)")
        return ""
    if got_seen[-1] == 0:
        return ("the step was skipped, but every gradient was finite" if not moved else
                "the weights moved, but not through optimizer.step()")
    if got_seen[-1] > 1:
        return f"the optimizer stepped {int(got_seen[-1])} times: once a step"
    grads, want_grads = got_seen[:6], want_seen[:6]
    if not bool(((grads - want_grads).abs() <= ULPS * _ulps(want_grads)).all()):
        ratio = float(grads.norm() / want_grads.norm().clamp_min(1e-300))
        rate = got_seen[6].item()
        if abs(ratio / scale - 1) < 1e-3 and abs(rate * scale / LR - 1) < 1e-3:
            return (f"the optimizer stepped with gradients {ratio:g} times too large, the "
                    "scale, and a learning rate divided by the scale: this scaled the "
                    "learning rate instead of unscaling the gradients. Only plain SGD takes "
                    "the same step that way; weight decay (here), momentum, Adam's "
                    "normalisation and clipping see the gradients themselves. Multiply "
                    "every gradient by 1 / scale before the step")
        if abs(ratio / scale - 1) < 1e-3:
            return (f"the optimizer stepped with the scaled gradients, the gradients "
                    f"{ratio:g} times too large (the scale): the optimizer stepped with "
                    "gradients that were not unscaled. Multiply every gradient by 1 / scale "
                    "before the step")
        return (f"the optimizer stepped with gradients {ratio:.6g} times GradScaler's "
                "(more than a few fp32 roundings away): multiply every gradient by 1 / scale")
    if got_seen[6] != want_seen[6] or got_seen[7] != want_seen[7]:
        return (f"the optimizer stepped with lr={got_seen[6].item():g} and weight_decay="
                f"{got_seen[7].item():g}, not its own {want_seen[6].item():g} and "
                f"{want_seen[7].item():g}: the scaler unscales the gradients and leaves the "
                "optimizer's settings alone")
    near = ULPS * (_ulps(want_after) + _ulps(start) + _ulps(want_grads.float()))
    if not bool(((got_after.double() - want_after.double()).abs() <= near).all()):
        return ("the weights after the step differ from GradScaler's by more than a few fp32 "
                "roundings, though the optimizer stepped with the same gradients")
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
    with one_cpu_thread():
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
        else:  # no update either: GradScaler refuses one after a step it did not take
            setup.scaler.scale(value).backward()
            setup.optimizer.step()
        return float(value.detach())

    return run


def _train_reference(xs: torch.Tensor, ys: torch.Tensor, seed: int, note: str) -> dict:
    dtype = _TRAINING[note][0]
    setup = _setup(note, seed, xs.device)
    with one_cpu_thread():
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
            head = (f"after step {step} the scale is {scales[step].item():g}, expected "
                    f"{want_scales[step].item():g}")
            slip = _reproducing_slip(output, reference)
            if slip:
                return Diagnosis(f"{head}: {slip}")
            return (f"{head}: scaler.scale(loss).backward(), then scaler.step(optimizer), "
                    "then scaler.update(), once each per step")
        got, want = losses[step].item(), want_losses[step].item()
        if math.isfinite(want) and not math.isclose(got, want, rel_tol=1e-5 if tight else 1e-2,
                                                    abs_tol=1e-12):
            return _train_cause(step, got, want, output, reference)
    start = reference["start"]
    moved = (weights[-1] - start).norm()
    drift = (weights[-1] - want_weights[-1]).norm() / (want_weights[-1] - start).norm()
    if drift > _drift_allowed(dtype):
        head = (f"the weights after {steps} steps are {drift:.1%} (of the distance they "
                f"moved, {moved:.3g}) away from the grader's run of the same steps")
        cause = _train_cause(steps - 1, None, None, output, reference, prefix=": ")
        return Diagnosis(head + cause) if cause else head
    return ""


def _drift_allowed(dtype: torch.dtype) -> float:
    """How far the final weights may be from a run of the same steps, as a share of the
    distance that run moved them: 16-bit matmuls round differently from one order of
    operations to another."""
    return 1e-4 if dtype == F32 else 5e-2


def _train_cause(step: int, got: float | None, want: float | None, output: tuple,
                 reference: dict, prefix: str = "") -> str:
    head = "" if got is None else \
        f"the loss of step {step} is {got:.6g}, where the grader's run has {want:.6g}"
    scales = reference["scales"]
    if got is not None and not math.isnan(scales[step].item()):
        for scale in {scales[step].item(), scales[step - 1].item() if step else 0.0}:
            if scale and math.isclose(got, want * scale, rel_tol=1e-2):
                return Diagnosis(head + ": the loss returned is the scaled one; return the "
                                        "loss itself")
    slip = _reproducing_slip(output, reference)
    if slip:
        return Diagnosis(head + (prefix or ": ") + slip)
    if got is None:
        return ""
    return head + (": the forward and the loss under autocast, backward, then the "
                   "optimizer's step, once each")


_SLIPS = ((dict(zero=False), "the gradients accumulate from step to step: zero them "
           "(optimizer.zero_grad()) at the start of each step"),
          (dict(unscale=False), "the optimizer stepped with the scaled gradients: step "
           "through scaler.step(optimizer), which unscales them first"))


def _reproducing_slip(output: tuple, reference: dict) -> str:
    """The classic slip whose run by the grader the candidate's run passes for, in words:
    the same losses and scales (where there is a scaler) at every step, and final weights
    as close as the check asks of a right answer; "" if none does. Every step, not only
    those up to the first difference: while an fp16 run's first steps overflow and are
    skipped, any slip that changes the gradients looks the same. And the weights too:
    where a slip changes little (gradients left over from a step that unscaled them are
    1 / scale of the next ones), the losses alone cannot tell it from another."""
    losses, weights, scales = output[0], output[1], output[2]
    xs, ys, seed = reference["inputs"]
    start = reference["start"]
    for slip, words in _SLIPS:
        if "unscale" in slip and math.isnan(reference["scales"][0].item()):
            continue
        setup = _setup(reference["note"], seed, xs.device)
        run = _grader_step(setup, _loss_for(reference["note"]), reference["dtype"], **slip)
        with one_cpu_thread():
            slip_losses, slip_weights, slip_scales, _ = _record(run, setup, xs, ys)
        allowed = _drift_allowed(reference["dtype"]) * (slip_weights[-1] - start).norm()
        if torch.allclose(losses, slip_losses, rtol=1e-3, equal_nan=True) and \
                torch.equal(scales.nan_to_num(-1.0), slip_scales.nan_to_num(-1.0)) and \
                (weights[-1] - slip_weights[-1]).norm() <= allowed:
            return words
    return ""


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




