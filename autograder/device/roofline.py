"""The roofline: the fastest a kernel could possibly run on this device.

    time floor        = max(flops / peak FLOP/s for the dtype, compulsory bytes / peak bandwidth)
    roofline fraction = time floor / measured time

The peaks ("ceilings") are *measured* on the device in front of you (``measure``): after a
warm-up, bandwidth is the best of device-to-device copies of several sizes far beyond L2
(bytes read plus bytes written), and each FLOP/s ceiling the best of the library matmul at
several sizes that fill the chip, each shape timed several times. They are cached per
device name and driver in the user's cache directory, with when and how they were measured.

Two rules keep a cached ceiling honest:

- a measurement far below the datasheet (under ``REJECT_BELOW`` of it) is taken for a busy
  card, not for this card's peak: it is not cached, and the learner is told (``ceilings``);
- a ceiling that a later timing beats (the library, or a kernel, running faster than the
  "peak") is raised to what was reached, and the raise is recorded (``observe``).

Datasheet numbers (``datasheet.py``) are shown beside the measurement and used for those
two checks, never instead of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..problem import Cost
from . import Device, current, datasheet
from .timing import Timing, time_gpu

MATMUL_DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}

# A measurement under this share of the datasheet is rejected. On an idle card the library
# reaches 77–81% of the datasheet's matmul FLOP/s and a copy ~90% of its bandwidth (H100 SXM
# and H200, performance-anchors.md; the first H200 run measured 68–88%). An H200 NVL, which
# the H200 entry matches, has 84% of its FLOP/s: ~65%, still accepted. A card shared with
# one other busy process measures about half: rejected. The threshold sits under every
# healthy figure seen and above the halved ones. (A board 30% slower than the entry it
# matches would land near 55% and be rejected every time: it needs its own datasheet entry.)
REJECT_BELOW = 0.6

# A timing may raise the bandwidth ceiling only when its compulsory bytes are at least this
# many times the L2: a smaller working set beats the DRAM floor by being served from L2 (or
# by leaving its writes there), which says nothing about DRAM.
L2_MULTIPLE = 8
# An L2 to assume when neither the device nor the datasheet says: larger than any listed.
UNKNOWN_L2_BYTES = 128 << 20

# A fraction above this is explained, not just shown: up to it, timing noise.
ABOVE_FLOOR = 1.05


@dataclass
class Measurement:
    """How one ceiling was measured: the workload, each shape's best median, the winner."""

    workload: str  # "device-to-device copy", "torch.matmul (TF32)"
    repeats: int  # medians taken per shape, interleaved across the shapes
    best: dict[str, float]  # shape -> best of its medians, bytes/s or FLOP/s
    chosen: str  # the shape whose best median is the ceiling

    @property
    def value(self) -> float:
        return self.best[self.chosen]


@dataclass
class Raise:
    """A ceiling raised because a timed workload beat it."""

    ceiling: str  # "bandwidth" or a dtype
    before: float
    after: float
    workload: str
    at: str  # ISO time, UTC


@dataclass
class Rejection:
    """One figure of a measurement that fell far below the datasheet (not cached)."""

    ceiling: str
    measured: float
    datasheet: float
    card: str
    at: str

    @property
    def share(self) -> float:
        return self.measured / self.datasheet


