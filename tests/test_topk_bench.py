"""`rooflab bench topk`'s workloads: the shapes the lab states its goals at, torch.topk first,
costs of one read of the scores and k results; each kernel answers as torch.topk does."""

import pytest
import torch

from rooflab.autograder.bench.topk import topk_workloads

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_the_workloads_build_on_a_cpu_at_the_goal_shapes():
    loads = {load.shape: load for load in topk_workloads("cpu")}  # nothing allocated yet
    assert set(loads) == {"256x262144 k=256", "256x262144 k=1024", "4096x32768 k=64",
                          "8x131072 k=50", "stream 67108864 in chunks of 4194304 k=1024"}
    for load in loads.values():
        assert load.dtype == torch.float32
        assert load.cost.flops == 0
        assert next(iter(load.kernels)).startswith("torch.topk")  # the baseline, first
        assert load.baselines == (next(iter(load.kernels)),)
    big = loads["256x262144 k=1024"]
    assert big.cost.bytes == 256 * 262144 * 4 + 256 * 1024 * (4 + 8)
    assert {"rooflab topk_radix", "rooflab topk_rows (one program per row)"} < set(big.kernels)
    stream = loads["stream 67108864 in chunks of 4194304 k=1024"]
    assert stream.cost.bytes == (1 << 26) * 4 + 1024 * 12
    assert "rooflab StreamingTopK" in stream.kernels


@pytest.mark.parametrize("shape", ["4096x32768 k=64", "stream"])
def test_every_kernel_of_a_workload_answers_as_torch_topk(shape):
    """The callables, on small inputs of the same kind (a row of scores and k): the values
    they return are torch.topk's."""
    (load,) = [load for load in topk_workloads(DEVICE) if load.shape.startswith(shape)]
    # A stream shorter than its chunks of 2**22 is one chunk: the class's chunking is
    # tested in test_topk_kernels.py.
    x = torch.randn(5000, device=DEVICE) if shape == "stream" else \
        torch.randn(3, 5000, device=DEVICE)
    want = load.reference(x, 37)
    for name, kernel in load.kernels.items():
        got = kernel(x, 37)
        assert torch.equal(got, want), name
