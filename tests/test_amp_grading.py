"""Lab 07 graded, the first half: amp/bf16_round, amp/underflow, amp/loss_scaler and
amp/train_step pass right answers written other ways, fail wrong and cheating ones, and
name the classic slip when the evidence shows it; the same verdict whatever the seed.

Each mutant is kernels/amp.py with a line or two changed (tests/mutants.py), graded on
the cases that show its bug.
"""

import dataclasses
import math

import mutants
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from mutants import grade, only
from test_amp_cheats import causes_by_seed

from rooflab.autograder import get_problem
from rooflab.autograder.problems.amp import formats, scaling
from rooflab.kernels import amp


def _mutant(tmp_path, *edits, name="mutant_amp"):
    return mutants.mutant(tmp_path, "amp", *edits, name=name)


@pytest.fixture
def one_thread():
    """Tiny models train faster on one CPU thread than on a pool of busy ones."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- amp/bf16_round --------------------------------------------------------------------------

TRUNCATE = ("    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16\n",
            "    rounded = bits >> 16\n")


@triton.jit
def _bf16_other_way(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Round to nearest even another way: pick the increment by the kept lowest bit, and
    make every NaN the canonical quiet NaN (as a GPU does)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    bits = tl.load(x_ptr + offsets, mask=mask).to(tl.uint32, bitcast=True)
    odd = (bits & 0x10000) != 0
    rounded = tl.where(odd, bits + 0x8000, bits + 0x7FFF) >> 16
    nan = (bits & 0x7F800000) == 0x7F800000
    nan = nan & ((bits & 0x007FFFFF) != 0)
    rounded = tl.where(nan, 0x7FFF, rounded)
    tl.store(out_ptr + offsets, rounded.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)


def bf16_other_way(x):
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    _bf16_other_way[(triton.cdiv(x.numel(), 512),)](x, out.view(torch.int16), x.numel(),
                                                    BLOCK=512)
    return out


def test_bf16_rounding_written_another_way_passes():
    result = grade("amp/bf16_round", bf16_other_way)
    assert result.passed, result.message()


@pytest.mark.parametrize("edits, words", [
    ([TRUNCATE], "truncates toward zero"),
    ([("    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16\n",
       "    rounded = (bits + 0x8000) >> 16\n")], "ties go to the even neighbour"),
    ([("    rounded = tl.where(is_nan, (bits >> 16) | 0x40, rounded)\n", "")],
     "as inf: the payload of this NaN lies in the 16 bits that go"),
], ids=["truncation", "ties away from zero", "NaN lost"])
def test_the_classic_rounding_slips_are_named(tmp_path, edits, words):
    mutant = _mutant(tmp_path, *edits)
    result = grade(only("amp/bf16_round", formats.SPECIAL), mutant.bf16_round)
    assert not result.passed
    assert words in result.causes[0], result.causes[0]


def test_torch_conversion_is_a_library_call():
    result = grade(only("amp/bf16_round", "ragged"), lambda x: x.to(torch.bfloat16))
    assert "calls the library (aten._to_copy)" in result.causes[-1]


def test_a_conversion_on_the_host_beside_a_kernel_is_a_library_call():
    def copied(x):
        out = amp.bf16_round(x)
        out.copy_(x)  # a copy between dtypes converts: torch did the work
        return out

    result = grade(only("amp/bf16_round", "ragged"), copied)
    assert "calls the library (aten.copy_)" in result.causes[-1]


def test_an_answer_made_with_numpy_does_not_follow_new_inputs():
    def numpy_bits(x):
        amp.bf16_round(x[:1].contiguous())  # a kernel launched for show
        bits = x.numpy().view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        out = torch.empty(x.shape, dtype=torch.bfloat16)
        target = out.view(torch.int16).numpy()
        target[...] = rounded.view(np.int16)  # written behind torch's back
        return out

    if torch.cuda.is_available():
        pytest.skip("numpy works on host tensors")
    result = grade(only("amp/bf16_round", "ragged"), numpy_bits)
    assert not result.passed


@pytest.mark.cpu("Triton's interpreter stores fp32 into bf16 by truncating; a GPU rounds")
def test_a_float_store_truncates_on_a_cpu_and_the_check_says_so(tmp_path):
    mutant = _mutant(tmp_path, ("    tl.store(out_ptr + offsets, bf16_bits(x).to(tl.int16, "
                                "bitcast=True), mask=mask)",
                                "    tl.store(out_ptr + offsets, x.to(tl.bfloat16), mask=mask)"),
                     ("bf16_round_kernel[(triton.cdiv(n, block),)](x, out.view(torch.int16), n,",
                      "bf16_round_kernel[(triton.cdiv(n, block),)](x, out, n,"))
    result = grade(only("amp/bf16_round", "ragged"), mutant.bf16_round)
    assert "truncates toward zero (as Triton's interpreter does" in result.causes[0]


@pytest.mark.gpu
def test_a_float_store_rounds_on_a_gpu_and_passes(tmp_path):
    mutant = _mutant(tmp_path, ("    tl.store(out_ptr + offsets, bf16_bits(x).to(tl.int16, "
                                "bitcast=True), mask=mask)",
                                "    tl.store(out_ptr + offsets, x.to(tl.bfloat16), mask=mask)"),
                     ("bf16_round_kernel[(triton.cdiv(n, block),)](x, out.view(torch.int16), n,",
                      "bf16_round_kernel[(triton.cdiv(n, block),)](x, out, n,"))
    result = grade("amp/bf16_round", mutant.bf16_round)
    assert result.passed, result.message()


@pytest.fixture(scope="module")
def truncating(tmp_path_factory):
    return _mutant(tmp_path_factory.mktemp("amp_seeds"), TRUNCATE, name="seed_truncating")


@pytest.mark.parametrize("seed", range(20))
def test_rounding_verdicts_do_not_depend_on_the_seed(seed, truncating):
    result = grade(only("amp/bf16_round", formats.SPECIAL), truncating.bf16_round, seed=seed)
    assert "truncates toward zero" in result.causes[0]
    assert grade(only("amp/bf16_round", formats.SPECIAL), amp.bf16_round, seed=seed).passed


# --- amp/underflow ---------------------------------------------------------------------------


def fate_by_thresholds(grad, scale=1.0):
    """The same fractions from the thresholds, in numpy."""
    value = np.abs(grad.double().cpu().numpy() * scale)
    n = value.size
    return (np.count_nonzero((value > 0) & (value <= 2.0**-25)) / n,
            np.count_nonzero((value > 2.0**-25) & (value < 2.0**-14 - 2.0**-25)) / n,
            np.float32(np.count_nonzero(np.isfinite(value) & (value >= 65520)) / n))


def test_fractions_from_thresholds_pass():
    result = grade("amp/underflow", fate_by_thresholds)
    assert result.passed, result.message()


@pytest.mark.parametrize("candidate, notes, words", [
    (lambda g, s: amp.fp16_fate(g, 1.0), ("GradScaler's initial scale",), "without the scale"),
    (lambda g, s: (float((((g * s).half() == 0)).float().mean()),
                   *amp.fp16_fate(g, s)[1:]), (formats.BOUNDARIES,),
     "includes elements that were zero already"),
    (lambda g, s: (float(((g * s).abs() < 2.0**-24).float().mean()
                         - (g == 0).float().mean()),
                   float((((g * s).abs() >= 2.0**-24)
                          & ((g * s).abs() < 2.0**-14 - 2.0**-25)).float().mean()),
                   amp.fp16_fate(g, s)[2]), (formats.BOUNDARIES,),
     "round up to fp16's smallest subnormal"),
], ids=["no scale", "zeros counted", "2^-24 as the edge"])
def test_the_classic_counting_slips_are_named(candidate, notes, words):
    result = grade(only("amp/underflow", *notes), candidate)
    assert not result.passed
    assert words in result.causes[0], result.causes[0]


def test_a_tensor_or_a_numpy_number_is_a_fraction_too_but_not_a_string():
    as_tensors = grade("amp/underflow", lambda g, s: tuple(torch.tensor(f) for f in
                                                          amp.fp16_fate(g, s)))
    assert as_tensors.passed, as_tensors.message()
    words = grade(only("amp/underflow", "no scale"), lambda g, s: ("a", "b", "c"))
    assert "underflow: got 'a'" in words.causes[0]


@pytest.mark.parametrize("seed", range(20))
def test_counting_verdicts_do_not_depend_on_the_seed(seed):
    notes = ("GradScaler's initial scale", "a scale below 1")
    unscaled = grade(only("amp/underflow", *notes), lambda g, s: amp.fp16_fate(g, 1.0),
                     seed=seed)
    assert "without the scale" in unscaled.causes[0]
    assert grade("amp/underflow", amp.fp16_fate, seed=seed).passed


# --- amp/loss_scaler -------------------------------------------------------------------------


class TensorScaler:
    """Another right scaler: the scale is a one-element fp32 tensor (as GradScaler's), the
    check is by isnan and isinf, the unscale a division by a float32 reciprocal."""

    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        self.value = torch.tensor([init_scale], dtype=torch.float32)
        self.grow, self.back, self.every = growth_factor, backoff_factor, growth_interval
        self.growth_tracker, self.skipped = 0, False

    def get_scale(self):
        return float(self.value)

    def scale(self, loss):
        return loss * float(self.value)

    def step(self, optimizer):
        inverse = torch.tensor(1.0 / float(self.value), dtype=torch.float64).float()
        grads = [p.grad for g in optimizer.param_groups for p in g["params"]]
        self.skipped = any(bool(g.isnan().any() or g.isinf().any()) for g in grads)
        for g in grads:
            g.mul_(inverse)
        if not self.skipped:
            optimizer.step()

    def update(self):
        if self.skipped:
            self.value = torch.tensor([float(self.value) * self.back]).float()
            self.growth_tracker = 0
        elif self.growth_tracker + 1 < self.every:
            self.growth_tracker += 1
        else:
            grown = torch.tensor([float(self.value) * self.grow]).float()
            self.value = grown if torch.isfinite(grown).all() else self.value
            self.growth_tracker = 0


def test_a_scaler_written_another_way_passes():
    # The check on every case but the 2 010 steps of the defaults, which its watch makes
    # a minute long; those by the problem's own comparison.
    spec = get_problem("amp/loss_scaler")
    result = grade(dataclasses.replace(spec, cpu_cases=spec.cpu_cases[1:],
                                       gpu_cases=spec.gpu_cases[1:]), TensorScaler)
    assert result.passed, result.message()
    assert spec.cpu_cases[0].note == scaling.DEFAULTS
    assert causes_by_seed(only(spec, scaling.DEFAULTS), TensorScaler, [0]) == [""]


SCALER_SLIPS = [
    ("isinf", [("if not bool(torch.isfinite(p.grad).all()):", "if bool(p.grad.isinf().any()):")],
     "infs and NaNs at random", "a test against inf alone misses NaN"),
    ("no backoff", [("            self._scale = _fp32(self._scale * self.backoff_factor)\n", "")],
     "infs and NaNs at random", "after a skipped step the scale backs off"),
    ("float64", [("            self._scale = _fp32(self._scale * self.backoff_factor)\n",
                  "            self._scale = self._scale * self.backoff_factor\n")],
     scaling.BURSTS, "keeps the scale in fp32"),
    ("inf growth", [("if math.isfinite(grown):", "if True:")],
     "a scale near fp32's largest number", "past fp32's largest number"),
    ("no unscale", [("                    p.grad.mul_(inverse)\n", "")],
     "infs and NaNs at random", "stepped with the scaled gradients"),
    ("tracker kept", [("                self._scale = grown\n            self.growth_tracker = 0\n",
                       "                self._scale = grown\n")],
     "infs and NaNs at random", "the growth tracker restarts at 0"),
]


@pytest.mark.parametrize("name, edits, note, words", SCALER_SLIPS,
                         ids=[slip[0] for slip in SCALER_SLIPS])
def test_the_classic_scaler_slips_are_named(tmp_path, name, edits, note, words):
    mutant = _mutant(tmp_path, *edits)
    result = grade(only("amp/loss_scaler", note), mutant.LossScaler)
    assert not result.passed
    assert words in result.causes[0], result.causes[0]


def test_wrapping_gradscaler_is_a_library_call():
    class Wrapped(torch.amp.GradScaler):
        def __init__(self, **kwargs):
            super().__init__("cpu" if not torch.cuda.is_available() else "cuda", **kwargs)

        @property
        def growth_tracker(self):
            return self._get_growth_tracker()

    result = grade(only("amp/loss_scaler", "infs and NaNs at random"), Wrapped)
    assert not result.passed
    assert "calls the library (aten._amp_foreach_non_finite_check_and_unscale_" in \
        result.causes[0]


def test_the_scaler_cases_use_every_argument_and_the_defaults():
    cases = get_problem("amp/loss_scaler").cpu_cases
    for name in ("init_scale", "growth_factor", "backoff_factor", "growth_interval"):
        values = {case.sizes.get(name) for case in cases}
        assert None in values and len(values) >= 3, name  # the default, and two others
    defaults = next(c for c in cases if c.note == scaling.DEFAULTS)
    assert defaults.sizes["steps"] > 2000  # a growth at 2000 good steps


@pytest.fixture(scope="module")
def misses_nan(tmp_path_factory):
    return _mutant(tmp_path_factory.mktemp("amp_scaler_seeds"), *SCALER_SLIPS[0][1],
                   name="seed_misses_nan")


def test_scaler_verdicts_do_not_depend_on_the_seed(misses_nan):
    spec = only("amp/loss_scaler", "infs and NaNs at random", scaling.BURSTS)
    assert "misses NaN" in grade(spec, misses_nan.LossScaler).causes[0]
    assert grade(spec, amp.LossScaler).passed
    # Twenty seeds through the problem's own comparison: the check's watch costs seconds.
    assert all("misses NaN" in cause for cause in causes_by_seed(spec, misses_nan.LossScaler))
    assert causes_by_seed(spec, amp.LossScaler) == [""] * 20


# --- amp/train_step --------------------------------------------------------------------------


def step_another_way(model, optimizer, scaler, loss_fn, x, y, dtype):
    """Right, written otherwise: zeroed gradients kept, autocast entered only for 16-bit
    dtypes, an explicit unscale_ before the step."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    if dtype == torch.float32:
        loss = loss_fn(model(x), y)
    else:
        with torch.autocast(device_type=x.device.type, dtype=dtype):
            out = model(x)
            loss = loss_fn(out, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return torch.tensor(loss.item())


def test_a_training_step_written_another_way_passes():
    result = grade("amp/train_step", step_another_way)
    assert result.passed, result.message()


TRAIN_SLIPS = [
    ("no autocast", [("enabled=dtype != torch.float32)", "enabled=False)")],
     scaling.IN_BF16, "the matmuls ran in fp32, not bf16"),
    ("no update", [("        scaler.update()\n", "")], scaling.IN_FP16_SGD,
     "step() has already been called since the last update()"),  # GradScaler's own words
    ("no zero_grad", [("    optimizer.zero_grad(set_to_none=True)\n", "")], scaling.IN_FP32,
     "the gradients accumulate from step to step"),
    ("scaled loss", [("        scaler.scale(loss).backward()\n",
                      "        loss = scaler.scale(loss)\n        loss.backward()\n")],
     scaling.IN_FP16_TINY, "the loss returned is the scaled one"),
    ("bypass", [("        scaler.step(optimizer)\n        scaler.update()\n",
                 "        optimizer.step()\n")],
     scaling.IN_FP16_SGD, "step through the scaler"),
]


@pytest.mark.parametrize("name, edits, note, words", TRAIN_SLIPS,
                         ids=[slip[0] for slip in TRAIN_SLIPS])
def test_the_classic_training_slips_are_named(tmp_path, name, edits, note, words):
    mutant = _mutant(tmp_path, *edits)
    result = grade(only("amp/train_step", note), mutant.train_step)
    assert not result.passed
    assert words in result.causes[0], result.causes[0]


def test_weights_kept_in_half_precision_are_named():
    def half_model(model, optimizer, scaler, loss_fn, x, y, dtype):
        model.to(dtype)
        return amp.train_step(model, optimizer, scaler, loss_fn, x.to(dtype), y, torch.float32)

    result = grade(only("amp/train_step", scaling.IN_BF16), half_model)
    assert "keep the fp32 master weights" in result.causes[0]


def test_the_training_cases_cover_every_dtype_scaler_and_optimizer():
    notes = {case.note for case in get_problem("amp/train_step").cpu_cases}
    settings = [scaling._TRAINING[note] for note in notes]
    assert {dtype for dtype, _, _ in settings} == {torch.float32, torch.bfloat16, torch.float16}
    assert {kind for _, kind, _ in settings} == {"sgd", "adamw"}
    assert {scale is None for _, _, scale in settings} == {True, False}
    assert any(dtype == torch.float16 and scale is None for dtype, _, scale in settings)


def test_a_bf16_run_tracks_fp32_within_the_lab_s_tolerance(one_thread):
    """The statement the lab makes: bf16 autocast follows fp32's loss curve within 2%."""
    x, y = amp.teacher_task(2048, 16, 8)
    curves = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = amp.mlp(16, 32, 2, 8)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(2)
        curves[dtype] = []
        for _ in range(60):
            pick = torch.randint(0, 2048, (64,), generator=generator)
            curves[dtype].append(amp.train_step(model, optimizer, None,
                                                torch.nn.functional.cross_entropy,
                                                x[pick], y[pick], dtype))
    ratio = [b / a for a, b in zip(curves[torch.float32], curves[torch.bfloat16], strict=True)]
    assert max(abs(r - 1) for r in ratio) < 0.02
    assert math.isclose(sum(curves[torch.float32][-10:]), sum(curves[torch.bfloat16][-10:]),
                        rel_tol=0.01)
