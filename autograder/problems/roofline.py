"""Lab 00 — the roofline. Exercises on paper made executable: count FLOPs and compulsory
bytes, find the time floor and the bound, and time a kernel honestly."""

from __future__ import annotations

import math
import numbers
import queue
import statistics
import threading
import time

import torch

from ..problem import Case, Cost, Problem, register

# --- answers that are numbers -----------------------------------------------------------


def real_number(value: object) -> float | None:
    """``value`` as a float if it is one real number — a Python int or float, a numpy
    scalar, a tensor or array holding one element — else None. A bool is not a count."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):  # int, float, numpy's scalars, Fraction
        return float(value)
    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        count = value.numel() if isinstance(value, torch.Tensor) else value.size
        if count == 1:
            return real_number(value.item())  # a one-element array: its number, if any
    return None


def _number_problem(name: str, got: object) -> tuple[float | None, str]:
    """(the number, "") or (None, what is wrong with it)."""
    value = real_number(got)
    if value is None:
        return None, f"{name}: got {got!r}, not a number"
    if not math.isfinite(value):
        return None, f"{name}: got {value}, not a finite number"
    return value, ""


# Relative error a right answer may carry: one held in float32 (a tensor's default) is
# right to about 6e-8; a wrong formula is off by a factor, not a rounding.
RTOL = 1e-6


def _show(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def close_count(got: float, want: float) -> bool:
    """Lab 00's rule for a count: right to RTOL relative (an answer held in float32 is
    right to about 6e-8; a wrong formula is off by a factor)."""
    return abs(got - want) <= RTOL * max(abs(want), 1)


def told_apart(got: float, want: float) -> tuple[str, str]:
    """Both numbers, with as many digits as it takes to show that they differ."""
    if float(got).is_integer() and float(want).is_integer():
        return _show(got), _show(want)
    for digits in range(6, 18):
        shown = f"{got:,.{digits}g}", f"{want:,.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return repr(got), repr(want)


# --- counting ---------------------------------------------------------------------------

# The note of a case whose sizes are drawn from the check's seed: a table of the answers to
# the named cases cannot answer it, only the formula can.
DRAWN = "sizes drawn from the seed"


class Expected(tuple):
    """A reference answer, and the arguments it was computed for (for the message: a
    drawn case's sizes are not in its label)."""

    given: str = ""


def _expected(values: tuple, names: tuple[str, ...], args: tuple, cases: list[Case]
              ) -> Expected:
    """The answer, naming its arguments unless they are a named case's (whose label
    already shows them)."""
    answer = Expected(values)
    if all(tuple(args) != tuple(case.sizes.values()) for case in cases):
        answer.given = ", ".join(f"{name}={_show(float(a))}"
                                 for name, a in zip(names, args, strict=True))
    return answer


def _draw(choices: range | tuple, gen: torch.Generator, device: torch.device) -> float:
    """One value of ``choices``: uniform over a range of integers, or one of a tuple."""
    pick = int(torch.randint(len(choices), (1,), generator=gen, device=device))
    return choices[pick]


def _sizes_or_draw(draws: dict[str, range | tuple]):
    """make_inputs: a named case's own sizes, or for a DRAWN case one value of each
    argument drawn from ``draws`` (in the signature's order)."""
    def make(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
        if case.note != DRAWN:
            return tuple(case.sizes.values())
        return tuple(_draw(choices, gen, device) for choices in draws.values())

    return make


def _same_numbers(names: tuple[str, ...]):
    def compare(got: object, want: tuple) -> str:
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"return a tuple ({', '.join(names)}); got {got!r}"
        wrong = []
        for name, g, w in zip(names, got, want, strict=True):
            value, problem = _number_problem(name, g)
            if problem:
                wrong.append(problem)
            elif not close_count(value, w):
                wrong.append("{}: got {}, expected {}".format(name, *told_apart(value, w)))
        given = getattr(want, "given", "")
        return f"for {given}: " + "; ".join(wrong) if wrong and given else "; ".join(wrong)

    return compare


def _free(case: Case) -> Cost:
    return Cost(flops=0, bytes=0)


def _counting(id: str, title: str, signature: str, formula, cases: list[Case],
              draws: dict[str, range | tuple], hints: tuple[str, ...]) -> None:
    """A counting exercise: its named cases, and one whose sizes are drawn from ``draws``
    on every check."""
    name = id.split("/")[1]  # the lab's function, as kernels/roofline.py answers it
    names = tuple(draws)

    def reference(*args) -> Expected:
        return _expected(formula(*(int(a) for a in args)), names, args, cases)

    cases = [*cases, Case({}, None, note=DRAWN)]
    register(Problem(
        id=id, title=title, signature=signature, make_inputs=_sizes_or_draw(draws),
        reference=reference, cost=_free, cpu_cases=cases, gpu_cases=cases, kernel=None,
        timed=False, compare=_same_numbers(("flops", "bytes")), hints=hints,
        solution=f"rooflab.kernels.roofline:{name}", answer_in=(name,),
    ))


BYTES = (1, 2, 4, 8)  # fp8 to fp64

_counting(
    "roofline/cost_vector_add", "FLOPs and compulsory bytes of a vector add",
    "(n: int, dtype_bytes: int) -> (flops, bytes)",
    lambda n, b: (n, 3 * n * b),
    [Case({"n": 1000, "dtype_bytes": 4}, None), Case({"n": 1 << 20, "dtype_bytes": 2}, None)],
    {"n": range(1, 1 << 30), "dtype_bytes": BYTES},
    ("Each output element costs one addition.",
     "Compulsory bytes: every input element read once, every output element written once."),
)

_counting(
    "roofline/cost_softmax", "FLOPs and compulsory bytes of a row softmax",
    "(rows: int, cols: int, dtype_bytes: int) -> (flops, bytes)",
    lambda r, c, b: (5 * r * c, 2 * r * c * b),
    [Case({"rows": 4096, "cols": 1000, "dtype_bytes": 2}, None),
     Case({"rows": 1, "cols": 50_257, "dtype_bytes": 4}, None)],
    {"rows": range(2, 1 << 16), "cols": range(2, 1 << 18), "dtype_bytes": BYTES},
    ("Per element: a comparison for the max, a subtraction, an exponential, an addition "
     "for the sum, a division.",
     "The input is read once and the output written once, whatever the kernel does "
     "between: 2 * rows * cols elements."),
)

_counting(
    "roofline/cost_matmul", "FLOPs and compulsory bytes of a matmul",
    "(m: int, n: int, k: int, dtype_bytes: int) -> (flops, bytes)",
    lambda m, n, k, b: (2 * m * n * k, (m * k + k * n + m * n) * b),
    [Case({"m": 4096, "n": 4096, "k": 4096, "dtype_bytes": 2}, None),
     Case({"m": 16, "n": 8192, "k": 8192, "dtype_bytes": 2}, None)],
    # m, n and k apart, so that a formula with two of them swapped is wrong.
    {"m": range(1, 1 << 14), "n": range(1 << 14, 1 << 15), "k": range(1 << 15, 1 << 16),
     "dtype_bytes": BYTES},
    ("Each of the m*n outputs is a dot product of length k.",
     "A dot product of length k is k multiplies and k additions."),
)

_counting(
    "roofline/cost_attention", "FLOPs and compulsory bytes of attention (forward)",
    "(batch, heads, seq, head_dim, dtype_bytes, causal) -> (flops, bytes)",
    lambda b, h, s, d, size, causal: (4 * b * h * s * s * d // (2 if causal else 1),
                                      4 * b * h * s * d * size),
    [Case({"batch": 4, "heads": 16, "seq": 4096, "head_dim": 128, "dtype_bytes": 2,
           "causal": 0}, None),
     Case({"batch": 1, "heads": 32, "seq": 8192, "head_dim": 64, "dtype_bytes": 2,
           "causal": 1}, None)],
    {"batch": range(1, 64), "heads": range(1, 128), "seq": range(1, 1 << 15),
     "head_dim": (32, 64, 80, 96, 128, 256), "dtype_bytes": BYTES, "causal": (0, 1)},
    ("Two matmuls per head: scores S = Q Kᵀ (seq×seq, inner size head_dim), then O = P V. "
     "Count only those; the softmax is small beside them.",
     "Each matmul is 2*seq*seq*head_dim FLOPs per head; a causal mask skips half the "
     "scores."),
)


# --- the time floor ---------------------------------------------------------------------


FLOOR_DRAWS = {"flops": range(10**9, 10**16), "nbytes": range(10**6, 10**12),
               # Peaks and bandwidths of real cards (H100, L4, A100, H200), in FLOP/s, B/s.
               "peak": (989e12, 67e12, 121e12, 312e12, 19.5e12),
               "bandwidth": (3.35e12, 0.3e12, 2.0e12, 4.8e12)}


FLOOR_CASES = [
    Case({"flops": 2 * 4096**3, "nbytes": 3 * 4096**2 * 2, "peak": 989e12,
          "bandwidth": 3.35e12}, None, note="bf16 matmul on an H100"),
    Case({"flops": 1 << 28, "nbytes": 3 * 4 << 28, "peak": 67e12, "bandwidth": 3.35e12},
         None, note="fp32 vector add on an H100"),
    Case({"flops": 2 * 16 * 8192 * 8192, "nbytes": (16 * 8192 * 2 + 8192**2) * 2,
          "peak": 121e12, "bandwidth": 0.3e12}, None, note="skinny matmul on an L4"),
    Case({}, None, note=DRAWN),
]


def _floor_reference(flops, nbytes, peak, bandwidth) -> Expected:
    compute, memory = flops / peak, nbytes / bandwidth
    return _expected((max(compute, memory), "compute" if compute >= memory else "memory"),
                     tuple(FLOOR_DRAWS), (flops, nbytes, peak, bandwidth), FLOOR_CASES)


def _compare_floor(got: object, want: tuple) -> str:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"return a tuple (seconds, bound); got {got!r}"
    seconds, bound = got
    value, problem = _number_problem("seconds", seconds)
    problems = [problem] if problem else []
    if not problem and abs(value - want[0]) > RTOL * want[0]:
        problems.append("seconds: got {}, expected {}".format(*told_apart(value, want[0])))
    if bound != want[1]:
        problems.append(f"bound: got {bound!r}, expected {want[1]!r}")
    given = getattr(want, "given", "")
    return f"for {given}: " + "; ".join(problems) if problems and given else "; ".join(problems)


register(Problem(
    id="roofline/time_floor",
    title="The time floor of a kernel, and what bounds it",
    signature="(flops, nbytes, peak_flops, bandwidth) -> (seconds, 'memory' | 'compute')",
    make_inputs=_sizes_or_draw(FLOOR_DRAWS),
    reference=_floor_reference,
    cost=_free,
    cpu_cases=FLOOR_CASES,
    gpu_cases=FLOOR_CASES,
    kernel=None,
    timed=False,
    compare=_compare_floor,
    hints=("A kernel cannot finish before its arithmetic is done, nor before its bytes "
           "have moved.",
           "Compute time = flops / peak_flops; memory time = nbytes / bandwidth."),
    solution="rooflab.kernels.roofline:time_floor", answer_in=("time_floor",),
))


# --- timing a kernel --------------------------------------------------------------------


class SimulatedGPU:
    """A stand-in for a GPU stream on a machine without one.

    ``launch()`` queues a kernel and returns at once, as a CUDA launch does; the work runs
    on a worker thread. The first launch also pays for compilation, the next few run cold
    (caches empty, clocks ramping up), and every fifth kernel after that is slowed down
    (another process sharing the card, a clock change). ``synchronize()``
    waits for everything queued, as ``torch.cuda.synchronize()`` does.

    It also notes what each warm run really cost, as an honest timer sees it: from the
    launch to the return of the ``synchronize()`` that waited for it alone. On a loaded
    host ``time.sleep`` overshoots, threads wake late and the caller may wait for the GIL
    between its launch and its synchronize; a right timer sees all of it, so the answer it
    is compared with must too.
    """

    def __init__(self, kernel_s: float = 2e-3, compile_s: float = 60e-3, cold_runs: int = 4,
                 cold_s: float = 12e-3, slow_every: int = 5, slow_s: float = 25e-3):
        self.kernel_s, self.compile_s = kernel_s, compile_s
        self.cold_runs, self.cold_s = cold_runs, cold_s
        self.slow_every, self.slow_s = slow_every, slow_s
        self.launches = 0
        self._work: queue.Queue[tuple[float, float, str]] = queue.Queue()
        self._finished: list[tuple[str, float, float]] = []  # (kind, busy_s, queued_at)
        self._synchronized = 0  # how many of _finished the last synchronize() had seen
        self._runs_s: list[float] = []  # warm runs, each synchronised on its own
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        last_done = 0.0
        while True:
            seconds, queued_at, kind = self._work.get()
            time.sleep(seconds)
            done = time.perf_counter()
            # Busy from when the stream could start it: when queued, or when the one
            # before it finished.
            self._finished.append((kind, done - max(queued_at, last_done), queued_at))
            last_done = done
            self._work.task_done()

    def launch(self) -> None:
        self.launches += 1
        seconds, kind = self.kernel_s, "steady"
        if self.launches == 1:
            seconds, kind = self.kernel_s + self.compile_s, "compile"
        elif self.launches <= self.cold_runs:
            seconds, kind = self.cold_s, "cold"
        elif self.launches % self.slow_every == 0:
            seconds, kind = self.slow_s, "slow"
        self._work.put((seconds, time.perf_counter(), kind))

    def synchronize(self) -> None:
        self._work.join()
        returned = time.perf_counter()
        new = self._finished[self._synchronized:]
        self._synchronized = len(self._finished)
        # One run on its own, after the first: the runs a timer that synchronises each one
        # takes its median of. The cold ones count as the slowed ones do: a timer that
        # warmed up once has them among its samples, and on a busy machine the median of
        # its samples sits that much higher among the steady runs.
        if len(new) == 1 and new[0][0] in ("steady", "slow", "cold"):
            _, _, queued_at = new[0]
            self._runs_s.append(returned - queued_at)

    def one_run_s(self) -> float:
        """What one run takes here, as a right timer measures it: the median of the runs
        after the first that it synchronised one at a time, cold and slowed ones included,
        as its own median includes them (else the steady kernels' busy time, else the
        nominal time)."""
        if self._runs_s:
            return statistics.median(self._runs_s)
        busy = [b for kind, b, _ in self._finished if kind == "steady"]
        return statistics.median(busy) if busy else self.kernel_s


# The stand-ins handed to candidates, by their launch function: a candidate gets two plain
# functions, not the object that knows the answer.
_STAND_INS: dict[object, SimulatedGPU] = {}

# Each case's kernel time is drawn from its own band, and none is shown: only a timer that
# really measures can be right on all of them (a constant fits one band at most).
_BANDS_S = {1: (1.5e-3, 2.5e-3), 2: (3.2e-3, 4.5e-3), 3: (5.2e-3, 7.0e-3)}


def _timer_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    if device.type == "cuda":
        n = case.sizes["n"]
        a = torch.randn(n, n, device=device, generator=gen, dtype=torch.float16)
        b = torch.randn(n, n, device=device, generator=gen, dtype=torch.float16)
        return (lambda: torch.matmul(a, b), torch.cuda.synchronize)
    low, high = _BANDS_S[case.sizes["kernel"]]
    draw = float(torch.rand((), generator=gen, device=device))
    gpu = SimulatedGPU(kernel_s=low + (high - low) * draw)

    def launch() -> None:
        gpu.launch()

    def synchronize() -> None:
        gpu.synchronize()

    _STAND_INS.clear()  # one case at a time
    _STAND_INS[launch] = gpu
    return (launch, synchronize)


def _true_time(launch, synchronize) -> float:
    """The reference: what one kernel really takes, by the course's own method."""
    gpu = _STAND_INS.get(launch)
    if gpu is not None:
        gpu.synchronize()
        return gpu.one_run_s()
    from ..device.timing import time_gpu

    return time_gpu(launch).median_s


def _compare_time(got: object, want: float) -> str:
    value, problem = _number_problem("the time", got)
    if problem or value <= 0:
        return f"return the time of one run in seconds; got {got!r}"
    ratio = value / want
    if 0.8 <= ratio <= 1.25:
        return ""
    if 700 <= ratio <= 1400:
        return (f"returned {value:g}, about 1000× the kernel's {want:g} s: milliseconds? "
                "Return seconds")
    # Under half of what the kernel takes: no noise in a median explains it (a busy machine
    # has made one launch alone, unsynchronized, take 14% of the kernel's time).
    if ratio < 0.5:
        why = ("far too fast: the clock stopped before the kernel finished "
               "(synchronize before reading the clock)")
    elif ratio > 1.25:
        why = ("too slow: compilation, or a few slow runs, are in the number "
               "(warm up first; take the median, not the mean)")
    else:
        why = "too fast"
    return f"measured {value * 1e3:.3f} ms per run, the kernel takes {want * 1e3:.3f} ms: {why}"


def _plausible_time(case: Case, inputs: tuple, got: object) -> str:
    """A time checked in another process, which cannot see the run it measured: a number,
    and on a CPU near what the stand-in GPU made from the same seed was set to take (a
    loaded host makes a right timer's answer longer, never shorter)."""
    value, problem = _number_problem("the time", got)
    if problem or value <= 0:
        return f"return the time of one run in seconds; got {got!r}"
    gpu = _STAND_INS.get(inputs[0])
    if gpu is not None and not 0.8 <= value / gpu.kernel_s <= 3.0:
        return (f"measured {value * 1e3:.3f} ms per run, where the kernel was set to take "
                f"{gpu.kernel_s * 1e3:.3f} ms")
    return ""


register(Problem(
    id="roofline/timer",
    title="Time a kernel: synchronise, warm up, take the median",
    signature="(launch: () -> None, synchronize: () -> None) -> seconds per run",
    make_inputs=_timer_inputs,
    reference=_true_time,
    cost=_free,
    cpu_cases=[Case({"kernel": k}, None, note="simulated GPU, time not shown") for k in (1, 2, 3)],
    gpu_cases=[Case({"n": 4096}, torch.float16), Case({"n": 8192}, torch.float16)],
    kernel=None,
    timed=False,
    compare=_compare_time,
    deterministic_reference=False,
    plausible=_plausible_time,
    hints=("A launch only queues work: the time right after it says nothing about the work.",
           "Call synchronize() before you read the clock, around each run; run a few times "
           "before you start counting."),
    solution="rooflab.kernels.roofline:measure", answer_in=("measure",),
))
