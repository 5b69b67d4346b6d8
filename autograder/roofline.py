"""The roofline: the fastest a kernel could possibly run on this device.

    time floor        = max(flops / peak FLOP/s for the dtype, compulsory bytes / peak bandwidth)
    roofline fraction = time floor / measured time

The peaks ("ceilings") are *measured* on the device in front of you: bandwidth with a large
device-to-device copy (bytes read plus bytes written), FLOP/s with the library matmul at a
size that fills the chip. They are cached per device name and driver in the user's cache
directory. Datasheet numbers (``datasheet.py``) are shown beside them, never used instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from . import datasheet
from .device import Device, current
from .problem import Cost

MATMUL_DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


@dataclass
class Ceilings:
    """Peak bandwidth (bytes/s) and peak FLOP/s per dtype of one device."""

    device: str
    source: str  # "measured" or "datasheet"
    bandwidth: float
    flops: dict[str, float] = field(default_factory=dict)
    driver: str = ""
    measured_at: str = ""

    def peak_flops(self, dtype: str) -> float:
        if dtype in self.flops:
            return self.flops[dtype]
        raise KeyError(f"no {dtype} compute ceiling for {self.device} ({self.source})")

    def ridge(self, dtype: str) -> float:
        """Arithmetic intensity (FLOP/byte) where memory-bound turns compute-bound."""
        return self.peak_flops(dtype) / self.bandwidth

    @property
    def label(self) -> str:
        if self.source == "measured":
            return f"{self.device}, measured"
        return f"{self.device}, datasheet (not measured)"


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
    compute_s = cost.flops / ceilings.peak_flops(cost.dtype) if cost.flops else 0.0
    memory_s = cost.bytes / ceilings.bandwidth
    return Floor(max(compute_s, memory_s), compute_s, memory_s)


def roofline_fraction(floor: Floor, measured_s: float) -> float:
    return floor.seconds / measured_s


# ---------------------------------------------------------------------------------------
# Measuring and caching (GPU only)


def cache_dir() -> Path:
    """$ROOFLAB_CACHE_DIR if set, else the user's cache directory (XDG) + /rooflab."""
    if os.environ.get("ROOFLAB_CACHE_DIR"):
        return Path(os.environ["ROOFLAB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rooflab"


def cache_path(device: Device) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{device.name}-driver-{device.driver}").strip("-")
    return cache_dir() / f"ceilings-{slug}.json"


def measure_bandwidth(nbytes: int | None = None) -> float:
    """Bytes/s of a device-to-device copy: each element is read once and written once."""
    from .timing import time_gpu

    if nbytes is None:
        free, _ = torch.cuda.mem_get_info()
        nbytes = min(1 << 30, free // 4)  # 1 GiB: far beyond any L2
    n = nbytes // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    timing = time_gpu(lambda: dst.copy_(src))
    return 2 * n * 4 / timing.median_s


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


def measure_matmul_flops(dtype: str, n: int = 8192) -> float:
    """FLOP/s of torch.matmul on n×n×n: the library's best effort is the practical peak."""
    from .timing import time_gpu

    torch_dtype = MATMUL_DTYPES[dtype]
    with _tf32(dtype == "tf32"):
        a = torch.randn(n, n, device="cuda", dtype=torch_dtype)
        b = torch.randn(n, n, device="cuda", dtype=torch_dtype)
        timing = time_gpu(lambda: torch.matmul(a, b))
    return 2 * n**3 / timing.median_s


def measure(device: Device | None = None) -> Ceilings:
    device = device or current()
    if not device.is_gpu:
        raise RuntimeError("ceilings can only be measured on a GPU; on a CPU use "
                           "roofline.from_datasheet(card) and say that nothing was measured")
    flops = {}
    for dtype in MATMUL_DTYPES:
        # fp32 without TF32 is ~15x slower: a smaller size still fills the chip.
        flops[dtype] = measure_matmul_flops(dtype, n=4096 if dtype == "fp32" else 8192)
    return Ceilings(
        device=device.name,
        source="measured",
        bandwidth=measure_bandwidth(),
        flops=flops,
        driver=device.driver,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def load_cached(device: Device) -> Ceilings | None:
    path = cache_path(device)
    try:
        return Ceilings(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def save(ceilings: Ceilings, device: Device) -> Path:
    path = cache_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(ceilings), indent=2) + "\n")
    return path


def ceilings(remeasure: bool = False) -> Ceilings:
    """This GPU's measured ceilings, from the cache unless ``remeasure`` (a few seconds)."""
    device = current()
    if not remeasure:
        cached = load_cached(device)
        if cached is not None:
            return cached
    measured = measure(device)
    save(measured, device)
    return measured


def datasheet_for(device: Device) -> Ceilings | None:
    """The datasheet entry matching this device's name, to show beside the measurement."""
    card = datasheet.lookup(device.name) if device.is_gpu else None
    return from_datasheet(card) if card else None


def target(name: str | None = None) -> tuple[Ceilings, datasheet.Card]:
    """Ceilings and card geometry (L2, SMs) to predict for: a datasheet card name, or a
    JSON file of ceilings measured on a GPU (as ``rooflab roofline --json`` writes).
    Default: $ROOFLAB_TARGET, else the H100 SXM datasheet."""
    name = name or os.environ.get("ROOFLAB_TARGET") or datasheet.DEFAULT_CARD
    if name.endswith(".json"):
        record = json.loads(Path(name).read_text())
        measured = Ceilings(**(record.get("measured") or record))
        card = datasheet.lookup(measured.device) or datasheet.get(datasheet.DEFAULT_CARD)
        return measured, card
    card = datasheet.get(name)
    return from_datasheet(card), card
