"""Lab 07, the last rung: a block-scaled fp8 matmul (``amp/fp8_block_gemm``), as
DeepSeek-V3 trains. One scale per 1 × 128 block of the activations and one per
128 × 128 block of the weights; each K block's fp8 product is summed in fp32 and scaled
apart before it joins the others.

The inputs are quantised here, by the grader's own code, from values whose magnitude
changes from block to block by up to 2¹² (and, in one case, a block of outliers), so that
a kernel applying any scale but its own block's is far off. The reference is the float64
product of the dequantised operands; each element's error is measured against the size of
its dot product, Σ_k |a_ik · b_kj| (see ``compare_block_gemm``).
"""

from __future__ import annotations

import math

import torch

from ...device import current
from ...evidence.compare import compare
from ...problem import (
    Case,
    Cost,
    Draw,
    Hidden,
    Problem,
    Span,
    Tolerance,
    random_tensor,
    register,
)
from .common import CASTS, E4M3, F32, Diagnosis

SCALE_BLOCK = 128
SIGNATURE = ("(a: Tensor[M, K] float8_e4m3fn, a_scale: Tensor[M, ceil(K/128)] fp32, b: "
             "Tensor[K, N] float8_e4m3fn (any strides), b_scale: Tensor[ceil(K/128), "
             "ceil(N/128)] fp32) -> Tensor[M, N] fp32: Σ over K blocks of (a · b over the "
             "block) × a's scale of (row, block) × b's scale of (block, column block)")
OUTLIERS = "a block of outliers 4096 times the rest"
WEIGHTS_AS_STORED = "the weights stored N × K, as a Linear keeps them"