@dataclass
class Ceilings:
    """Peak bandwidth (bytes/s) and peak FLOP/s per dtype of one device, and for measured
    ones how they came to be: the method per figure, later raises, rejected measurements."""

    device: str
    source: str  # "measured" or "datasheet"
    bandwidth: float
    flops: dict[str, float] = field(default_factory=dict)
    driver: str = ""
    measured_at: str = ""
    method: dict[str, Measurement] = field(default_factory=dict)  # by ceiling name
    warmup_s: float = 0.0
    measuring_s: float = 0.0  # wall time the measurement took, warm-up included
    raised: list[Raise] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    suspect: str = ""  # set when these are a rejected measurement in use: why

    def peak_flops(self, dtype: str) -> float:
        if dtype in self.flops:
            return self.flops[dtype]
        raise KeyError(f"no {dtype} compute ceiling for {self.device} ({self.source})")

    def ridge(self, dtype: str) -> float:
        """Arithmetic intensity (FLOP/byte) where memory-bound turns compute-bound."""
        return self.peak_flops(dtype) / self.bandwidth

    def value(self, ceiling: str) -> float:
        """A ceiling by name: "bandwidth" or a dtype."""
        return self.bandwidth if ceiling == "bandwidth" else self.peak_flops(ceiling)

    def set(self, ceiling: str, value: float) -> None:
        if ceiling == "bandwidth":
            self.bandwidth = value
        else:
            self.flops[ceiling] = value

    @property
    def names(self) -> list[str]:
        return ["bandwidth", *self.flops]

    @property
    def label(self) -> str:
        if self.source == "measured" and self.suspect:
            return f"{self.device}, measured on a busy card (suspect)"
        if self.source == "measured":
            return f"{self.device}, measured"
        return f"{self.device}, datasheet (not measured)"

    @classmethod
    def from_dict(cls, record: dict) -> Ceilings:
        """The inverse of ``asdict``; a cache written by an older rooflab (no method, raises
        or rejections) loads with those empty. Unknown keys raise TypeError."""
        record = dict(record)
        record["method"] = {name: Measurement(**m) for name, m in record.get("method", {}).items()}
        record["raised"] = [Raise(**r) for r in record.get("raised", [])]
        record["rejected"] = [Rejection(**r) for r in record.get("rejected", [])]
        return cls(**record)


def from_datasheet(card: str | datasheet.Card = datasheet.DEFAULT_CARD) -> Ceilings:
    entry = card if isinstance(card, datasheet.Card) else datasheet.get(card)
    return Ceilings(entry.name, "datasheet", entry.bandwidth, dict(entry.flops))


@dataclass(frozen=True)
class Floor:
    """The time floor of one piece of work on one device, and what sets it."""

    seconds: float
    compute_s: float
    memory_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def time_floor(cost: Cost, ceilings: Ceilings) -> Floor:
    compute_s = cost.flops / compute_peak(ceilings, cost.dtype) if cost.flops else 0.0
    memory_s = cost.bytes / ceilings.bandwidth
    return Floor(max(compute_s, memory_s), compute_s, memory_s)


def compute_peak(ceilings: Ceilings, dtype: str) -> float:
    """The peak FLOP/s for ``dtype``: measured where it was; else, for a dtype the
    measurement does not cover (fp8), the datasheet's for this card (``borrowed`` says
    so). KeyError where neither has it."""
    if dtype in ceilings.flops:
        return ceilings.flops[dtype]
    card = datasheet.lookup(ceilings.device) if ceilings.source == "measured" else None
    sheet = from_datasheet(card) if card else None
    if sheet is not None and dtype in sheet.flops:
        return sheet.flops[dtype]
    return ceilings.peak_flops(dtype)  # raises, naming what is missing


def borrowed(ceilings: Ceilings, dtype: str) -> str:
    """Where the peak for ``dtype`` is the datasheet's though the rest were measured, the
    words that say so; "" otherwise."""
    if ceilings.source != "measured" or dtype in ceilings.flops:
        return ""
    return (f"against the datasheet's {dtype} peak: `rooflab roofline` measures no {dtype} "
            "ceiling")


def roofline_fraction(floor: Floor, measured_s: float) -> float:
    return floor.seconds / measured_s


# ---------------------------------------------------------------------------------------
# Words for numbers


