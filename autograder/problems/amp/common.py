"""What lab 07's problems share: the dtypes by short name, the casts that would do an
exercise's work on the host, and the checks that the kernels moved every byte."""

from __future__ import annotations

import torch

from .. import traced

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
E4M3 = torch.float8_e4m3fn

# Conversions that would do an exercise's work in host code: the cast itself (a copy_
# between dtypes converts too).
CASTS = frozenset({"_to_copy", "to", "copy_"})




class Diagnosis(str):
    """A comparison's cause that names the slip it reproduced, not only the figures that
    are off: a check's card leads with a case that has one over a case whose values are
    just off (the card reads ``diagnosed``)."""

    diagnosed = True


def hex_bits(value: int, digits: int) -> str:
    return f"0x{value & ((1 << 4 * digits) - 1):0{digits}X}"


def kernels_did_the_work(reads: list[torch.Tensor], writes: list[torch.Tensor],
                          launches: list) -> str:
    """Every byte of ``reads`` was loaded and every byte of ``writes`` stored by a kernel."""
    for t in reads:
        if traced.bytes_moved(launches, t, "load") < t.numel() * t.element_size():
            return ("the kernels did not read all of the input: each element must be read by a "
                    "kernel (host code may only allocate, view, fill and copy)")
    for t in writes:
        if traced.bytes_moved(launches, t, "store") < t.numel() * t.element_size():
            return ("the answer was not all written by a kernel: it must come out of the "
                    "kernels' own stores, not from a copy or a conversion on the host")
    return ""


