"""The softmax ladder (kernels/softmax.py) against torch in float64, on irregular shapes.

Tolerances, for outputs compared with torch.softmax of the same input in float64:

* fp32: the kernels compute in fp32; exp, the sum over <= 1025 terms and the division each
  add a few fp32 ulps (2**-24 ≈ 6e-8), and rounding x - max adds |x - max|·6e-8, so
  errors stay near 1e-6 (measured: 5e-7). rtol 1e-5 leaves room; a wrong max, a lost
  lane or a bad rescale is off by 1e-3 or more. atol covers fp32 subnormal outputs.
* fp16: rounding the fp32 result costs half an ulp, 2**-11 ≈ 4.9e-4 relative; outputs
  below 6.1e-5 are subnormal, with an absolute spacing of 2**-24 ≈ 6e-8, hence the atol.
* bf16: half an ulp is 2**-8 relative, but the interpreter truncates fp32 -> bf16 stores
  instead of rounding (a whole ulp, < 2**-7 ≈ 7.8e-3), so rtol is 1e-2.

On a GPU, exp and the division use fast approximate instructions (a couple of ulps more
in fp32): the fp32 tolerance there is 2e-5.
"""

import pytest
import torch

from rooflab.autograder.device import datasheet
from rooflab.autograder.model.trace import tracing
from rooflab.autograder.model.traffic import analyze
from rooflab.kernels.softmax import (
    softmax_fused,
    softmax_naive,
    softmax_online,
    softmax_unstable,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 1), (7, 100), (33, 781), (4, 1025)]
TOLERANCE = {  # (rtol, atol); see the module docstring
    torch.float32: (2e-5 if DEVICE == "cuda" else 1e-5, 1e-9),
    torch.float16: (1e-3, 1e-6),
    torch.bfloat16: (1e-2, 1e-6),
}


def online_small_block(x: torch.Tensor) -> torch.Tensor:
    """The online kernel with 64-element blocks: several blocks per row even on short rows
    (2 on a row of 100, 13 on a row of 781). Smaller blocks are tested below, on short rows:
    each block costs about a millisecond in the interpreter."""
    return softmax_online(x, block=64)


STABLE = [softmax_naive, softmax_fused, softmax_online, online_small_block]
ALL = [*STABLE, softmax_unstable]