def amount(ceiling: str, value: float) -> str:
    """A ceiling's value with its unit: "4.25 TB/s", "51.3 TFLOP/s", "1100 TFLOP/s"."""
    tera = value / 1e12
    number = f"{tera:.0f}" if tera >= 100 else f"{tera:.3g}"
    return f"{number} {'TB/s' if ceiling == 'bandwidth' else 'TFLOP/s'}"


def what(ceiling: str) -> str:
    """A ceiling's name in words: "copy bandwidth", "bf16 matmul"."""
    return "copy bandwidth" if ceiling == "bandwidth" else f"{ceiling} matmul"


def when(iso: str) -> str:
    """"2026-11-26 14:02 UTC" from an ISO time; the text itself if it is not one."""
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso or "at an unrecorded time"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _say(text: str) -> None:
    """Tell the learner, on stderr: a notebook shows it under the cell, a shell on screen."""
    print(f"rooflab: {text}", file=sys.stderr)


# ---------------------------------------------------------------------------------------
# Measuring (GPU only)

Timer = Callable[[Callable[[], object]], "Timing"]  # timing.time_gpu, or a stand-in


@dataclass(frozen=True)
class Plan:
    """What ``measure`` times. The defaults take about 10–15 s on an H100."""

    # Copies of 0.5–2 GiB: 8× and more the L2 of any card in the datasheet table.
    copy_bytes: tuple[int, ...] = (512 << 20, 1 << 30, 2 << 30)
    # Square matmuls for fp16, bf16 and TF32. The largest is not always the fastest: on an
    # H200 8192³ bf16 ran at 672 TFLOP/s and 4096³ at 714 (power and clocks).
    matmul_sizes: tuple[int, ...] = (4096, 6144, 8192)
    # True fp32 runs ~15× slower on the CUDA cores: smaller sizes fill the chip.
    fp32_sizes: tuple[int, ...] = (2048, 3072, 4096)
    repeats: int = 3
    warmup_s: float = 1.0


def _best_of(shapes: dict[str, tuple[float, Callable[[], object]]], workload: str,
             repeats: int, timer: Timer) -> Measurement:
    """Time every shape ``repeats`` times, interleaved (A B C A B C) so that a change of
    clocks hits all alike; each shape keeps its best median, and the best shape wins.
    ``shapes`` maps a label to (work per call in bytes or FLOPs, the call)."""
    best = dict.fromkeys(shapes, 0.0)
    for _ in range(repeats):
        for label, (work, call) in shapes.items():
            best[label] = max(best[label], work / timer(call).median_s)
    return Measurement(workload, repeats, best, max(best, key=best.__getitem__))


