"""What a problem is: a small declarative record the generic engine knows how to grade.

A problem says what a candidate is called with, what the right answer is, how to make
inputs, how close is close enough, what the work costs the machine, and how close to the
roofline counts as good. It says nothing about *how* to check: that is
``checking/engine.py``. The course's own problems are in ``problems/``, which registers
them here and looks them up by id.

A problem's cases ship with the lab: the learner sees every one. It may also say how to
draw hidden ones (``Hidden``): sizes drawn from the grader's secret seed, run only when
``rooflab grade`` grades the notebook, so that a kernel fitted to the public sizes alone
(no mask, a tail it never reaches) fails there.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

DTYPE_NAMES = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class Case:
    """One set of inputs: named sizes, an element type, and how large the values are.

    ``scale`` is the magnitude of the random inputs. A large scale is how a check catches
    the classic overflow bugs (an exponential without the max subtracted, a sum of squares
    in half precision).
    """

    sizes: dict[str, int]
    dtype: torch.dtype | None = torch.float32  # None: the inputs are not tensors
    scale: float = 1.0
    note: str = ""
    # Inputs given as transposed views (non-contiguous), by name: the strides must be used.
    transposed: tuple[str, ...] = ()
    # On a GPU, the case that is timed (default: the one that moves the most bytes).
    timed: bool = False
    # Drawn from the grader's seed (see ``Hidden``): run only when the notebook is graded.
    hidden: bool = False

    @property
    def label(self) -> str:
        sizes = " ".join(f"{k}={v}" for k, v in self.sizes.items())
        extra = f" scale={self.scale:g}" if self.scale != 1.0 else ""
        extra += "".join(f" {name} transposed" for name in self.transposed)
        note = f" ({self.note})" if self.note else ""
        dtype = f" {dtype_name(self.dtype)}" if self.dtype is not None else ""
        hidden = "hidden case " if self.hidden else ""
        return f"{hidden}{sizes}{dtype}{extra}{note}"


@dataclass(frozen=True)
class Span:
    """Where one hidden size is drawn: uniformly among ``lo`` ... ``hi`` (both included),
    keeping only multiples of ``multiple_of`` and, if ``odd``, odd numbers.

    An odd size is a multiple of no power-of-two block: a kernel without masks runs past
    its end, or leaves the tail unwritten. ``multiple_of`` keeps a size a kernel may
    assume (a K that tensor cores take in steps of 16, say).
    """

    lo: int
    hi: int
    multiple_of: int = 1
    odd: bool = False

    def __post_init__(self) -> None:
        if self.multiple_of < 1 or (self.odd and self.multiple_of % 2 == 0):
            raise ValueError(f"{self}: no size is an odd multiple of {self.multiple_of}")
        if self._count() < 1:
            raise ValueError(f"{self}: no size between {self.lo} and {self.hi} keeps the rule")

    def _first_and_step(self) -> tuple[int, int]:
        first = -(-self.lo // self.multiple_of) * self.multiple_of
        if self.odd and first % 2 == 0:
            first += self.multiple_of  # the next multiple is odd: multiple_of is
        return first, self.multiple_of * (2 if self.odd else 1)

    def _count(self) -> int:
        first, step = self._first_and_step()
        return max(0, (self.hi - first) // step + 1)

    def draw(self, rng: random.Random) -> int:
        first, step = self._first_and_step()
        return first + step * rng.randrange(self._count())

    def allows(self, size: int) -> bool:
        return (self.lo <= size <= self.hi and size % self.multiple_of == 0
                and (size % 2 == 1 or not self.odd))


@dataclass(frozen=True)
class Draw:
    """The hidden cases of one world: ``count`` of them, each size drawn from its Span
    (in the order named), of one dtype and scale."""

    sizes: dict[str, Span]
    count: int = 1
    dtype: torch.dtype | None = torch.float32
    scale: float = 1.0


@dataclass(frozen=True)
class Hidden:
    """Graded cases the learner never sees: their sizes are drawn from the grader's secret
    seed, and they run only under ``rooflab grade`` (the learner's own check runs the
    public cases, and its card says how many more grading runs).

    ``cpu`` says how to draw them in the interpreter (small: every program is interpreted),
    ``gpu`` on a GPU (larger; None: the CPU's draw there too). The public cases name the
    traps; hidden ones keep a kernel from being fitted to the public sizes alone. Not for
    a problem on ranks: ``checking/rank_check.py`` runs and judges its own case list, each
    case naming its world size, and draws no hidden cases.
    """

    cpu: Draw
    gpu: Draw | None = None

    def draw(self, on_gpu: bool) -> Draw:
        return self.gpu if on_gpu and self.gpu is not None else self.cpu


@dataclass(frozen=True)
class Cost:
    """What one call must cost at least: FLOPs, and compulsory bytes (every input read
    once, every output written once). ``dtype`` names the compute ceiling that applies."""

    flops: float
    bytes: float
    dtype: str = "fp32"

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte."""
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass(frozen=True)
class Tolerance:
    """How far a result may be from the float64 reference.

    ``rel`` bounds the relative error of the whole output, ‖out − ref‖ / ‖ref‖. ``elem``
    bounds the worst single element, |out_i − ref_i| / (|ref_i| + rms(ref)), so that a
    handful of wrong elements cannot hide inside a small norm.
    """

    rel: float
    elem: float


# Keys are dtype names, plus "tf32" for fp32 inputs multiplied on tensor cores. Each is a
# few times the error of a correct kernel (rounding the exact answer to the output dtype
# gives a relative error of about 2.8e-4 in fp16 and 2e-3 in bf16; TF32 products about
# 4e-4), and tight enough that a kernel computing in a lower precision than asked fails.
EXACT = Tolerance(rel=0.0, elem=0.0)
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp64": Tolerance(rel=1e-12, elem=1e-10),
    "fp32": Tolerance(rel=1e-5, elem=1e-4),
    "tf32": Tolerance(rel=1e-3, elem=5e-3),
    "fp16": Tolerance(rel=1e-3, elem=5e-3),
    "bf16": Tolerance(rel=8e-3, elem=4e-2),
    **{name: EXACT for name in ("int64", "int32", "int16", "int8", "uint8", "bool")},
}


