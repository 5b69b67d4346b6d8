"""``rooflab bench attention``: lab 04's FlashAttention, forward and forward+backward,
against torch's scaled_dot_product_attention on each of its fused backends."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..problem import Cost
from .workload import NotAvailable, Workload


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


# FlashAttention-2 where the card and dtype allow it (then the memory-efficient kernel),
# never the unfused math path; cuDNN's fused attention (the default on Hopper since torch
# 2.5); and the default dispatch itself.
sdpa_flash = _sdpa_on(["FLASH_ATTENTION", "EFFICIENT_ATTENTION"])
sdpa_cudnn = _sdpa_on(["CUDNN_ATTENTION"])
sdpa_default = _sdpa_on(None)
SDPA_KERNELS = {"torch SDPA (flash where available)": sdpa_flash,
                "torch SDPA (cuDNN)": sdpa_cudnn,
                "torch SDPA (default dispatch)": sdpa_default}


def forward_and_backward(attention: Callable, causal: bool) -> Callable:
    """A timed callable for fwd+bwd: the forward, then the gradients of sum(o * do)."""
    def run(q, k, v, do):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        attention(*leaves, causal).backward(do)
        return torch.cat([leaf.grad.flatten() for leaf in leaves])

    return run


def attention_workloads(device: str) -> list[Workload]:
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
                {name: forward_and_backward(f, causal) for name, f in forward.items()
                 if name != "naive (scores in memory)"},
                forward_and_backward(sdpa_flash, causal), tuple(SDPA_KERNELS)))
    return loads
