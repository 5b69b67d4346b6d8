"""Lab 07 — mixed precision. Rounding to bf16 on the bits, what fp16 does to a gradient,
dynamic loss scaling, a training step under autocast, a fused AdamW step on fp32 master
weights, fp8 quantisation with a per-tensor scale, and a block-scaled fp8 matmul.

Conversions are graded bit for bit against PyTorch's own (``x.to(torch.bfloat16)``,
``x.to(torch.float8_e4m3fn)`` of the scaled and saturated input), except that any NaN
stands for any other: a CPU and a GPU make different NaN bit patterns. The scaler is
graded step by step against ``torch.amp.GradScaler`` itself, on scripted gradients with
infs and NaNs; the training step against a run of the same steps by the grader; the fused
optimizer step against AdamW's maths in float64, within a few fp32 roundings.

The lab's problems, in the order the lab takes them:

* ``formats.py``: ``amp/bf16_round`` and ``amp/underflow``;
* ``scaling.py``: ``amp/loss_scaler`` and ``amp/train_step``;
* ``adamw.py``: ``amp/fused_adamw``;
* ``fp8.py``: ``amp/fp8_quantize``;
* ``fp8_gemm.py``: ``amp/fp8_block_gemm``, the block-scaled fp8 matmul;
* ``common.py``: what they share.
"""

from . import adamw, formats, fp8, fp8_gemm, scaling  # noqa: F401  (importing each registers its problems)