@dataclass(frozen=True)
class Levels:
    """Performance levels as roofline fractions (measured floor / measured time)."""

    passing: float = 0.3
    good: float = 0.6
    excellent: float = 0.8

    def grade(self, fraction: float) -> str:
        if fraction >= self.excellent:
            return "excellent"
        if fraction >= self.good:
            return "good"
        if fraction >= self.passing:
            return "pass"
        return "below target"


@dataclass(frozen=True)
class Structure:
    """Targets on a kernel's memory traffic, graded from the interpreter's trace (on a CPU),
    where no time can be measured: how much of each 32-byte sector moved is used, and how
    many times the compulsory bytes the (L2-filtered) DRAM traffic is."""

    sector_efficiency: float | None = None
    dram_over_compulsory: float | None = None
    # Grade traffic on a toy card whose L2 is as small, next to CPU-sized inputs, as a real
    # L2 is next to GPU-sized ones (otherwise a small problem always fits in cache).
    l2_bytes: int | None = None
    sm_count: int | None = None
    # Every tl.dot fed as the matrix units want it (see matrix_units): operands in the
    # input's 16-bit dtype, fp32 accumulation, tiles that are big enough and fit an SM.
    tensor_cores: bool = False
    # Every traced tile fits one SM (shared memory for num_stages, accumulator registers).
    tile_fit: bool = False
    # The launches go through @triton.autotune (seen in both worlds, not only traced).
    autotuned: bool = False

    @property
    def toy_card(self) -> str:
        if self.l2_bytes is None and self.sm_count is None:
            return ""
        return f" (on a toy card: L2 {(self.l2_bytes or 0) >> 10} KiB, {self.sm_count} SMs)"

    def failures(self, prediction) -> list[str]:
        failures = []
        if (self.sector_efficiency is not None
                and prediction.sector_efficiency < self.sector_efficiency):
            failures.append(f"memory access pattern: {prediction.bottleneck}; the target is "
                            f"at least {self.sector_efficiency:.0%}")
        ratio = prediction.dram / prediction.compulsory if prediction.compulsory else 0.0
        if self.dram_over_compulsory is not None and ratio > self.dram_over_compulsory:
            failures.append(f"memory traffic: {ratio:.2f}× the compulsory bytes{self.toy_card}; "
                            f"the target is at most {self.dram_over_compulsory:g}×"
                            + (" (a full-size L2 would hold this small problem whole)"
                               if self.toy_card else ""))
        return failures


