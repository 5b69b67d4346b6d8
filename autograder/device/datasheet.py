"""Vendor datasheet numbers for common cards.

These are shown *beside* measured ceilings and used for predictions on a CPU, where
nothing can be measured. They are never taken as the truth about the card in front of
you: clocks, power limits and memory parts differ between boards that share a name.

Dense (non-sparse) tensor-core throughput; FLOP/s and bytes/s in SI units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

T = 1e12


@dataclass(frozen=True)
class Card:
    """A GPU as its datasheet describes it."""

    name: str
    bandwidth: float  # bytes/s, HBM or GDDR
    flops: dict[str, float] = field(default_factory=dict)  # dtype -> FLOP/s
    l2_bytes: int = 0
    sm_count: int = 0
    pattern: str = ""  # regex matched against torch.cuda.get_device_name()
    shared_memory: int = 0  # bytes of shared memory one block may use
    # What one SM holds at once (CUDA's occupancy limits for the compute capability):
    # 64 warps and 32 blocks on Hopper and A100, 48 and 16 on A10G, 48 and 24 on Ada, 32 and
    # 16 on Turing.
    warps_per_sm: int = 64
    programs_per_sm: int = 32

    def peak_flops(self, dtype: str) -> float | None:
        return self.flops.get(dtype)


CARDS: dict[str, Card] = {
    card.name: card
    for card in [
        Card("H100 SXM", 3.35e12, {"fp32": 67 * T, "tf32": 494.7 * T, "fp16": 989.4 * T,
             "bf16": 989.4 * T, "fp8": 1978.9 * T}, 50 << 20, 132, r"H100.*(SXM|HBM3)",
             shared_memory=227 << 10),
        Card("H100 PCIe", 2.0e12, {"fp32": 51.2 * T, "tf32": 378 * T, "fp16": 756 * T,
             "bf16": 756 * T, "fp8": 1513 * T}, 50 << 20, 114, r"H100.*PCIe",
             shared_memory=227 << 10),
        # The H200 enables 60 MiB of GH100's L2 (the card reports it), the H100s 50 MiB.
        Card("H200", 4.8e12, {"fp32": 67 * T, "tf32": 494.7 * T, "fp16": 989.4 * T,
             "bf16": 989.4 * T, "fp8": 1978.9 * T}, 60 << 20, 132, r"(?<!G)H200",
             shared_memory=227 << 10),
        Card("A100 80GB", 2.039e12, {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T,
             "bf16": 312 * T}, 40 << 20, 108, r"A100.*80\s*GB", shared_memory=163 << 10),
        Card("A100 40GB", 1.555e12, {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T,
             "bf16": 312 * T}, 40 << 20, 108, r"A100", shared_memory=163 << 10),
        Card("L40S", 0.864e12, {"fp32": 91.6 * T, "tf32": 183 * T, "fp16": 362 * T,
             "bf16": 362 * T}, 96 << 20, 142, r"L40S", shared_memory=99 << 10,
             warps_per_sm=48, programs_per_sm=24),
        Card("L4", 0.3e12, {"fp32": 30.3 * T, "tf32": 60 * T, "fp16": 121 * T,
             "bf16": 121 * T}, 48 << 20, 58, r"\bL4\b", shared_memory=99 << 10,
             warps_per_sm=48, programs_per_sm=24),
        Card("A10G", 0.6e12, {"fp32": 31.2 * T, "tf32": 62.5 * T, "fp16": 125 * T,
             "bf16": 125 * T}, 6 << 20, 80, r"A10G?\b", shared_memory=99 << 10,
             warps_per_sm=48, programs_per_sm=16),
        Card("RTX 4090", 1.008e12, {"fp32": 82.6 * T, "tf32": 82.6 * T, "fp16": 165.2 * T,
             "bf16": 165.2 * T}, 72 << 20, 128, r"4090", shared_memory=99 << 10,
             warps_per_sm=48, programs_per_sm=24),
        # Turing has neither TF32 nor BF16 matrix units.
        Card("T4", 0.32e12, {"fp32": 8.1 * T, "fp16": 65 * T}, 4 << 20, 40, r"\bT4\b",
             shared_memory=64 << 10, warps_per_sm=32, programs_per_sm=16),
    ]
}

DEFAULT_CARD = "H100 SXM"


def lookup(device_name: str) -> Card | None:
    """The datasheet entry for a device name as torch reports it, or None if unknown.

    >>> lookup("NVIDIA H100 80GB HBM3").name
    'H100 SXM'
    """
    for card in CARDS.values():
        if card.pattern and re.search(card.pattern, device_name, re.IGNORECASE):
            return card
    return None


def get(name: str) -> Card:
    """A card by its table name ("H100 SXM") or by a device name torch would report."""
    if name in CARDS:
        return CARDS[name]
    card = lookup(name)
    if card is None:
        raise KeyError(f"no datasheet for {name!r}; known cards: {', '.join(CARDS)}")
    return card
