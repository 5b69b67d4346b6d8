"""Compare one output with the float64 reference and say precisely what is wrong; and
what one case of a check found (``CaseResult``): that comparison, or what kept the case
from one."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..problem import Case, Tolerance, dtype_name
from . import poison


@dataclass
class Comparison:
    ok: bool
    rel_error: float = float("nan")
    max_elem_error: float = float("nan")
    worst_index: tuple[int, ...] | None = None
    cause: str = ""  # empty when ok; otherwise what is wrong, in words

    @property
    def summary(self) -> str:
        if self.cause:
            return self.cause
        if self.rel_error != self.rel_error:  # NaN: an answer compared by its problem's rule
            return "right" if self.ok else "wrong"
        if self.max_elem_error != self.max_elem_error:  # a few numbers, not an array's elements
            return f"rel error {self.rel_error:.2e}"
        return f"rel error {self.rel_error:.2e}, worst element {self.max_elem_error:.2e}"


def bits(t: torch.Tensor) -> torch.Tensor:
    """A view to compare bit for bit (NaN == NaN, -0.0 != 0.0)."""
    t = t.contiguous()
    width = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()]
    return t.view(width) if t.dtype != torch.bool else t


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(index))


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    """Index of the first True (argmax of bytes: no index list as large as the mask)."""
    flat = int(mask.reshape(-1).to(torch.uint8).argmax())
    return _index(flat, mask.shape)


def form_cause(out: object, *, shape: tuple[int, ...], dtype: torch.dtype,
               device: torch.device, name: str = "output") -> str:
    """Why ``out`` is not a tensor of this shape, dtype and device, or "" if it is: what
    every answer is checked for before its values."""
    if not isinstance(out, torch.Tensor):
        return (f"{name}: returned {type(out).__name__}, expected a torch.Tensor (did you "
                "forget to return it?)")
    if tuple(out.shape) != tuple(shape):
        return f"{name}: shape {tuple(out.shape)}, expected {tuple(shape)}"
    if out.dtype != dtype:
        return f"{name}: dtype {dtype_name(out.dtype)}, expected {dtype_name(dtype)}"
    if out.device.type != device.type:
        return f"{name}: on device {out.device}, expected {device}"
    return ""


def unwritten_cause(out: torch.Tensor, name: str = "output") -> str:
    """How many elements of ``out`` still hold the poison of fresh memory, or "" if none."""
    unwritten = poison.unwritten_mask(out)
    if not bool(unwritten.any()):
        return ""
    head = (f"{name}: {int(unwritten.sum())} of {out.numel()} elements were never written, "
            f"first at index {_first(unwritten)}")
    written = int((~unwritten).sum())
    flat = unwritten.reshape(-1)
    if 16 <= written <= flat.numel() - written and written & (written - 1) == 0 \
            and not bool(flat[:written].any()) and bool(flat[written:].all()):
        # One power-of-two block at the start, nothing after it, and most of the tensor:
        # what a grid of one program leaves, or programs that all write the first block
        # (a skipped tail leaves less than a block).
        return (f"{head}: only the first {written} were written, the size of one block: "
                "one program ran, or every program wrote the same block (is the grid "
                "cdiv(n, BLOCK), and does each program start at its own offset, "
                "pid * BLOCK?)")
    return (f"{head} (they hold the poison that fills fresh memory during a check: a missing "
            "tail, mask or program, or a value computed from memory that was never written)")


def compare(
    out: object,
    ref: torch.Tensor,
    *,
    dtype: torch.dtype,
    device: torch.device,
    tolerance: Tolerance,
    name: str = "output",
    contiguous: bool = False,
) -> Comparison:
    """Check type, shape, dtype, device, layout, unwritten elements, NaN/inf, then error
    norms."""
    wrong = form_cause(out, shape=tuple(ref.shape), dtype=dtype, device=device, name=name)
    if wrong:
        return Comparison(False, cause=wrong)
    if contiguous and not out.is_contiguous():
        return Comparison(False, cause=(
            f"{name}: not contiguous (strides {out.stride()}); the exercise asks for a "
            "contiguous result: allocate it with torch.empty(shape, ...) (torch.empty_like "
            "keeps a strided input's strides), and return it, not a view of it"))
    if out.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    unwritten = unwritten_cause(out, name)
    if unwritten:
        return Comparison(False, worst_index=_first(poison.unwritten_mask(out)),
                          cause=unwritten)

    # Compare where the output lives: moving a chip-filling output to the host is slow.
    got = out.detach().to(torch.float64)
    want = ref.detach().to(got.device, torch.float64)
    # Where the exact answer overflows the output dtype, inf (or NaN) is the right answer.
    want_rounded = want.to(dtype).to(torch.float64)
    finite = torch.isfinite(want_rounded)
    bad = ~torch.isfinite(got) & finite
    if bool(bad.any()):
        where = _first(bad)
        return Comparison(
            False,
            worst_index=where,
            cause=f"{name}: {int(bad.sum())} NaN/inf values where the reference is finite, "
            f"first at {where} (got {got[where].item()}, expected {want[where].item():.6g}); "
            "an overflow, or a read of memory that was never written?",
        )
    special = ~finite & ~(got == want_rounded) & ~(got.isnan() & want_rounded.isnan())
    if bool(special.any()):
        where = _first(special)
        return Comparison(False, worst_index=where,
                          cause=f"{name}: at {where} got {got[where].item()}, expected "
                          f"{want_rounded[where].item()} (the exact answer overflows "
                          f"{dtype_name(dtype)})")
    # Error norms over the elements whose answer is finite (others matched exactly above).
    want = torch.where(finite, want, 0.0)
    diff = torch.where(finite, got - want, 0.0).abs_()
    count = max(int(finite.sum()), 1)
    ref_norm = float(torch.linalg.vector_norm(want))
    diff_norm = float(torch.linalg.vector_norm(diff))
    rel = diff_norm / ref_norm if ref_norm > 0 else diff_norm
    rms = ref_norm / count**0.5
    elem_errors = diff.div_(want.abs().add_(rms if rms > 0 else 1.0))
    worst = _index(int(elem_errors.reshape(-1).argmax()), got.shape)
    max_elem = float(elem_errors[worst])

    ok = rel <= tolerance.rel and max_elem <= tolerance.elem
    cause = ""
    if not ok:
        cause = (
            f"{name}: relative error {rel:.2e} (tolerance {tolerance.rel:.0e}), worst element "
            f"{max_elem:.2e} (tolerance {tolerance.elem:.0e}) at {worst}: got "
            f"{got[worst].item():.6g}, expected {want[worst].item():.6g}"
        )
    return Comparison(ok, rel, max_elem, worst, cause)


@dataclass
class CaseResult:
    """One case of a check: its comparison, or the error that kept it from one."""

    case: Case
    comparison: Comparison | None = None
    error: str = ""  # what went wrong outside the comparison: an exception, modified inputs
    advice: str = ""  # the likely cause of a wrong answer and its fix, when one shows
    # Lines under the case: one per rank of a multi-process case (where each stood, a
    # traceback), shown in the message and on the card.
    details: list[str] = field(default_factory=list)
    again: bool = False  # a second call on a case's sizes, with new values

    @property
    def label(self) -> str:
        return f"{self.case.label}, called again with new values" if self.again \
            else self.case.label

    @property
    def explained(self) -> str:
        """The summary with the advice, for the one place the advice is shown."""
        return f"{self.summary}; {self.advice}" if self.advice else self.summary

    @property
    def ok(self) -> bool:
        return not self.error and self.comparison is not None and self.comparison.ok

    @property
    def summary(self) -> str:
        if self.error:
            return self.error
        return self.comparison.summary if self.comparison else "not run"