def _size(nbytes: int) -> str:
    """"512 MiB", "2 GiB" (KiB and bytes for the tiny copies of tests)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def _copy_sizes(device: Device, wanted: tuple[int, ...]) -> tuple[int, ...]:
    """The copy sizes whose buffers (source and destination of each, all alive at once to
    interleave them) fit in half the free memory, dropping the largest first."""
    if device.torch_device != "cuda":
        return wanted
    free, _ = torch.cuda.mem_get_info()
    sizes = sorted(wanted)
    while sizes and 2 * sum(sizes) > free // 2:
        sizes.pop()
    return tuple(sizes) or (free // 8,)


def measure_bandwidth(device: Device, plan: Plan, timer: Timer) -> Measurement:
    """Bytes/s of device-to-device copies: each element is read once and written once."""
    shapes = {}
    for nbytes in _copy_sizes(device, plan.copy_bytes):
        src = torch.randn(nbytes // 4, device=device.torch_device)
        dst = torch.empty_like(src)
        shapes[_size(nbytes)] = (2 * src.numel() * 4, lambda dst=dst, src=src: dst.copy_(src))
    return _best_of(shapes, "device-to-device copy", plan.repeats, timer)


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """Let cuBLAS use TF32 tensor cores for fp32 matmuls, or not, for the ``with`` block.

    torch >= 2.9 has ``fp32_precision`` ("tf32"/"ieee"); mixing it with the older
    ``allow_tf32`` flag makes torch raise, so use the new one wherever it exists.
    """
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
    else:  # torch < 2.9
        previous = matmul.allow_tf32
        matmul.allow_tf32 = enabled
        try:
            yield
        finally:
            matmul.allow_tf32 = previous


def measure_matmul_flops(dtype: str, device: Device, plan: Plan, timer: Timer) -> Measurement:
    """FLOP/s of torch.matmul on random square inputs: the library's best is the practical
    peak for the dtype."""
    torch_dtype = MATMUL_DTYPES[dtype]
    shapes = {}
    for n in plan.fp32_sizes if dtype == "fp32" else plan.matmul_sizes:
        a = torch.randn(n, n, device=device.torch_device, dtype=torch_dtype)
        b = torch.randn(n, n, device=device.torch_device, dtype=torch_dtype)
        shapes[f"{n}³"] = (2 * n**3, lambda a=a, b=b: torch.matmul(a, b))
    workload = {"fp32": "torch.matmul (TF32 off)", "tf32": "torch.matmul (TF32)"}
    with _tf32(dtype == "tf32"):
        return _best_of(shapes, workload.get(dtype, "torch.matmul"), plan.repeats, timer)


def _warm_up(device: Device, seconds: float) -> None:
    """Keep the tensor cores busy for ``seconds`` before anything counts: clocks and power
    ramp over the first hundreds of milliseconds of load."""
    if seconds <= 0:
        return
    # fp16: tensor cores on every card of the table (Turing has no bf16 matrix units).
    a = torch.randn(4096, 4096, device=device.torch_device, dtype=torch.float16)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(10):
            torch.matmul(a, a)
        if device.torch_device == "cuda":
            torch.cuda.synchronize()


def measure(device: Device | None = None, plan: Plan | None = None,
            timer: Timer | None = None) -> Ceilings:
    """Measure this GPU's ceilings (about 10–15 s on an H100 with the default ``Plan``).

    1. Warm up: ``plan.warmup_s`` of fp16 matmuls, so that clocks have ramped up.
    2. Bandwidth: device-to-device copies of 512 MiB, 1 GiB and 2 GiB.
    3. FLOP/s: torch.matmul at 4096³, 6144³ and 8192³ for fp16, bf16 and TF32, and at
       2048³, 3072³ and 4096³ for true fp32, on random inputs (never zeros).

    Each shape is timed ``plan.repeats`` times, the shapes interleaved; each timing is the
    median of ~100 ms of calls with L2 flushed (``timing.time_gpu``). A ceiling is the best
    median over all shapes and repeats: whatever disturbs a measurement (another process,
    a dip in clocks, a shape that maps badly onto the SMs) only makes it slower, so the
    fastest median is the nearest to what the card can do. ``timer`` stands in for
    ``time_gpu`` in tests.
    """
    device = device or current()
    if not device.is_gpu:
        raise RuntimeError("ceilings can only be measured on a GPU; on a CPU use "
                           "roofline.from_datasheet(card) and say that nothing was measured")
    timer = timer or time_gpu
    plan = plan or Plan()
    started, at = time.perf_counter(), _now()
    _warm_up(device, plan.warmup_s)
    method = {"bandwidth": measure_bandwidth(device, plan, timer)}
    for dtype in MATMUL_DTYPES:
        method[dtype] = measure_matmul_flops(dtype, device, plan, timer)
    return Ceilings(
        device=device.name,
        source="measured",
        bandwidth=method["bandwidth"].value,
        flops={dtype: method[dtype].value for dtype in MATMUL_DTYPES},
        driver=device.driver,
        measured_at=at,
        method=method,
        warmup_s=plan.warmup_s,
        measuring_s=round(time.perf_counter() - started, 1),
    )


# ---------------------------------------------------------------------------------------
# Caching, and the datasheet check before it


def cache_dir() -> Path:
    """$ROOFLAB_CACHE_DIR if set, else the user's cache directory (XDG) + /rooflab."""
    if os.environ.get("ROOFLAB_CACHE_DIR"):
        return Path(os.environ["ROOFLAB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rooflab"


def copy_cache(folder: Path) -> Path:
    """A copy of this cache (the ceilings measured on this card) in ``folder``, for a
    confined process that cannot see the original: it need not measure them again."""
    if cache_dir().is_dir():
        shutil.copytree(cache_dir(), folder, dirs_exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cache_path(device: Device) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{device.name}-driver-{device.driver}").strip("-")
    return cache_dir() / f"ceilings-{slug}.json"


def load_cached(device: Device) -> Ceilings | None:
    path = cache_path(device)
    try:
        return Ceilings.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def save(ceilings: Ceilings, device: Device) -> Path:
    """Write the cache atomically: a check in another process never reads half a file."""
    path = cache_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(asdict(ceilings), indent=2) + "\n")
    os.replace(partial, path)
    return path


def datasheet_for(device: Device) -> Ceilings | None:
    """The datasheet entry matching this device's name, to show beside the measurement."""
    card = datasheet.lookup(device.name) if device.is_gpu else None
    return from_datasheet(card) if card else None


def below_datasheet(measured: Ceilings, sheet: Ceilings | None) -> list[Rejection]:
    """The figures of ``measured`` under ``REJECT_BELOW`` of the datasheet's; none when
    there is no datasheet entry (then every measurement is accepted)."""
    if sheet is None:
        return []
    found = []
    for name in measured.names:
        promised = sheet.bandwidth if name == "bandwidth" else sheet.flops.get(name)
        value = measured.value(name)
        if promised and value < REJECT_BELOW * promised:
            found.append(Rejection(name, value, promised, sheet.device,
                                   measured.measured_at or _now()))
    return found


def rejection_text(rejections: list[Rejection]) -> str:
    """"measured 1.2 TB/s copy bandwidth, 25% of the H200 datasheet's 4.8 TB/s; ..."."""
    parts = [f"{amount(r.ceiling, r.measured)} {what(r.ceiling)}, {r.share:.0%} of the "
             f"{r.card} datasheet's {amount(r.ceiling, r.datasheet)}" for r in rejections]
    return "measured " + "; ".join(parts)


# Rejected measurements in use in this process (no good one cached), by cache file: a
# notebook measures once per session, not at every check.
_in_use: dict[Path, Ceilings] = {}


def ceilings(remeasure: bool = False) -> Ceilings:
    """This GPU's measured ceilings, from the cache unless ``remeasure`` (10–15 s).

    A new measurement under ``REJECT_BELOW`` of the datasheet is not cached: the previous
    good entry is used instead, or, without one, this measurement, marked suspect. A cache
    entry that fails the same test (written before rooflab made it) is measured again.
    """
    device = current()
    sheet = datasheet_for(device)
    path = cache_path(device)
    if not remeasure:
        cached = _good_cached(device, sheet)
        if cached is not None:
            return cached
        if path in _in_use:
            return _in_use[path]
    with _one_at_a_time(path):
        previous = _good_cached(device, sheet)
        if previous is not None and not remeasure:
            return previous  # another process measured while this one waited
        return _measure_and_keep(device, previous, sheet)


def _good_cached(device: Device, sheet: Ceilings | None) -> Ceilings | None:
    """The cached ceilings, unless they fail the datasheet test (cached before rooflab made
    it): then they are deleted, and the learner told."""
    cached = load_cached(device)
    stale = below_datasheet(cached, sheet) if cached is not None else []
    if not stale:
        return cached
    _say(f"the ceilings cached {when(cached.measured_at)} {rejection_text(stale)}: "
         "measured on a busy card before rooflab compared with the datasheet; measuring again")
    cache_path(device).unlink(missing_ok=True)
    return None


@contextlib.contextmanager
def _one_at_a_time(path: Path) -> Iterator[None]:
    """One measurement of a card at a time: processes started together (pytest workers,
    several notebooks) would otherwise measure at once, slow each other down, and all be
    rejected. A lock file beside the cache; no lock where there is no ``fcntl``."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _measure_and_keep(device: Device, previous: Ceilings | None,
                      sheet: Ceilings | None) -> Ceilings:
    """Measure; cache the measurement if it passes the datasheet test, else say so and
    fall back to ``previous``, or use it marked suspect."""
    path = cache_path(device)
    measured = measure(device)
    rejections = below_datasheet(measured, sheet)
    if not rejections:
        save(measured, device)
        _in_use.pop(path, None)
        return measured
    instead = (f"using the ceilings measured {when(previous.measured_at)} instead"
               if previous else "using it for now, marked suspect: fractions against it read "
               "high")
    _say(f"{rejection_text(rejections)}: is another process using the GPU (nvidia-smi "
         f"shows)? Not cached; {instead}. Run `rooflab roofline --remeasure` when the card "
         "is idle.")
    if previous is not None:
        previous.rejected.extend(rejections)
        save(previous, device)  # the rejection is recorded, the figures unchanged
        return previous
    measured.rejected = rejections
    measured.suspect = rejection_text(rejections)
    _in_use[path] = measured
    return measured


# ---------------------------------------------------------------------------------------
# Observations: a timing that beats a ceiling raises it


def _l2_bytes(device_name: str, l2_bytes: int = 0) -> int:
    """The L2 size: the device's own figure, else its datasheet's, else a generous guess."""
    card = datasheet.lookup(device_name)
    return l2_bytes or (card.l2_bytes if card else 0) or UNKNOWN_L2_BYTES


def _datasheet_value(ceilings: Ceilings, ceiling: str) -> float | None:
    """What the datasheet promises for this ceiling on this card, if it says."""
    if ceilings.source == "datasheet":
        return ceilings.value(ceiling)
    card = datasheet.lookup(ceilings.device)
    if card is None:
        return None
    return card.bandwidth if ceiling == "bandwidth" else card.flops.get(ceiling)


def achieved(cost: Cost, seconds: float) -> dict[str, float]:
    """The rates a timing reached, by ceiling: bytes/s, and FLOP/s for the cost's dtype."""
    rates = {"bandwidth": cost.bytes / seconds}
    if cost.flops:
        rates[cost.dtype] = cost.flops / seconds
    return rates


def observe(cost: Cost, seconds: float, workload: str, ceilings: Ceilings,
            device: Device | None = None) -> list[Raise]:
    """Raise each measured ceiling that this timing beat, in ``ceilings`` and in the cache,
    and return the raises (empty: nothing beaten).

    Call it with the median time of a workload whose answer was checked: the library's (a
    benchmark's baseline row, a check's ``spec.baseline``) or a kernel's. A ceiling is the
    fastest this card was seen to go; a timing beyond it means the measurement missed the
    card's best, so the ceiling becomes what was reached. Never raised: datasheet ceilings;
    a rate above the datasheet (no real work outruns the hardware: the cost model counts
    work the kernel does not do); bandwidth from fewer bytes than ``L2_MULTIPLE`` × L2.
    """
    if ceilings.source != "measured" or seconds <= 0:
        return []
    device = device or current()
    l2 = _l2_bytes(device.name, device.l2_bytes)
    raises = []
    for name, rate in achieved(cost, seconds).items():
        if name not in ceilings.names or rate <= ceilings.value(name):
            continue
        promised = _datasheet_value(ceilings, name)
        impossible = promised is not None and rate > promised
        if impossible or (name == "bandwidth" and cost.bytes < L2_MULTIPLE * l2):
            continue
        raises.append(Raise(name, ceilings.value(name), rate, workload, _now()))
        ceilings.set(name, rate)
        ceilings.raised.append(raises[-1])
    if raises and not ceilings.suspect:
        _persist(raises, device)
    return raises


def _persist(raises: list[Raise], device: Device) -> None:
    """Apply the raises to the cache as it is now (another process may have changed it)."""
    cached = load_cached(device)
    if cached is None:
        return
    for r in raises:
        if r.after > cached.value(r.ceiling):
            cached.raised.append(Raise(r.ceiling, cached.value(r.ceiling), r.after,
                                       r.workload, r.at))
            cached.set(r.ceiling, r.after)
    save(cached, device)


# ---------------------------------------------------------------------------------------
# Explaining a fraction


def fraction_note(fraction: float, cost: Cost, seconds: float, ceilings: Ceilings, *,
                  raised: Sequence[Raise] = (), l2_bytes: int = 0, method: str = "") -> str:
    """Why a roofline fraction reads as it does, when it needs saying; "" otherwise.

    Says which ceilings this very timing raised (then the fraction is against the raised
    one), and for a fraction above ``ABOVE_FLOOR`` the cause the evidence supports: ceilings
    measured on a busy card; a rate above the datasheet (the cost model counts more work
    than the kernel does); a working set small next to L2 (bytes served from L2, not DRAM).
    """
    notes = [_raise_note(r, ceilings) for r in raised]
    if fraction > ABOVE_FLOOR:
        notes.append(_above_note(fraction, cost, seconds, ceilings, l2_bytes, method))
    return "; ".join(notes)


def _raise_note(r: Raise, ceilings: Ceilings) -> str:
    cached = "" if ceilings.suspect else " and cached"
    return (f"the {what(r.ceiling)} ceiling measured {when(ceilings.measured_at)}, "
            f"{amount(r.ceiling, r.before)}, was below what this card reaches: {r.workload} "
            f"reached {amount(r.ceiling, r.after)}, {r.after / r.before:.0%} of it, so it was "
            f"raised{cached}; the fraction is against the raised ceiling")


def _above_note(fraction: float, cost: Cost, seconds: float, ceilings: Ceilings,
                l2_bytes: int, method: str) -> str:
    floor = time_floor(cost, ceilings)
    name = "bandwidth" if floor.bound == "memory" else cost.dtype
    rate = achieved(cost, seconds)[name]
    promised = _datasheet_value(ceilings, name)
    head = f"{fraction:.0%} is above the floor"
    if ceilings.suspect:
        return (f"{head} because the ceilings were measured on a busy card ({ceilings.suspect}"
                "; not cached): run `rooflab roofline --remeasure` when the card is idle")
    beyond_sheet = promised is not None and rate > promised
    l2 = _l2_bytes(ceilings.device, l2_bytes)
    if name == "bandwidth" and cost.bytes < L2_MULTIPLE * l2:
        graph = (" and it was timed by replaying a CUDA graph, which does not flush L2 "
                 "between runs" if method == "cuda graph" else "")
        sheet = (f" ({amount(name, rate)}: more than the datasheet's {amount(name, promised)}"
                 " from DRAM)" if beyond_sheet else "")
        return (f"{head}: its {cost.bytes / 1e6:.3g} MB of compulsory traffic is under "
                f"{L2_MULTIPLE}× the {l2 / 2**20:.0f} MiB L2{graph}, so part of it came from "
                f"(or stayed in) L2{sheet}, while the floor assumes DRAM")
    if beyond_sheet:
        counted = ("bytes than this kernel moves (inputs served from L2, or traffic it avoids)"
                   if name == "bandwidth" else "FLOPs than this kernel computes (work it skips, "
                   "or a count that assumes more)")
        return (f"{head}, and {amount(name, rate)} is above the datasheet's "
                f"{amount(name, promised)}: no real work outruns the hardware, so the cost model "
                f"counts more {counted}")
    return (f"{head}: this card beat its measured {what(name)} ceiling, "
            f"{amount(name, ceilings.value(name))}, which was not raised here; run `rooflab "
            "roofline --remeasure`, or check the cost model for work counted but not done")


# ---------------------------------------------------------------------------------------
# How the figures came to be, for `rooflab roofline`


def provenance(ceilings: Ceilings, sheet: Ceilings | None = None) -> list[str]:
    """Lines saying when and how each figure was measured, what raised it since, and which
    measurements were rejected, beside the datasheet where there is one."""
    if ceilings.source != "measured":
        return [f"{ceilings.label}: nothing measured"]
    lines = [_how_line(ceilings)]
    for name in ceilings.names:
        lines.append(_figure_line(ceilings, name, sheet))
    for r in ceilings.rejected[-3:]:
        lines.append(f"rejected {when(r.at)}: measured {amount(r.ceiling, r.measured)} "
                     f"{what(r.ceiling)}, {r.share:.0%} of the {r.card} datasheet's "
                     f"{amount(r.ceiling, r.datasheet)} (a busy card?): not cached")
    if ceilings.suspect:
        lines.append("SUSPECT: these figures were rejected against the datasheet and are not "
                     "cached; run `rooflab roofline --remeasure` when the card is idle")
    return lines


def _how_line(c: Ceilings) -> str:
    at = f"measured {when(c.measured_at)}, driver {c.driver or 'unknown'}"
    if not c.method:
        return (f"{at}; how was not recorded (cached by an older rooflab: `rooflab roofline "
                "--remeasure` records it)")
    repeats = max(m.repeats for m in c.method.values())
    warm = f"after {c.warmup_s:g} s of matmuls to warm the card up" if c.warmup_s \
        else "without a warm-up"
    return (f"{at}, in {c.measuring_s:g} s, {warm}: every shape below timed {repeats} times, "
            "shapes interleaved, each timing the median of ~100 ms of calls with L2 flushed; "
            "each figure is the best median of its shapes and repeats")


def _figure_line(c: Ceilings, name: str, sheet: Ceilings | None) -> str:
    """"  bf16  714 TFLOP/s (72% of the datasheet)  torch.matmul: 4096³ 690, ...; best at
    4096³; raised ... by ..." for one ceiling."""
    line = f"  {name:<10}{amount(name, c.value(name)):>13}"
    promised = sheet.value(name) if sheet and name in sheet.names else None
    if promised:
        line += f" ({c.value(name) / promised:.0%} of the datasheet)"
    m = c.method.get(name)
    if m is not None:
        tried = ", ".join(f"{shape} {amount(name, v).split()[0]}" for shape, v in m.best.items())
        line += f"  {m.workload}: {tried}; best at {m.chosen}"
    raises = [r for r in c.raised if r.ceiling == name]
    if raises:
        last = raises[-1]
        earlier = f" (and {len(raises) - 1} times before)" if len(raises) > 1 else ""
        line += (f"; raised {when(last.at)} from {amount(name, last.before)} by "
                 f"{last.workload}{earlier}")
    return line


def target(name: str | None = None) -> tuple[Ceilings, datasheet.Card]:
    """Ceilings and card geometry (L2, SMs) to predict for: a datasheet card name, or a
    JSON file of ceilings measured on a GPU (as ``rooflab roofline --json`` writes).
    Default: $ROOFLAB_TARGET, else the H100 SXM datasheet."""
    name = name or os.environ.get("ROOFLAB_TARGET") or datasheet.DEFAULT_CARD
    if name.endswith(".json"):
        record = json.loads(Path(name).read_text())
        measured = Ceilings.from_dict(record.get("measured") or record)
        card = datasheet.lookup(measured.device) or datasheet.get(datasheet.DEFAULT_CARD)
        return measured, card
    card = datasheet.get(name)
    return from_datasheet(card), card
