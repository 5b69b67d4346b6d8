"""Benchmarks: the course's kernels against the library, on a GPU, as evidence.
(``RANK_BENCHES``, at the end of the registry, run on CPU ranks instead.)

``rooflab bench matmul`` (or ``coalescing``) times each kernel with the course's timer
(median, L2 flushed) on fresh random inputs, checks its answer, and reports time,
throughput, roofline fraction against this card's measured ceilings, and the ratio to the
library baseline. ``--json`` writes the same, with card, driver and versions, for
``bench/results/``. Speed targets live here, never in unit tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from .device import current, roofline, versions
from .device.timing import time_gpu
from .problem import Cost


@dataclass
class Row:
    bench: str
    shape: str
    dtype: str
    kernel: str
    median_us: float
    throughput: float  # TFLOP/s, or GB/s for kernels without FLOPs
    unit: str
    roofline_fraction: float
    bound: str
    ratio_to_baseline: float | None = None  # baseline time / this time (>1: faster)
    # The same ratio against every library kernel of the workload, by name.
    ratios: dict[str, float] = field(default_factory=dict)
    method: str = ""  # how it was timed: "do_bench" or "cuda graph"
    library: bool = False  # one of the library's kernels (the baseline or its alternatives)
    # A ceiling this row raised, or why its fraction is above 100% (roofline.fraction_note).
    note: str = ""


@dataclass
class Workload:
    shape: str
    dtype: torch.dtype
    cost: Cost
    make: Callable[[], tuple]
    kernels: dict[str, Callable]  # the first is the baseline
    reference: Callable
    # The kernels that are the library's (the baseline and its alternatives): every row gets
    # its speed relative to each. Default: the baseline alone.
    library: tuple[str, ...] = ()

    @property
    def baselines(self) -> tuple[str, ...]:
        return self.library or (next(iter(self.kernels)),)


def torch_matmul_tf32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul with TF32 allowed for fp32 (PyTorch's default is true fp32): the fair
    baseline for a kernel whose fp32 tl.dot runs as TF32."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        return torch.matmul(a, b)
    finally:
        torch.set_float32_matmul_precision(previous)


def _matmul_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.matmul import matmul_autotuned

    loads = []
    shapes = [(n, n, n) for n in (1024, 2048, 4096, 8192)] + [(16, 8192, 8192),
                                                              (8192, 8192, 128)]
    dtypes = [(torch.bfloat16, "bf16"), (torch.float16, "fp16")]
    # Every shape in bf16 and fp16; fp32 inputs (TF32 on both sides) at one size.
    for shape, dtype, compute in ([(s, d, c) for s in shapes for d, c in dtypes]
                                  + [((4096, 4096, 4096), torch.float32, "tf32")]):
        m, n, k = shape
        cost = Cost(2 * m * n * k, (m * k + k * n + m * n) * dtype.itemsize, compute)
        baseline = ("torch.matmul (TF32)", torch_matmul_tf32) if compute == "tf32" else \
            ("torch.matmul", torch.matmul)
        loads.append(Workload(
            f"{m}x{n}x{k}", dtype, cost,
            lambda m=m, n=n, k=k, dtype=dtype: (
                torch.randn(m, k, device=device, dtype=dtype),
                torch.randn(k, n, device=device, dtype=dtype)),
            dict([baseline, ("rooflab matmul (autotuned)", matmul_autotuned)]),
            baseline[1]))
    return loads


def _coalescing_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.transpose import transpose, transpose_rows
    from rooflab.kernels.vector_add import vector_add

    n = 1 << 26
    side = 8192
    return [
        Workload(f"n={n}", torch.float32, Cost(n, 3 * n * 4),
                 lambda: (torch.randn(n, device=device), torch.randn(n, device=device)),
                 {"torch add": torch.add, "rooflab vector_add": vector_add}, torch.add),
        Workload(f"{side}x{side}", torch.float32, Cost(0, 2 * side * side * 4),
                 lambda: (torch.randn(side, side, device=device),),
                 {"torch x.T.contiguous()": lambda x: x.T.contiguous(),
                  "rooflab transpose (tiles)": transpose,
                  "rooflab transpose_rows": transpose_rows},
                 lambda x: x.T.contiguous()),
    ]


def _softmax_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.softmax import softmax_fused, softmax_naive, softmax_online

    loads = []
    for m, n in ((16384, 1024), (8192, 8192), (4096, 32768)):
        dtype = torch.float16
        loads.append(Workload(
            f"{m}x{n}", dtype, Cost(5 * m * n, 2 * m * n * dtype.itemsize),
            lambda m=m, n=n, dtype=dtype: (torch.randn(m, n, device=device, dtype=dtype),),
            {"torch.softmax": lambda x: torch.softmax(x, dim=-1),
             "rooflab softmax_naive (3 passes)": softmax_naive,
             "rooflab softmax_fused": softmax_fused,
             "rooflab softmax_online": softmax_online},
            lambda x: torch.softmax(x, dim=-1)))
    # The case softmax/online is timed on: rows too long for one block, and too many in
    # flight for L2 to keep them for the second read. Wider blocks keep more bytes in
    # flight per program; these rows say how much that is worth.
    m, n, dtype = 1024, 65536, torch.bfloat16
    loads.append(Workload(
        f"{m}x{n}", dtype, Cost(5 * m * n, 2 * m * n * dtype.itemsize),
        lambda: (torch.randn(m, n, device=device, dtype=dtype),),
        {"torch.softmax": lambda x: torch.softmax(x, dim=-1),
         **{f"rooflab softmax_online (block {block})":
            (lambda x, block=block: softmax_online(x, block=block))
            for block in (1024, 2048, 4096, 8192)}},
        lambda x: torch.softmax(x, dim=-1)))
    return loads


def _sdpa_on(backends: list[str] | None) -> Callable:
    """torch's scaled_dot_product_attention restricted to the named backends (None: the
    default dispatch, what a user of torch gets without asking)."""
    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        if backends is None:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = [getattr(SDPBackend, name) for name in backends if hasattr(SDPBackend, name)]
        if not chosen:
            raise NotAvailable(f"this torch has none of the SDPA backends {backends}")
        with sdpa_kernel(chosen):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return sdpa


class NotAvailable(RuntimeError):
    """A library kernel this torch, card or dtype does not offer: its rows are left out."""


# FlashAttention-2 where the card and dtype allow it (then the memory-efficient kernel),
# never the unfused math path; cuDNN's fused attention (the default on Hopper since torch
# 2.5); and the default dispatch itself.
sdpa_flash = _sdpa_on(["FLASH_ATTENTION", "EFFICIENT_ATTENTION"])
sdpa_cudnn = _sdpa_on(["CUDNN_ATTENTION"])
sdpa_default = _sdpa_on(None)
SDPA_KERNELS = {"torch SDPA (flash where available)": sdpa_flash,
                "torch SDPA (cuDNN)": sdpa_cudnn,
                "torch SDPA (default dispatch)": sdpa_default}


def _forward_and_backward(attention: Callable, causal: bool) -> Callable:
    """A timed callable for fwd+bwd: the forward, then the gradients of sum(o * do)."""
    def run(q, k, v, do):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        attention(*leaves, causal).backward(do)
        return torch.cat([leaf.grad.flatten() for leaf in leaves])

    return run


def _attention_workloads(device: str) -> list[Workload]:
    from rooflab.kernels.attention import attention_reference, flash_attention

    loads = []
    heads, head_dim, dtype = 16, 128, torch.bfloat16
    for seq in (1024, 2048, 4096, 8192, 16384):
        batch = max(1, 16384 // seq)  # 16k tokens a batch, as FlashAttention's benchmarks
        shape = (batch, heads, seq, head_dim)
        for causal in (False, True):
            flops = 4 * batch * heads * seq * seq * head_dim // (2 if causal else 1)
            io = 4 * batch * heads * seq * head_dim * dtype.itemsize
            ours = {"rooflab flash_attention": lambda q, k, v, c: flash_attention(q, k, v, c)}
            naive = {"naive (scores in memory)": attention_reference} if seq <= 4096 else {}
            label = f"b{batch} h{heads} s{seq} d{head_dim}{' causal' if causal else ''}"

            def make(shape=shape, grads=False):
                tensors = [torch.randn(shape, device=device, dtype=dtype) for _ in range(3)]
                return (*tensors, torch.randn(shape, device=device, dtype=dtype)) if grads \
                    else tuple(tensors)

            forward = {**SDPA_KERNELS, **naive, **ours}
            loads.append(Workload(
                f"fwd {label}", dtype, Cost(flops, io, "bf16"), make,
                {name: (lambda q, k, v, f=f, c=causal: f(q, k, v, c))
                 for name, f in forward.items()},
                lambda q, k, v, c=causal: sdpa_flash(q, k, v, c), tuple(SDPA_KERNELS)))
            loads.append(Workload(
                f"fwd+bwd {label}", dtype, Cost(3.5 * flops, 2 * io, "bf16"),
                lambda make=make: make(grads=True),
                {name: _forward_and_backward(f, causal) for name, f in forward.items()
                 if name != "naive (scores in memory)"},
                _forward_and_backward(sdpa_flash, causal), tuple(SDPA_KERNELS)))
    return loads


def _topk_workloads(device: str) -> list[Workload]:
    from .bench_topk import topk_workloads  # it builds on this module's Workload

    return topk_workloads(device)


def _kmeans_workloads(device: str) -> list[Workload]:
    from .bench_kmeans import kmeans_workloads

    return kmeans_workloads(device)


def _amp_workloads(device: str) -> list[Workload]:
    from .bench_amp import amp_workloads

    return amp_workloads(device)


BENCHES: dict[str, Callable[[str], list[Workload]]] = {
    "matmul": _matmul_workloads,
    "coalescing": _coalescing_workloads,
    "softmax": _softmax_workloads,
    "attention": _attention_workloads,
    "topk": _topk_workloads,
    "kmeans": _kmeans_workloads,
    "amp": _amp_workloads,
}

# Benchmarks on ranks of a gloo group on this machine's CPU, which time no GPU kernel:
# name -> "module:function", imported only when run. Each function has the signature in
# bench_ranks' docstring: main(*, json_path, baseline, tolerance) -> exit status.
RANK_BENCHES: dict[str, str] = {
    "allreduce": "rooflab.autograder.bench_collectives:main",
    "fsdp": "rooflab.autograder.bench_fsdp:main",
}


def rank_bench(name: str) -> Callable[..., int]:
    """The ``main`` of a benchmark in ``RANK_BENCHES``."""
    import importlib

    module, function = RANK_BENCHES[name].split(":")
    return getattr(importlib.import_module(module), function)


def _check(label: str, load: Workload, inputs: tuple, when: str) -> None:
    expected = load.reference(*inputs).float()
    got = load.kernels[label](*inputs).float()
    error = float((got - expected).norm() / expected.norm().clamp_min(1e-30))
    if error > 2e-2:
        raise AssertionError(f"{label} is wrong {when} at {load.shape}: rel error {error:.2e}")


def _measure(name: str, label: str, load: Workload, inputs: tuple,
             floor: roofline.Floor) -> Row:
    """Check, time (median, L2 flushed), check again on the timed inputs."""
    _check(label, load, inputs, "before timing")
    kernel = load.kernels[label]
    timing = time_gpu(lambda: kernel(*inputs))
    seconds = timing.median_s
    _check(label, load, inputs, "after timing")
    throughput, unit = _throughput(load.cost, seconds, floor)
    return Row(name, load.shape, str(load.dtype).removeprefix("torch."), label,
               seconds * 1e6, throughput, unit, floor.seconds / seconds, floor.bound,
               method=timing.method)


def _throughput(cost: Cost, seconds: float, floor: roofline.Floor) -> tuple[float, str]:
    """TFLOP/s for a compute-bound workload, GB/s for a memory-bound one."""
    if floor.bound == "compute":
        return cost.flops / seconds / 1e12, "TFLOP/s"
    return cost.bytes / seconds / 1e9, "GB/s"


@dataclass
class _Timed:
    """A row with what it needs to be placed on the roofline again once ceilings move."""

    row: Row
    cost: Cost
    raised: list[roofline.Raise]


def _settle(timed: list[_Timed], ceilings: roofline.Ceilings, l2_bytes: int) -> None:
    """Place every row against the ceilings as they are after the whole run: a row that
    raised a ceiling lowers the fraction of every other row on it, earlier rows included."""
    for entry in timed:
        row, seconds = entry.row, entry.row.median_us * 1e-6
        floor = roofline.time_floor(entry.cost, ceilings)
        row.roofline_fraction, row.bound = floor.seconds / seconds, floor.bound
        row.throughput, row.unit = _throughput(entry.cost, seconds, floor)
        row.note = roofline.fraction_note(row.roofline_fraction, entry.cost, seconds, ceilings,
                                          raised=entry.raised, l2_bytes=l2_bytes,
                                          method=row.method)


def run(name: str) -> list[Row]:
    """Run one benchmark on this GPU. Raises RuntimeError without a GPU."""
    device = current()
    if not device.can_measure:
        raise RuntimeError("benchmarks need a GPU: on a CPU there is no time worth reporting")
    ceilings = roofline.ceilings()
    timed: list[_Timed] = []
    for load in BENCHES[name](device.torch_device):
        inputs = load.make()  # fresh random inputs for every workload, never zeros
        floor = roofline.time_floor(load.cost, ceilings)
        measured = {}
        for label in load.kernels:
            try:
                measured[label] = _measure(name, label, load, inputs, floor)
            except NotAvailable as missing:
                print(f"{load.shape}: {label} left out: {missing}")
            except RuntimeError as error:  # e.g. "No available kernel" for this card/dtype
                if label not in load.baselines or "available" not in str(error):
                    raise
                print(f"{load.shape}: {label} left out: {str(error).splitlines()[0]}")
        first = measured.get(next(iter(load.kernels)))
        for label, row in measured.items():
            row.library = label in load.baselines
            if first is not None:
                row.ratio_to_baseline = first.median_us / row.median_us
            row.ratios = {base: measured[base].median_us / row.median_us
                          for base in load.baselines if base in measured}
            # Every row was checked before and after timing: its rate is real, and one
            # beyond a ceiling raises it (the library's rows above all).
            raised = roofline.observe(load.cost, row.median_us * 1e-6,
                                      f"{row.kernel} at {load.shape} {row.dtype}", ceilings,
                                      device)
            timed.append(_Timed(row, load.cost, raised))
        del inputs
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    _settle(timed, ceilings, device.l2_bytes)
    return [entry.row for entry in timed]


def remeasure(name: str, row: Row) -> Row | None:
    """``row``'s kernel timed again beside its workload's baseline, on fresh inputs: the
    same row, with a fresh ratio to the library (None if the workload is gone)."""
    device = current()
    load = next((load for load in BENCHES[name](device.torch_device)
                 if load.shape == row.shape and str(load.dtype).endswith(row.dtype)), None)
    if load is None or row.kernel not in load.kernels:
        return None
    inputs = load.make()
    floor = roofline.time_floor(load.cost, roofline.ceilings())
    base = _measure(name, next(iter(load.kernels)), load, inputs, floor)
    again = _measure(name, row.kernel, load, inputs, floor)
    again.ratio_to_baseline = base.median_us / again.median_us
    return again


def table(rows: list[Row]) -> str:
    """The rows as text; a row with a note gets a mark after its fraction, and the notes
    follow the table."""
    lines = [f"{'shape':<18}{'dtype':<10}{'kernel':<36}{'median µs':>11}{'throughput':>16}"
             f"{'roofline':>10}{'':<5}{'vs base':>8}"]
    notes = []
    for r in rows:
        if r.note:
            notes.append(f"[{len(notes) + 1}] {r.kernel} at {r.shape} {r.dtype}: {r.note}")
        mark = f" [{len(notes)}]" if r.note else ""
        lines.append(f"{r.shape:<18}{r.dtype:<10}{r.kernel:<36}{r.median_us:>11.1f}"
                     f"{r.throughput:>9.1f} {r.unit:<7}{r.roofline_fraction:>9.0%}{mark:<5}"
                     + (f"{r.ratio_to_baseline:>7.2f}×" if r.ratio_to_baseline else f"{'-':>8}"))
    return "\n".join(lines + notes)


def record(rows: list[Row]) -> dict:
    """Everything needed to trust the numbers later: card, driver, versions, ceilings."""
    dev = current()
    return {
        "card": dev.name,
        "driver": dev.driver,
        "versions": versions.installed(),
        "ceilings": asdict(roofline.ceilings()),
        "rows": [asdict(r) for r in rows],
    }
