"""Lab 00 — the roofline. Exercises on paper made executable: count FLOPs and compulsory
bytes, find the time floor and the bound, and time a kernel honestly."""

from __future__ import annotations

import queue
import threading
import time

import torch

from ..problem import Case, Cost, Problem, register

# --- counting ---------------------------------------------------------------------------


def _sizes(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    return tuple(case.sizes.values())


def _same_numbers(names: tuple[str, ...]):
    def compare(got: object, want: tuple) -> str:
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"return a tuple ({', '.join(names)}); got {got!r}"
        wrong = [f"{name}: got {g:,}, expected {w:,}" for name, g, w in zip(names, got, want,
                                                                               strict=True)
                 if not isinstance(g, (int, float)) or abs(g - w) > 1e-9 * max(abs(w), 1)]
        return "; ".join(wrong)

    return compare


def _free(case: Case) -> Cost:
    return Cost(flops=0, bytes=0)


def _counting(id: str, title: str, signature: str, reference, cases: list[Case],
              hints: tuple[str, ...]) -> None:
    register(Problem(
        id=id, title=title, signature=signature, make_inputs=_sizes, reference=reference,
        cost=_free, cpu_cases=cases, gpu_cases=cases, kernel=None, timed=False,
        compare=_same_numbers(("flops", "bytes")), hints=hints,
    ))


_counting(
    "roofline/cost_vector_add", "FLOPs and compulsory bytes of a vector add",
    "(n: int, dtype_bytes: int) -> (flops, bytes)",
    lambda n, b: (n, 3 * n * b),
    [Case({"n": 1000, "dtype_bytes": 4}, None), Case({"n": 1 << 20, "dtype_bytes": 2}, None)],
    ("Each output element costs one addition.",
     "Compulsory bytes: every input element read once, every output element written once.",
     "bytes = (n + n + n) * dtype_bytes"),
)

_counting(
    "roofline/cost_softmax", "FLOPs and compulsory bytes of a row softmax",
    "(rows: int, cols: int, dtype_bytes: int) -> (flops, bytes)",
    lambda r, c, b: (5 * r * c, 2 * r * c * b),
    [Case({"rows": 4096, "cols": 1000, "dtype_bytes": 2}, None),
     Case({"rows": 1, "cols": 50_257, "dtype_bytes": 4}, None)],
    ("Per element: a comparison for the max, a subtraction, an exponential, an addition "
     "for the sum, a division.",
     "The input is read once and the output written once, whatever the kernel does "
     "between: 2 * rows * cols elements.",
     "flops = 5 * rows * cols; bytes = 2 * rows * cols * dtype_bytes"),
)

_counting(
    "roofline/cost_matmul", "FLOPs and compulsory bytes of a matmul",
    "(m: int, n: int, k: int, dtype_bytes: int) -> (flops, bytes)",
    lambda m, n, k, b: (2 * m * n * k, (m * k + k * n + m * n) * b),
    [Case({"m": 4096, "n": 4096, "k": 4096, "dtype_bytes": 2}, None),
     Case({"m": 16, "n": 8192, "k": 8192, "dtype_bytes": 2}, None)],
    ("Each of the m*n outputs is a dot product of length k.",
     "A dot product of length k is k multiplies and k additions.",
     "flops = 2*m*n*k; bytes = (m*k + k*n + m*n) * dtype_bytes"),
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
    ("Two matmuls per head: scores S = Q Kᵀ (seq×seq, inner size head_dim), then O = P V. "
     "Count only those; the softmax is small beside them.",
     "Each matmul is 2*seq*seq*head_dim FLOPs per head; a causal mask skips half the "
     "scores.",
     "flops = 4*b*h*s*s*d (halved if causal); bytes = Q, K, V read and O written = "
     "4*b*h*s*d*dtype_bytes"),
)


# --- the time floor ---------------------------------------------------------------------


def _floor_reference(flops, nbytes, peak, bandwidth):
    compute, memory = flops / peak, nbytes / bandwidth
    return (max(compute, memory), "compute" if compute >= memory else "memory")


def _compare_floor(got: object, want: tuple) -> str:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"return a tuple (seconds, bound); got {got!r}"
    seconds, bound = got
    problems = []
    if not isinstance(seconds, (int, float)) or abs(seconds - want[0]) > 1e-9 * want[0]:
        problems.append(f"seconds: got {seconds!r}, expected {want[0]:.4g}")
    if bound != want[1]:
        problems.append(f"bound: got {bound!r}, expected {want[1]!r}")
    return "; ".join(problems)


register(Problem(
    id="roofline/time_floor",
    title="The time floor of a kernel, and what bounds it",
    signature="(flops, nbytes, peak_flops, bandwidth) -> (seconds, 'memory' | 'compute')",
    make_inputs=_sizes,
    reference=_floor_reference,
    cost=_free,
    cpu_cases=(cases := [
        Case({"flops": 2 * 4096**3, "nbytes": 3 * 4096**2 * 2, "peak": 989e12,
              "bandwidth": 3.35e12}, None, note="bf16 matmul on an H100"),
        Case({"flops": 1 << 28, "nbytes": 3 * 4 << 28, "peak": 67e12, "bandwidth": 3.35e12},
             None, note="fp32 vector add on an H100"),
        Case({"flops": 2 * 16 * 8192 * 8192, "nbytes": (16 * 8192 * 2 + 8192**2) * 2,
              "peak": 121e12, "bandwidth": 0.3e12}, None, note="skinny matmul on an L4"),
    ]),
    gpu_cases=cases,
    kernel=None,
    timed=False,
    compare=_compare_floor,
    hints=("A kernel cannot finish before its arithmetic is done, nor before its bytes "
           "have moved.",
           "Compute time = flops / peak_flops; memory time = nbytes / bandwidth.",
           "seconds = max(both); the bound is whichever of the two is larger."),
))


# --- timing a kernel --------------------------------------------------------------------


class SimulatedGPU:
    """A stand-in for a GPU stream on a machine without one.

    ``launch()`` queues a kernel and returns at once, as a CUDA launch does; the work runs
    on a worker thread. The first launch also pays for compilation, the next few run cold
    (caches empty, clocks ramping up), and every fifth kernel after that is slowed down
    (another process sharing the card, a clock change). ``synchronize()``
    waits for everything queued, as ``torch.cuda.synchronize()`` does.
    """

    def __init__(self, kernel_s: float = 2e-3, compile_s: float = 60e-3, cold_runs: int = 4,
                 cold_s: float = 12e-3, slow_every: int = 5, slow_s: float = 25e-3):
        self.kernel_s, self.compile_s = kernel_s, compile_s
        self.cold_runs, self.cold_s = cold_runs, cold_s
        self.slow_every, self.slow_s = slow_every, slow_s
        self.launches = 0
        self._work: queue.Queue[float] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            seconds = self._work.get()
            time.sleep(seconds)
            self._work.task_done()

    def launch(self) -> None:
        self.launches += 1
        seconds = self.kernel_s
        if self.launches == 1:
            seconds += self.compile_s
        elif self.launches <= self.cold_runs:
            seconds = self.cold_s
        elif self.launches % self.slow_every == 0:
            seconds = self.slow_s
        self._work.put(seconds)

    def synchronize(self) -> None:
        self._work.join()


def _timer_inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    if device.type == "cuda":
        n = case.sizes["n"]
        a = torch.randn(n, n, device=device, generator=gen, dtype=torch.float16)
        b = torch.randn(n, n, device=device, generator=gen, dtype=torch.float16)
        return (lambda: torch.matmul(a, b), torch.cuda.synchronize)
    gpu = SimulatedGPU(kernel_s=case.sizes["kernel_us"] * 1e-6)
    return (gpu.launch, gpu.synchronize)


def _true_time(launch, synchronize) -> float:
    """The reference: what one kernel really takes, by the course's own method."""
    owner = getattr(launch, "__self__", None)
    if isinstance(owner, SimulatedGPU):
        return owner.kernel_s
    from ..timing import time_gpu

    return time_gpu(launch).median_s


def _compare_time(got: object, want: float) -> str:
    if not isinstance(got, (int, float)) or got <= 0:
        return f"return the time of one run in seconds; got {got!r}"
    ratio = got / want
    if 0.8 <= ratio <= 1.25:
        return ""
    if 700 <= ratio <= 1400:
        return (f"returned {got:g}, about 1000× the kernel's {want:g} s: milliseconds? "
                "Return seconds")
    if ratio < 0.1:
        why = ("far too fast: the clock stopped before the kernel finished "
               "(synchronize before reading the clock)")
    elif ratio > 1.25:
        why = ("too slow: compilation, or a few slow runs, are in the number "
               "(warm up first; take the median, not the mean)")
    else:
        why = "too fast"
    return f"measured {got * 1e3:.3f} ms per run, the kernel takes {want * 1e3:.3f} ms: {why}"


register(Problem(
    id="roofline/timer",
    title="Time a kernel: synchronise, warm up, take the median",
    signature="(launch: () -> None, synchronize: () -> None) -> seconds per run",
    make_inputs=_timer_inputs,
    reference=_true_time,
    cost=_free,
    cpu_cases=[Case({"kernel_us": 2000}, None, note="simulated GPU")],
    gpu_cases=[Case({"n": 4096}, torch.float16)],
    kernel=None,
    timed=False,
    compare=_compare_time,
    hints=("A launch only queues work: the time right after it says nothing about the work.",
           "Call synchronize() before you read the clock, around each run; run a few times "
           "before you start counting.",
           "times = [one synchronised run, repeated]; return statistics.median(times)"),
))