def check(out: torch.Tensor, x: torch.Tensor) -> None:
    """``out`` is softmax(x) in x's dtype and shape, within that dtype's tolerance."""
    assert out.dtype == x.dtype and out.shape == x.shape
    rtol, atol = TOLERANCE[x.dtype]
    expected = torch.softmax(x.double(), dim=-1)  # of the input as the kernel saw it
    torch.testing.assert_close(out.double(), expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_torch_on_irregular_shapes(fn, dtype, shape):
    # randn: small inputs, where even softmax_unstable is right.
    x = torch.randn(shape, device=DEVICE).to(dtype)
    check(fn(x), x)


def wide_then_narrowed(dtype):
    return torch.randn(12, 300, device=DEVICE).to(dtype)[:, 7:190]  # row stride 300, not 183


def every_other_row(dtype):
    return torch.randn(14, 301, device=DEVICE).to(dtype)[::2]


def every_third_column(dtype):
    return torch.randn(9, 600, device=DEVICE).to(dtype)[:, ::3]  # column stride 3


def transposed(dtype):
    return torch.randn(130, 11, device=DEVICE).to(dtype).T  # rows are columns in memory


@pytest.mark.parametrize("fn", STABLE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("view", [wide_then_narrowed, every_other_row, every_third_column,
                                  transposed], ids=lambda v: v.__name__)
def test_non_contiguous_input(fn, dtype, view):
    x = view(dtype)
    assert not x.is_contiguous()
    out = fn(x)
    assert out.is_contiguous()
    check(out, x)


@pytest.mark.parametrize("fn", STABLE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_magnitude_inputs_stay_finite_and_correct(fn, dtype):
    x = (torch.randn(7, 100, device=DEVICE) * 1000).to(dtype)  # exp(x) overflows everywhere
    out = fn(x)
    assert torch.isfinite(out).all()
    check(out, x)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the point
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unstable_overflows_to_nan_on_large_inputs(dtype):
    x = torch.randn(7, 100, device=DEVICE).to(dtype)
    x[3, 17] = 100.0  # exp(100) > fp32 max: the row's sum is inf, and inf / inf = NaN
    out = softmax_unstable(x)
    assert out[3, 17].isnan()
    check(out[[0, 1, 2, 4, 5, 6]], x[[0, 1, 2, 4, 5, 6]])  # the other rows are fine
    check(softmax_fused(x), x)  # and the stable kernel is right on the same input
    big = (torch.randn(7, 100, device=DEVICE) * 1000).to(dtype)
    assert not torch.isfinite(softmax_unstable(big)).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # 0 / 0
@pytest.mark.parametrize("fn", STABLE, ids=lambda f: f.__name__)
def test_very_negative_rows(fn):
    # Every exp(x) underflows to 0 in fp32; softmax is shift-invariant, so nothing changes.
    x = torch.randn(5, 100, device=DEVICE) - 1e4
    check(fn(x), x)
    assert softmax_unstable(x).isnan().all()  # 0 / 0: the other way to break it


@pytest.mark.parametrize("fn", STABLE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("where", [0, 99])  # in the first or the last of two blocks
def test_rows_of_minus_infinity_but_one(fn, dtype, where):
    # As after a causal or padding mask. With 64-element blocks the online kernel meets
    # blocks that are all -inf before (and after) the finite element: its running max is
    # -inf there and must not turn the sum into NaN.
    x = torch.full((3, 100), float("-inf"), device=DEVICE, dtype=dtype)
    x[0, where] = 5.0
    x[1, where] = -60000.0  # far below any other finite value, still in fp16 range
    x[2, where] = 0.0
    expected = torch.zeros_like(x)
    expected[:, where] = 1.0
    assert torch.equal(fn(x), expected)  # exp(0) / 1 = 1 and exp(-inf) = 0, exactly


@pytest.mark.parametrize("fn", STABLE, ids=lambda f: f.__name__)
def test_rows_with_some_masked_entries(fn):
    x = torch.randn(6, 100, device=DEVICE)
    x[torch.rand(6, 100, device=DEVICE) < 0.5] = float("-inf")
    x[:, 50] = 0.3  # at least one finite element per row
    check(fn(x), x)


@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("shape", [(7, 100), (4, 1025), (1, 1)], ids=str)
def test_online_with_a_small_block_equals_fused(block, shape):
    x = torch.randn(shape, device=DEVICE)
    x[:, -1] = 4.0  # a late, larger max forces d to be rescaled (when there are >1 blocks)
    # Same math, different order of additions (and a rescale per block): a few fp32 ulps
    # (measured on CPU: at most 3.5e-7). On a GPU the approximate exp adds a few more.
    rtol = 1e-6 if DEVICE == "cpu" else 1e-5
    torch.testing.assert_close(softmax_online(x, block=block), softmax_fused(x),
                               rtol=rtol, atol=1e-9)


@pytest.mark.parametrize("block", [0, 24, 100])
def test_online_rejects_a_block_that_is_not_a_power_of_two(block):
    with pytest.raises(ValueError, match="power of two"):
        softmax_online(torch.randn(2, 10, device=DEVICE), block=block)


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_empty_input(fn):
    assert fn(torch.randn(0, 5, device=DEVICE)).shape == (0, 5)
    assert fn(torch.randn(3, 0, device=DEVICE)).shape == (3, 0)


def traffic(fn, x):
    """Requested bytes (loads + stores) of all the kernels ``fn`` launches, and the number
    of launches; asserts none of them reads or writes out of bounds or races."""
    with tracing() as tracer:
        fn(x)
    total = 0
    for launch in tracer.launches:
        report = analyze(launch, datasheet.get("H100 SXM"))
        assert not report.out_of_bounds and not report.races, launch.kernel
        total += report.requested
    return total, len(tracer.launches)


@pytest.mark.cpu("traces the interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_bytes_moved_match_the_docstrings(dtype):
    M, N = 5, 300
    x = torch.randn(M, N).to(dtype)
    s = x.element_size()
    # Three passes: x read twice, fp32 exponentials written and read back, y written once,
    # plus the max and sum vectors (written once and read once each).
    assert traffic(lambda t: softmax_naive(t, block=128), x) == (M * N * (3 * s + 8) + 16 * M,
                                                                3)
    assert traffic(softmax_fused, x) == (2 * M * N * s, 1)  # the compulsory traffic
    assert traffic(softmax_unstable, x) == (2 * M * N * s, 1)
    assert traffic(lambda t: softmax_online(t, block=64), x) == (3 * M * N * s, 1)  # x twice


@pytest.mark.gpu
@pytest.mark.parametrize("fn", STABLE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4096, 4096), (8192, 1000), (1823, 781)], ids=str)
def test_on_gpu_at_size(fn, dtype, shape):
    x = torch.randn(shape, device="cuda").to(dtype)
    check(fn(x), x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_on_gpu_online_handles_rows_longer_than_any_block(dtype):
    x = torch.randn(16, 200_003, device="cuda").to(dtype)
    check(softmax_online(x, block=4096), x)
    check(softmax_online((x.float() * 1000).to(dtype)), (x.float() * 1000).to(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_on_gpu_unstable_fails_where_fused_does_not(dtype):
    x = (torch.randn(4096, 4096, device="cuda") * 1000).to(dtype)
    assert not torch.isfinite(softmax_unstable(x)).all()
    out = softmax_fused(x)
    assert torch.isfinite(out).all()
    check(out, x)
