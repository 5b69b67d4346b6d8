"""The top-k ladder (kernels/topk.py) against torch.topk, exactly, on irregular shapes and
the rows where selection goes wrong: NaN of either sign, ±inf, ±0, equal values,
duplicates, sorted rows, narrow ranges, negative rows. Then the key, the sorting networks,
tl.histogram, the streaming object and the memory it holds, and (on a CPU) what the
kernels read and write.

The kernels only load, compare and store, so every dtype is exact in both worlds: fp16
and bf16 are upcast to fp32 on load (exact) and stored back from values that came from
them (exact, even where the interpreter truncates instead of rounding).
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from rooflab.autograder.model.trace import tracing
from rooflab.autograder.problems.topk import expected_values
from rooflab.kernels import topk
from rooflab.kernels.topk import StreamingTopK, topk_radix, topk_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_topk(x: torch.Tensor, k: int, values: torch.Tensor, indices: torch.Tensor):
    """values are torch.topk's (NaN first, ±0 equal), in x's dtype; indices are int64,
    distinct per row, and hold their values."""
    assert values.dtype == x.dtype and indices.dtype == torch.int64
    assert values.shape == indices.shape == (x.shape[0], k)
    want = expected_values(x.double(), k)
    got = values.double()
    same = lambda a, b: (a == b) | (a.isnan() & b.isnan())  # noqa: E731
    assert same(got, want).all(), (got, want)
    assert ((indices >= 0) & (indices < x.shape[1])).all()
    assert (indices.sort(dim=-1).values.diff(dim=-1) > 0).all(), "an element taken twice"
    assert same(x.double().gather(1, indices), got).all()


def rows_of(kind: str, m: int, n: int) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(sum(map(ord, kind)))
    rand = lambda: torch.rand(m, n, generator=generator, device=DEVICE)  # noqa: E731
    x = torch.randn(m, n, generator=generator, device=DEVICE)
    if kind == "equal":
        return torch.full((m, n), -1.5, device=DEVICE)
    if kind == "duplicates":
        return torch.randint(-2, 2, (m, n), generator=generator, device=DEVICE).float()
    if kind == "ascending":
        return x.sort(dim=-1).values
    if kind == "descending":
        return x.sort(dim=-1, descending=True).values
    if kind == "narrow":
        return 1 + rand() * 1e-3
    if kind == "negative":
        return -rand() - 1e-3
    if kind == "minus inf":
        x = torch.full((m, n), float("-inf"), device=DEVICE)
        x[:, n // 2] = 3.0
        return x
    if kind == "signed zeros":
        return torch.where(rand() < 0.5, torch.zeros((), device=DEVICE), -torch.zeros(
            (), device=DEVICE))
    if kind == "nan":
        sign_set = torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32).to(DEVICE)
        x[:, ::7] = sign_set
        x[:, 3::11] = float("nan")
        x[:, 5::13] = float("inf")
        return x
    return x


KINDS = ["equal", "duplicates", "ascending", "descending", "narrow", "negative", "minus inf",
         "signed zeros", "nan"]


def radix_small_buffer(x, k):
    """Radix select with room for k only: every level, and ties cut at the last."""
    return topk_radix(x, k, cap=max(2, triton.next_power_of_2(k)))


def radix_many_programs(x, k):
    return topk_radix(x, k, block=512, split=5)


FUNCTIONS = [topk_rows, topk_radix, radix_small_buffer, radix_many_programs]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 100, 5), (2, 3000, 37), (4, 300, 300)],
                         ids=str)
def test_matches_torch_on_irregular_shapes(fn, dtype, m, n, k):
    x = torch.randn(m, n, device=DEVICE).to(dtype)
    assert_topk(x, k, *fn(x, k))


@pytest.mark.parametrize("fn", [topk_rows, topk_radix, radix_small_buffer],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind", KINDS)
def test_rows_where_selection_goes_wrong(fn, kind):
    x = rows_of(kind, 3, 1500)
    for k in (1, 37, 300):
        assert_topk(x, k, *fn(x, k))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_strided_rows(fn):
    x = torch.randn(3000, 3, device=DEVICE).T  # rows 1 apart, columns 3 apart
    assert not x.is_contiguous()
    assert_topk(x, 20, *fn(x, 20))
    y = torch.randn(6, 4001, device=DEVICE)[::2, 1:]
    assert_topk(y, 33, *fn(y, 33))


@pytest.mark.parametrize("fn", [topk_rows, topk_radix], ids=lambda f: f.__name__)
def test_k_out_of_range_is_refused(fn):
    x = torch.randn(2, 10, device=DEVICE)
    for k in (0, 11):
        with pytest.raises(ValueError, match="k must be between 1 and the row length"):
            fn(x, k)


def test_torch_topk_ranks_every_nan_first_and_the_reference_agrees():
    x = torch.tensor([[1.0, float("inf"), -2.0, 0.0, -0.0, float("-inf"), 5.0]],
                     device=DEVICE).repeat(2, 1)
    x[0, 2] = torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32).item()
    x[1, 3] = float("nan")
    for k in (1, 3, 7):
        want = expected_values(x.double(), k)
        got = torch.topk(x.double(), k).values
        assert ((want == got) | (want.isnan() & got.isnan())).all()
        assert want[:, 0].isnan().all()


# --- the key, the networks, the histogram -------------------------------------------------


@triton.jit
def _keys_kernel(x_ptr, key_ptr, back_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    key = topk.float_key(tl.load(x_ptr + offs, mask=offs < N))
    tl.store(key_ptr + offs, key.to(tl.int64), mask=offs < N)
    tl.store(back_ptr + offs, topk.key_value(key), mask=offs < N)


def test_the_key_orders_every_fp16_value():
    """All 65 536 fp16 bit patterns: the keys sort them as their values sort, every NaN
    (either sign, any payload) gets 2**32 - 1, and key_value gives each value back."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    x = x.to(DEVICE)
    keys = torch.empty(x.numel(), dtype=torch.int64, device=DEVICE)
    back = torch.empty(x.numel(), dtype=torch.float32, device=DEVICE)
    _keys_kernel[(x.numel() // 1024,)](x, keys, back, x.numel(), BLOCK=1024)
    nan = x.isnan()
    assert (keys[nan] == 2**32 - 1).all() and (keys[~nan] < 2**32 - 1).all()
    order = keys[~nan].argsort(stable=True)
    values = x[~nan].double()[order]
    assert (values.diff() >= 0).all()  # ascending keys, ascending values
    assert torch.equal(back[~nan], x[~nan].float())  # -0 stays -0: compared bit for bit
    assert torch.equal(back[~nan].view(torch.int32), x[~nan].float().view(torch.int32))


@triton.jit
def _top_k_kernel(x_ptr, top_ptr, merged_ptr, N: tl.constexpr, K: tl.constexpr):
    words = tl.load(x_ptr + tl.arange(0, N)).to(tl.uint64, bitcast=True)
    top = topk.top_k(words, K)
    tl.store(top_ptr + tl.arange(0, K), top.to(tl.int64, bitcast=True))
    other = tl.load(x_ptr + N + tl.arange(0, K)).to(tl.uint64, bitcast=True)
    merged = topk.merge_top(top, other)
    tl.store(merged_ptr + tl.arange(0, K), merged.to(tl.int64, bitcast=True))


@pytest.mark.parametrize("n,k", [(2, 2), (8, 2), (64, 16), (1024, 64), (1024, 1024)])
def test_the_network_keeps_the_top_k_in_order(n, k):
    # Unsigned 64-bit words, the top bit set on some: compared as unsigned, not signed.
    words = torch.randint(-2**62, 2**62, (n + k,), device=DEVICE) * 2 + 1
    top = torch.empty(k, dtype=torch.int64, device=DEVICE)
    merged = torch.empty(k, dtype=torch.int64, device=DEVICE)
    _top_k_kernel[(1,)](words, top, merged, n, k)
    unsigned = lambda t: t.cpu().numpy().view(np.uint64)  # noqa: E731
    want = np.sort(unsigned(words[:n]))[::-1][:k]
    assert (unsigned(top) == want).all()
    both = np.concatenate([want, unsigned(words[n:])])
    assert (unsigned(merged) == np.sort(both)[::-1][:k]).all()


@triton.jit
def _histogram_kernel(x_ptr, hist_ptr, N, BINS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    digit = tl.load(x_ptr + offs, mask=offs < N, other=0)
    counts = tl.histogram(digit, BINS, mask=(offs < N) & (digit % 3 != 0))
    tl.store(hist_ptr + tl.arange(0, BINS), counts)


def test_tl_histogram_with_a_mask_counts_as_bincount():
    """What the radix kernels rely on: int32 digits in [0, bins), lanes left out by the
    mask (past the end, and here every digit divisible by 3). Run on every Triton the
    course supports (3.6-3.9) to check a new one."""
    digits = torch.randint(0, 256, (3000,), dtype=torch.int32, device=DEVICE)
    hist = torch.empty(256, dtype=torch.int32, device=DEVICE)
    _histogram_kernel[(1,)](digits, hist, 3000, BINS=256, BLOCK=4096)
    kept = digits[digits % 3 != 0].long()
    assert torch.equal(hist.long(), torch.bincount(kept, minlength=256))


@pytest.mark.cpu("runs the GPU's code path (tl.topk) in the interpreter, at small sizes")
def test_the_gpu_code_path_gives_the_same_answers(tmp_path):
    source = Path(topk.__file__).read_text()
    source = source.replace("INTERPRETED = tl.constexpr(interpreter_enabled())",
                            "INTERPRETED = tl.constexpr(False)")
    path = tmp_path / "gpu_path_topk.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    gpu_path = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_path)
    x = rows_of("nan", 3, 100)
    for k in (1, 5, 100):
        assert_topk(x, k, *gpu_path.topk_rows(x, k))
    assert_topk(x, 8, *gpu_path.topk_radix(x, 8, block=64))
    stream = gpu_path.StreamingTopK(6)
    for start in range(0, 100, 30):
        stream.update(x[0, start:start + 30])
    assert_topk(x[:1], 6, *(t[None] for t in stream.result()))


# --- streaming ----------------------------------------------------------------------------


def stream_topk(x, k, chunk, devices=1, cls=StreamingTopK):
    shard = -(-x.numel() // devices)
    streams = []
    for start in range(0, x.numel(), shard):
        stream = cls(k, start)
        for first in range(start, min(x.numel(), start + shard), chunk):
            stream.update(x[first:min(first + chunk, start + shard)])
        streams.append(stream)
    for other in streams[1:]:
        streams[0].merge(other)
    return streams[0].result()


@pytest.mark.parametrize("n,k,chunk,devices", [(10000, 50, 2500, 1), (10000, 50, 3000, 3),
                                               (3000, 300, 256, 1), (500, 500, 100, 2),
                                               (20000, 1, 20000, 1)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_stream_in_chunks_equals_the_top_k_of_the_whole(n, k, chunk, devices, dtype):
    x = torch.randn(n, device=DEVICE).to(dtype)
    values, indices = stream_topk(x, k, chunk, devices)
    assert_topk(x[None], k, values[None], indices[None])


def test_a_stream_of_special_values():
    x = rows_of("nan", 1, 9000)[0]
    values, indices = stream_topk(x, 40, 2000, 2)
    assert_topk(x[None], 40, values[None], indices[None])


def test_a_stream_without_scores_says_so_and_ignores_empty_chunks():
    stream = StreamingTopK(3)
    with pytest.raises(ValueError, match="no scores yet"):
        stream.result()
    stream.update(torch.empty(0, device=DEVICE))
    stream.update(torch.tensor([1.0, 3.0, 2.0, 0.5], device=DEVICE))
    values, indices = stream.result()
    assert values.tolist() == [3.0, 2.0, 1.0] and indices.tolist() == [1, 2, 0]
    with pytest.raises(ValueError):
        StreamingTopK(0)


def test_positions_pass_32_bits_in_a_long_stream():
    stream = StreamingTopK(2, offset=2**33)
    stream.update(torch.tensor([5.0, 7.0], device=DEVICE))
    assert stream.result()[1].tolist() == [2**33 + 1, 2**33]


# --- what the kernels read and write (the interpreter's trace) ----------------------------


def _traced(fn, x, k):
    with tracing() as tracer:
        fn(x, k)
    loads = sum(int(a.active.sum()) * a.element_size for launch in tracer.launches
                for a in launch.accesses if a.kind == "load"
                and x.data_ptr() <= int(a.addresses[a.active].min(initial=2**63))
                < x.data_ptr() + x.nbytes)
    return loads / x.nbytes, len(tracer.launches)


@pytest.mark.cpu("traces the interpreter")
def test_one_program_per_row_reads_the_scores_once():
    assert _traced(topk_rows, torch.randn(4, 5000), 10) == (1.0, 1)


@pytest.mark.cpu("traces the interpreter")
def test_radix_select_reads_random_scores_twice_and_narrow_ones_more():
    x = torch.randn(8, 8192)  # 8 rows: a row per SM of the toy card, a buffer of n / 32
    assert _traced(topk_radix, x, 64) == (2.0, 6)
    narrow = 1 + torch.rand(8, 8192) * 1e-3  # three bytes of the key shared: two levels more
    reads, _ = _traced(topk_radix, narrow, 64)
    assert reads == 4.0
    equal = torch.full((8, 8192), 0.25)  # every level, then the filter
    assert _traced(topk_radix, equal, 64)[0] == 5.0


# --- at size, on a GPU ---------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(256, 262144, 1024), (256, 262144, 256),
                                   (4096, 32768, 64), (8, 131072, 50)], ids=str)
@pytest.mark.parametrize("fn", [topk_rows, topk_radix], ids=lambda f: f.__name__)
def test_on_gpu_at_the_benchmark_shapes(fn, m, n, k):
    x = torch.randn(m, n, device="cuda")
    assert_topk(x, k, *fn(x, k))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_on_gpu_hard_rows_at_size(kind):
    x = rows_of(kind, 64, 65000)
    assert_topk(x, 1000, *topk_radix(x, 1000))
    assert_topk(x, 64, *topk_rows(x, 64))


@pytest.mark.gpu
def test_on_gpu_a_long_stream():
    x = torch.randn(1 << 24, device="cuda")
    values, indices = stream_topk(x, 1024, 1 << 20, devices=4)
    assert_topk(x[None], 1024, values[None], indices[None])