def _blockwise(x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` in e4m3 with one scale per ``rows`` × 128 block (x ≈ q · scale)."""
    m, n = x.shape
    bm, bn = math.ceil(m / rows), math.ceil(n / SCALE_BLOCK)
    padded = x.new_zeros(bm * rows, bn * SCALE_BLOCK)
    padded[:m, :n] = x
    tiles = padded.view(bm, rows, bn, SCALE_BLOCK)
    scales = tiles.abs().amax(dim=(1, 3)).clamp_min(1e-30) / 448.0
    q = (tiles / scales[:, None, :, None]).clamp(-448.0, 448.0).view_as(padded)
    return q[:m, :n].to(E4M3), scales.float()


def _spread(x: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """``x`` with each rows × 128 block times its own power of two, 2⁻⁶ to 2⁶."""
    m, n = x.shape
    powers = torch.randint(-6, 7, (math.ceil(m / rows), math.ceil(n / SCALE_BLOCK)),
                           generator=gen, device=x.device).float()
    factor = (2.0 ** powers).repeat_interleave(rows, 0)[:m].repeat_interleave(SCALE_BLOCK,
                                                                              1)[:, :n]
    return x * factor


def _inputs(case: Case, gen: torch.Generator, device: torch.device) -> tuple:
    m, n, k = (case.sizes[name] for name in "mnk")
    a = _spread(random_tensor((m, k), F32, gen, device), 1, gen)
    if case.note == OUTLIERS:
        a[m // 2, :min(k, SCALE_BLOCK)] *= 4096.0
    w = _spread(random_tensor((k, n), F32, gen, device), SCALE_BLOCK, gen)
    a_q, a_scale = _blockwise(a, 1)
    b_q, b_scale = _blockwise(w, SCALE_BLOCK)
    if "b" in case.transposed:  # the same values, stored N × K
        b_q = b_q.t().contiguous().t()
    return a_q, a_scale, b_q, b_scale


def _expand(scales: torch.Tensor, rows: int, shape: tuple[int, int]) -> torch.Tensor:
    return scales.repeat_interleave(rows, 0)[:shape[0]].repeat_interleave(
        SCALE_BLOCK, 1)[:, :shape[1]]


def _reference(a, a_scale, b, b_scale) -> dict:
    """The float64 product of the dequantised operands; |A| @ |B|, the size of each dot
    product, which its rounding error scales with; and the inputs, for the diagnosis."""
    a_deq = a * _expand(a_scale, 1, a.shape)
    b_deq = b * _expand(b_scale, SCALE_BLOCK, b.shape)
    return {"product": a_deq @ b_deq, "magnitude": a_deq.abs() @ b_deq.abs(),
            "inputs": (a, a_scale, b, b_scale)}


def _cost(case: Case) -> Cost:
    m, n, k = (case.sizes[name] for name in "mnk")
    blocks = math.ceil(k / SCALE_BLOCK)
    scales = 4 * (m * blocks + blocks * math.ceil(n / SCALE_BLOCK))
    return Cost(flops=2.0 * m * n * k, bytes=m * k + k * n + scales + 4 * m * n, dtype="fp8")


def _near(output: torch.Tensor, other: torch.Tensor) -> bool:
    return bool((output.double() - other).norm() <= 1e-3 * other.norm())


def _diagnose(inputs: tuple, output: torch.Tensor, reference: torch.Tensor) -> str:
    """The classic slips, each reproduced in float64 from the same fp8 values."""
    a, a_scale, b, b_scale = (t.double() for t in inputs)
    qa, qb = a, b
    blocks = a_scale.shape[1]
    slips = {
        "the scales were never applied: each K block's product must be multiplied by its "
        "activation scale (row, block) and its weight scale (block, column block)":
            qa @ qb,
        "divided by the scales: they dequantise (value = fp8 number × scale): multiply":
            (qa / _expand(a_scale, 1, a.shape)) @ (qb / _expand(b_scale, SCALE_BLOCK,
                                                               b.shape)),
        "one scale for the whole sum: the K blocks were summed first and then scaled by "
        "the last block's scales; each block's sum needs its own scales before it joins "
        "the others":
            (qa @ qb) * a_scale[:, blocks - 1:blocks] * _expand(
                b_scale[blocks - 1:blocks], SCALE_BLOCK, (1, b.shape[1])),
    }
    if b_scale.shape[0] == b_scale.shape[1]:  # square: read across, it is still a scale
        slips["the weight scales read as [column block, K block]: b_scale is "
              "[K block, column block]"] = (qa * _expand(a_scale, 1, a.shape)) @ (
            qb * _expand(b_scale.t(), SCALE_BLOCK, b.shape))
    for cause, answer in slips.items():
        if answer.shape == output.shape and _near(output, answer):
            return cause
    return ""


# In the interpreter each fp8 product is exact in fp32 and each sum fp32: a correct kernel
# is off by about 1e-7 of Σ|a·b|. The element bound, 2e-5 of Σ|a·b|, is tighter at every
# element of these inputs than the 2e-3 of (|ref_i| + rms(ref)) it replaces (that ratio is
# above 0.02 here).
CPU_TOLERANCE = Tolerance(rel=2e-4, elem=2e-5)
# Hopper's fp8 MMA keeps about 14 significant bits of its partial sums and truncates
# (DeepSeek-V3 report, 3.3.2): within a 128-long K block (promoted to fp32 after it) each
# partial sum loses up to 2⁻¹³ of itself. Emulated so (tests/test_fp8_gemm.py), with the
# truncation after each 32-long MMA step, the error is 1.1e-4 to 1.3e-4 in norm (an H100
# measured 1.28e-4 on the 2048 × 4096 × 2048 case) and under 1e-4 of Σ|a·b| at the worst
# element; truncating after every product, a harsher model than the hardware, gives 5e-4
# and 4e-4. So: 4e-3 of Σ|a·b| for an element, which every slip misses by far (it is off
# by whole blocks' products); and 5e-4 for the norm, four times what the H100 measured,
# while the exact answer rounded to bf16 (about 1.6e-3 on these inputs; 2⁻⁹ of each
# element at most) still fails it.
GPU_TOLERANCE = Tolerance(rel=5e-4, elem=4e-3)
UNBOUNDED = Tolerance(rel=math.inf, elem=math.inf)


def compare_block_gemm(output: object, reference: dict, on_gpu: bool | None = None) -> str:
    """"" if ``output`` is the product within this world's tolerance (on a GPU where
    ``on_gpu`` is None and kernels run on one), else what is wrong: the norm of the error
    against the product's, and each element's against Σ_k |a_ik · b_kj|, not |ref_i|: an
    output that is a sum of large K blocks that cancel carries their rounding, however
    small it is itself."""
    if on_gpu is None:
        on_gpu = current().can_measure
    product, magnitude = reference["product"], reference["magnitude"]
    # Type, shape, dtype, device, unwritten elements and NaN/inf, as for every problem.
    form = compare(output, product, dtype=F32, device=product.device, tolerance=UNBOUNDED)
    if not form.ok:
        return form.cause
    if output.numel() == 0:
        return ""
    tolerance = PROBLEM.tolerance(F32, on_gpu)
    diff = (output.detach().double() - product).abs_()
    errors = diff / magnitude.clamp_min(torch.finfo(torch.float64).tiny)
    worst = tuple(int(i) for i in torch.unravel_index(errors.argmax(), errors.shape))
    rel, elem = form.rel_error, float(errors[worst])
    if rel <= tolerance.rel and elem <= tolerance.elem:
        return ""
    cause = (f"output: relative error {rel:.2e} (tolerance {tolerance.rel:.0e}), worst element "
             f"off by {elem:.2e} of Σ_k |a_ik · b_kj| (tolerance {tolerance.elem:.0e}) at {worst}: "
             f"got {float(output[worst]):.6g}, expected {float(product[worst]):.6g}")
    slip = _diagnose(reference["inputs"], output, product)
    return Diagnosis(f"{cause}; {slip}") if slip else cause


PROBLEM = register(Problem(
    id="amp/fp8_block_gemm",
    title="A block-scaled fp8 matmul: 1 × 128 activation scales, 128 × 128 weight scales, "
          "fp32 sums scaled a K block at a time",
    signature=SIGNATURE, make_inputs=_inputs, reference=_reference, cost=_cost,
    out_dtype=lambda case: F32, compare=compare_block_gemm,
    # The exact answer rounded to bf16 is about 8 times past the CPU's norm bound and 3
    # times past the GPU's (the reasons for each are above CPU_TOLERANCE).
    tolerances={"fp32": CPU_TOLERANCE}, gpu_tolerances={"fp32": GPU_TOLERANCE},
    library_ops=CASTS | frozenset({"mm", "matmul", "addmm", "bmm", "_scaled_mm", "mul",
                                   "einsum", "mv", "dot"}),
    solution="rooflab.kernels.amp:fp8_block_matmul",
    cpu_cases=[
        Case({"m": 64, "n": 128, "k": 256}, E4M3),
        Case({"m": 70, "n": 200, "k": 384}, E4M3, note="ragged M and N"),
        Case({"m": 33, "n": 128, "k": 300}, E4M3, note="K not a multiple of 128"),
        Case({"m": 48, "n": 256, "k": 256}, E4M3, transposed=("b",), note=WEIGHTS_AS_STORED),
        Case({"m": 32, "n": 128, "k": 512}, E4M3, note=OUTLIERS),
        Case({"m": 1, "n": 128, "k": 128}, E4M3, note="one row"),
    ],
    gpu_cases=[
        Case({"m": 1000, "n": 1000, "k": 1000}, E4M3, note="ragged M, N and K"),
        Case({"m": 2048, "n": 4096, "k": 2048}, E4M3, transposed=("b",),
             note=WEIGHTS_AS_STORED),
        Case({"m": 512, "n": 1024, "k": 4096}, E4M3, note=OUTLIERS),
    ],
    hidden=Hidden(cpu=Draw({"m": Span(3, 65, odd=True), "n": Span(65, 257, odd=True),
                            "k": Span(129, 383, odd=True)}, dtype=E4M3),
                  gpu=Draw({"m": Span(1001, 3001, odd=True), "n": Span(1001, 3001, odd=True),
                            "k": Span(1001, 3001, odd=True)}, dtype=E4M3)),
    # Timed in `rooflab bench`, not in the check: `rooflab roofline` measures no fp8
    # ceiling yet, and a check's fraction needs a measured one.
    timed=False,
    hints=("Walk K one scale block (128) at a time: load A's BLOCK_M × 128 and B's "
           "128 × BLOCK_N fp8 tiles and multiply them with tl.dot into fp32.",
           "Scale each block's product before adding it to the accumulator: times A's "
           "scale of each row for this block (a vector over the rows) and times B's one "
           "scale for (this block, this program's column block). Summing first and "
           "scaling once is wrong whenever the scales differ from block to block."),
    answer_in=("fp8_block_matmul_kernel",),
))