Inputs = tuple  # positional arguments for the candidate: tensors and plain Python values


@dataclass
class Problem:
    """One graded exercise, id ``"<lab>/<exercise>"``.

    make_inputs(case, generator, device) -> tuple of positional arguments.
    reference(*inputs) -> the answer; the engine passes floating tensors upcast to float64.
    cost(case) -> Cost.
    out_shape(case) -> shape of the output; needed when ``output_arg`` is set.
    """

    id: str
    title: str
    signature: str
    make_inputs: Callable[[Case, torch.Generator, torch.device], Inputs]
    reference: Callable[..., torch.Tensor]
    cost: Callable[[Case], Cost]
    cpu_cases: Sequence[Case]
    gpu_cases: Sequence[Case]
    levels: Levels = field(default_factory=Levels)
    tolerances: dict[str, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    # On a GPU these replace ``tolerances``' of the same key: for hardware arithmetic that
    # a correct kernel cannot avoid and the interpreter does not show (the partial sums of
    # fp8 tensor cores keep fewer bits than fp32).
    gpu_tolerances: dict[str, Tolerance] = field(default_factory=dict)
    out_dtype: Callable[[Case], torch.dtype] | None = None
    # True: the grader allocates the output and passes it last, candidate(*inputs, out).
    output_arg: bool = False
    out_shape: Callable[[Case], tuple[int, ...]] | None = None
    # The output must be contiguous (a view with other strides is not the answer asked).
    out_contiguous: bool = False
    # The kind of kernel the exercise asks for: "triton", "cupy", or None for a plain
    # function. With a kernel, a call to one of ``library_ops`` (aten op names as torch
    # dispatches them) is reported; with "triton", so is launching no Triton kernel.
    kernel: str | None = "triton"
    library_ops: frozenset[str] = frozenset()
    # fp32 ``tl.dot`` runs in TF32 on a GPU by default; grade fp32 with the tf32 tolerance.
    tf32_on_gpu: bool = False
    # Whether a passing candidate is timed and placed on the roofline (on a GPU).
    timed: bool = True
    # On a GPU, the library call the timed case is also measured against (e.g.
    # torch.matmul), and the speed it must reach relative to it: 0.5 = half its speed.
    baseline: Callable[..., torch.Tensor] | None = None
    baseline_name: str = ""
    at_least_vs_baseline: float = 0.0
    # Traffic targets graded in the interpreter (see Structure).
    structure: Structure = field(default_factory=Structure)
    # For answers that are not tensors (a number, a word): compare(output, reference)
    # returns "" when right, else what is wrong. Tensor answers use ``evidence/compare.py``.
    compare: Callable[[object, object], str] | None = None
    # invoke(candidate, inputs) -> output, where calling candidate(*inputs) is not the whole
    # exercise (e.g. a backward pass: run the forward, then backward, return the gradients).
    invoke: Callable[[Callable, tuple], object] | None = None
    # host_check(case, inputs, writes) -> "" or why: ``writes`` are what the host code
    # wrote (fills, copies, casts) as (aten op, bytes, shape). Where the exercise is to
    # avoid materialising something (a matrix of distances), a copy of an expanded view
    # must not do it for the kernel.
    host_check: Callable[[Case, tuple, list[tuple[str, int, tuple[int, ...]]]], str] | None \
        = None
    # Whether every passing case is run again on new inputs, its launches alone
    # (``evidence/replay.py``). False where the answer is assembled by something the grader
    # cannot log step by step (autograd, for a backward exercise): there the rule on host
    # ops alone stands.
    replayed: bool = True
    # trace_check(case, inputs, launches, output) -> "" or why a correct answer was computed the
    # wrong way, from the interpreter's trace (e.g. causal attention loading every block).
    trace_check: Callable[[Case, tuple, list, object], str] | None = None
    # diagnose(inputs, output, reference) -> the likely cause of a wrong answer, in words,
    # or "" (e.g. "rows do not sum to 1: the running sum is not rescaled").
    diagnose: Callable[[tuple, torch.Tensor, torch.Tensor], str] | None = None
    # Hints, a nudge then the idea; ``hint(problem_id, level)`` shows one. The last level
    # is the answer's key lines: those marked in the solution regions of these functions
    # (or CUDA C sources) of the solution's module, read from kernels/ (checking/hints.py).
    hints: Sequence[str] = ()
    answer_in: Sequence[str] = ()
    # False when the right answer depends on the run itself (a timer's: what the stand-in
    # GPU really took), so that it cannot be worked out again in another process.
    deterministic_reference: bool = True
    # For such a problem, how a grader in another process still checks an answer: on the
    # same inputs, made again from the seed, plausible(case, inputs, output) -> "" or what
    # is wrong (a time far from what the stand-in GPU was made to take, say).
    plausible: Callable[[Case, tuple, object], str] | None = None
    # The course's own solution, "module:function" in rooflab.kernels. Tests hold it to the
    # problem's own bar: correct in both worlds, and on a GPU fast enough with a margin.
    solution: str = ""
    # Graded cases drawn from the grader's seed, run only when graded (see Hidden).
    hidden: Hidden | None = None

    def __post_init__(self) -> None:
        if self.hidden is not None and self.kernel == "ranks":  # ranks/problem.py's KIND
            raise ValueError(f"{self.id}: a problem on ranks cannot have hidden cases: its "
                             "check (checking/rank_check.py) runs its public cases only")

    def cases(self, on_gpu: bool) -> Sequence[Case]:
        """The public cases for this world: the ones the learner's own check runs."""
        return self.gpu_cases if on_gpu else self.cpu_cases

    def expected_dtype(self, case: Case) -> torch.dtype:
        return self.out_dtype(case) if self.out_dtype else case.dtype

    def tolerance(self, dtype: torch.dtype, on_gpu: bool) -> Tolerance:
        key = dtype_name(dtype)
        if key == "fp32" and on_gpu and self.tf32_on_gpu:
            key = "tf32"
        if on_gpu and key in self.gpu_tolerances:
            return self.gpu_tolerances[key]
        return self.tolerances[key]


def hidden_cases(problem: Problem, seed: int, on_gpu: bool) -> list[Case]:
    """The problem's hidden cases for ``seed``: the same list in every process that asks
    (the notebook's check, the grader's recheck), drawn with a generator of their own, so
    that torch's global one is left as it was. Each problem draws its own sizes from the
    one seed a notebook is graded with."""
    if problem.hidden is None:
        return []
    draw = problem.hidden.draw(on_gpu)
    rng = random.Random(f"{problem.id} {seed} {'gpu' if on_gpu else 'cpu'}")
    return [Case({name: span.draw(rng) for name, span in draw.sizes.items()}, draw.dtype,
                 draw.scale, hidden=True) for _ in range(draw.count)]


def graded_cases(problem: Problem, on_gpu: bool, seed: int, grading: bool) -> list[Case]:
    """Every case a check runs, in order (its index seeds its inputs): the public ones,
    then, when ``grading``, the hidden ones drawn from ``seed``."""
    public = list(problem.cases(on_gpu))
    return public + hidden_cases(problem, seed, on_gpu) if grading else public


def hidden_count(problem: Problem, on_gpu: bool) -> int:
    """How many hidden cases grading adds to this world's public ones."""
    return problem.hidden.draw(on_gpu).count if problem.hidden is not None else 0


_REGISTRY: dict[str, Problem] = {}


def register(problem: Problem) -> Problem:
    """Add a problem to the registry. Re-registering an id replaces it (notebook re-runs)."""
    if "/" not in problem.id:
        raise ValueError(f"problem id {problem.id!r} must look like '<lab>/<exercise>'")
    _REGISTRY[problem.id] = problem
    return problem


def registered() -> dict[str, Problem]:
    """Every problem registered so far, by id: the course's (``problems/`` registers them
    when imported) and any a notebook added."""
    return _REGISTRY


def random_tensor(
    shape: Sequence[int],
    dtype: torch.dtype,
    generator: torch.Generator,
    device: torch.device | str,
    scale: float = 1.0,
) -> torch.Tensor:
    """Normal random values times ``scale``, made in float32 then cast. Never zeros: a
    kernel that writes nothing, or multiplies by nothing, must not pass by luck."""
    x = torch.randn(tuple(shape), generator=generator, dtype=torch.float32, device=device)
    return (x * scale).to(dtype)
