"""The course's own kernels, against torch, on irregular shapes."""

import pytest
import torch

from rooflab.kernels.matmul import matmul
from rooflab.kernels.transpose import transpose
from rooflab.kernels.vector_add import vector_add

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [1, 127, 1025, 3001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_vector_add(n, dtype):
    x = torch.randn(n, device=DEVICE).to(dtype)
    y = torch.randn(n, device=DEVICE).to(dtype)
    torch.testing.assert_close(vector_add(x, y), x + y)


@pytest.mark.parametrize("shape", [(1, 1), (33, 65), (100, 7)])
def test_transpose(shape):
    x = torch.randn(shape, device=DEVICE)
    out = transpose(x)
    assert out.is_contiguous()
    assert torch.equal(out, x.T)


def test_transpose_of_a_strided_view():
    x = torch.randn(40, 50, device=DEVICE)[::2, 1::3]
    assert torch.equal(transpose(x), x.T)


@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (70, 33, 47), (1, 65, 129)])
def test_matmul_fp32(m, n, k):
    a = torch.randn(m, k, device=DEVICE)
    b = torch.randn(k, n, device=DEVICE)
    expected = (a.double() @ b.double()).float()
    # fp32 tl.dot is TF32 on a GPU: looser there.
    tol = 2e-2 if DEVICE == "cuda" else 1e-4
    torch.testing.assert_close(matmul(a, b), expected, rtol=tol, atol=tol)


def test_matmul_fp16_with_transposed_b():
    a = torch.randn(50, 40, device=DEVICE).half()
    b = torch.randn(65, 40, device=DEVICE).half().T
    expected = (a.double() @ b.double()).half()
    torch.testing.assert_close(matmul(a, b), expected, rtol=2e-3, atol=2e-2)


def test_matmul_bf16():
    a = torch.randn(64, 80, device=DEVICE).bfloat16()
    b = torch.randn(80, 48, device=DEVICE).bfloat16()
    expected = (a.double() @ b.double()).bfloat16()
    torch.testing.assert_close(matmul(a, b), expected, rtol=2e-2, atol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernels_on_gpu_at_size(dtype):
    x = torch.randn(10_000_019, device="cuda").to(dtype)
    y = torch.randn(10_000_019, device="cuda").to(dtype)
    torch.testing.assert_close(vector_add(x, y), x + y)
    m = torch.randn(3001, 2049, device="cuda").to(dtype)
    assert torch.equal(transpose(m), m.T)
    a = torch.randn(1000, 999, device="cuda").to(dtype)
    b = torch.randn(999, 1001, device="cuda").to(dtype)
    expected = (a.double() @ b.double()).to(dtype)
    torch.testing.assert_close(matmul(a, b), expected, rtol=2e-2, atol=1e-1)
