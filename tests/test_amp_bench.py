"""`rooflab bench amp`'s workloads: the sizes the lab states its goals at, PyTorch's way
first, the compulsory bytes of each; every kernel answers as PyTorch's way does."""

import pytest
import torch

from rooflab.autograder.bench import amp as bench_amp

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_the_workloads_build_without_allocating_at_the_goal_sizes():
    loads = {load.shape: load for load in bench_amp.amp_workloads("cpu")}
    n = 1 << 30
    assert set(loads) == {f"adamw n={n} fp16 grads", f"fp8 n={n}",
                          "fp8 gemm m=4096 n=4096 k=4096", "fp8 gemm m=8192 n=7168 k=2048",
                          "train mlp 1024-4096x8-1024 batch 8192"}
    adamw = loads[f"adamw n={n} fp16 grads"]
    assert adamw.cost.bytes == 28 * n  # 12 read + 2 gradient, 12 written + 2 copy
    assert next(iter(adamw.kernels)).startswith("torch")
    assert loads[f"fp8 n={n}"].cost.bytes == 3 * n
    train = loads["train mlp 1024-4096x8-1024 batch 8192"]
    assert list(train.kernels) == ["fp32 (TF32 off)", "bf16 autocast",
                                   "fp16 autocast + GradScaler"]
    assert train.cost.dtype == "bf16" and train.cost.flops > 1e12


def _copies(inputs):
    return (*(t.clone() for t in inputs[:-1]), bench_amp.TorchAdamW())


def test_the_adamw_kernels_take_the_same_step():
    inputs = bench_amp.adamw_inputs(5000, DEVICE)
    theirs, mine = _copies(inputs), _copies(inputs)
    torch_copy = bench_amp.torch_adamw_step(*theirs)
    ours = bench_amp.rooflab_adamw_step(*mine)
    # It moved: the fp32 master weights, by about 1e-5, which the bf16 copy shows only
    # where a value sits near a rounding boundary (on some draws, nowhere).
    assert not torch.equal(theirs[0], inputs[0])
    # The same step, so the same master weights within fp32 roundings: another step count
    # (other bias corrections) moves them by about half an update, 1e-6 and more.
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(ours.float(), torch_copy.float(), rtol=8e-3, atol=1e-6)


def test_the_fp8_kernels_give_the_same_bits():
    x, scale = bench_amp.fp8_inputs(10001, DEVICE)
    ours, theirs = bench_amp.rooflab_fp8(x, scale), bench_amp.torch_fp8(x, scale)
    assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    assert float((x.float() * scale).abs().max()) > 448  # the workload saturates some


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_training_step_of_the_small_model_gives_the_fp32_loss(dtype):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, optimizer, x, y = bench_amp.training_inputs(DEVICE, 16, 32, 2, 8, 64)
        loss = bench_amp.training_step(dtype)(model, optimizer, x, y)
        model, optimizer, x, y = bench_amp.training_inputs(DEVICE, 16, 32, 2, 8, 64)
        want = bench_amp.training_step(torch.float32)(model, optimizer, x, y)
    finally:
        torch.set_num_threads(before)
    assert loss.shape == () and abs(float(loss) / float(want) - 1) < 2e-2
