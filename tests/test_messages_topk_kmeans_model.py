"""Messages that name a cause only where the evidence shows it: top-k places that no
element filled told apart from positions lost, a compute bound set by idle SMs, and DRAM
traffic above the compulsory bytes explained by what the trace shows."""

import mutants
import pytest
import torch
from mutants import grade, only

from rooflab.autograder.device import datasheet, roofline
from rooflab.autograder.model.trace import tracing
from rooflab.autograder.model.traffic import predict
from rooflab.autograder.problems import topk as problems
from rooflab.kernels.matmul import matmul
from rooflab.kernels.softmax import softmax_naive

H100 = datasheet.get("H100 SXM")

# --- top-k: places no element filled ------------------------------------------------------

BUCKET_ONE_TOO_HIGH = ("bucket = tl.sum((at_or_above >= k).to(tl.int32), 0) - 1",
                       "bucket = tl.sum((at_or_above >= k).to(tl.int32), 0)")
POSITIONS_LOST = ("words = tl.where(mask, pack(float_key(x), cols), 0)",
                  "words = tl.where(mask, pack(float_key(x), cols * 0), 0)")


def test_a_threshold_bucket_off_by_one_is_not_called_a_lost_position(tmp_path):
    # On rows whose top k are all NaN, both bugs answer NaN at index 0 in every place:
    # the empty slot's word reads as a NaN with its sign bit set, a NaN element without.
    off_by_one = mutants.mutant(tmp_path, "topk", BUCKET_ONE_TOO_HIGH, name="bucket_topk")
    result = grade(only("topk/radix", problems.SPECIAL), off_by_one.topk_radix)
    assert not result.passed
    assert "none of the k = 20 places in row 0 holds an element" in result.causes[0]
    assert "fewer than k elements were selected" in result.causes[0]
    assert "the bucket chosen is one above the right one" in result.causes[0]
    assert "carry each element's own position" not in result.causes[0]

    lost = mutants.mutant(tmp_path, "topk", POSITIONS_LOST, name="lost_topk")
    result = grade(only("topk/rows", problems.SPECIAL), lost.topk_rows)
    assert not result.passed
    assert "carry each element's own position" in result.causes[0]


def _empty_slot() -> float:
    """What the packed word 0 reads as: key 0, a NaN with every bit set."""
    return torch.tensor([-1], dtype=torch.int32).view(torch.float32).item()


def test_places_left_empty_say_how_many_were_filled_and_which_are_missing():
    x = torch.tensor([[0.5, float("nan"), 3.0, 2.0, 1.0, -1.0]], dtype=torch.float64)
    k = 4
    reference = problems.Reference(x, k, problems.expected_values(x, k))
    values = torch.tensor([[float("nan"), 3.0, _empty_slot(), _empty_slot()]])
    indices = torch.tensor([[1, 2, 0, 0]])
    why = problems.compare_for(radix=True)(((values, indices), "fp32", {}), reference)
    assert why.startswith("only 2 of the k = 4 places in row 0 hold an element")
    assert "the score at index 0 is 0.5" in why
    assert "The 2 that came are the 2 largest" in why
    assert "Elements of the threshold bucket are missing" in why


def test_a_row_without_nan_says_how_many_places_were_filled():
    x = torch.tensor([[0.5, 4.0, 3.0, 2.0, 1.0, -1.0]], dtype=torch.float64)
    reference = problems.Reference(x, 3, problems.expected_values(x, 3))
    values = torch.tensor([[4.0, _empty_slot(), _empty_slot()]])
    indices = torch.tensor([[1, 0, 0]])
    why = problems.compare_for(radix=True)(((values, indices), "fp32", {}), reference)
    assert "Fewer than k elements came through, 1 of the k = 3" in why


# --- the traffic model: one bound, and re-reads only where the L2 cannot hold the data ----


def _traced(fn, *args, **kwargs) -> list:
    with tracing() as tracer:
        fn(*args, **kwargs)
    return tracer.launches


@pytest.mark.skipif(torch.cuda.is_available(), reason="traces the interpreter")
def test_a_compute_bound_set_by_few_programs_says_how_many_sms_they_use():
    # 4 programs of 32 × 32 tiles: each one's tl.dot FLOPs on its own SM outlast the bytes,
    # though the work itself, at the chip's peak, takes less time than its bytes.
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ceilings = roofline.from_datasheet(H100)
    prediction = predict(_traced(matmul, a, b, block_m=32, block_n=32, block_k=32),
                         2 * 64**3, 3 * 64 * 64 * 4, "fp32", ceilings, H100)
    assert prediction.work_s < prediction.floor_s  # the work is memory-bound
    assert "compute-bound on 4 of 132 SMs (" in prediction.line
    assert prediction.bottleneck.startswith("compute-bound on 4 of 132 SMs:")
    assert "close to what the work requires" not in prediction.bottleneck


@pytest.mark.skipif(torch.cuda.is_available(), reason="traces the interpreter")
def test_data_read_again_by_later_launches_is_not_blamed_on_the_l2():
    x = torch.randn(64, 1024)
    ceilings = roofline.from_datasheet(H100)
    launches = _traced(softmax_naive, x)
    full = predict(launches, 0, 2 * x.numel() * 4, "fp32", ceilings, H100)
    assert full.dram > 1.5 * full.compulsory
    assert "program after program" not in full.bottleneck
    assert "over 3 launches" in full.bottleneck and "x_ptr" in full.bottleneck
    assert "which the 50 MiB L2 could hold" in full.bottleneck
    toy = predict(launches, 0, 2 * x.numel() * 4, "fp32", ceilings, H100, l2_bytes=16 << 10,
                  sm_count=8)
    assert "more than the 16 KiB L2" in toy.bottleneck
    assert "with a 16 KiB L2" in toy.line


@pytest.mark.skipif(torch.cuda.is_available(), reason="traces the interpreter")
def test_data_evicted_within_a_launch_is_named_with_the_l2_that_evicted_it():
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    ceilings = roofline.from_datasheet(H100)
    toy = predict(_traced(matmul, a, b, block_m=32, block_n=32, block_k=32), 2 * 128**3,
                  3 * 128 * 128 * 4, "fp32", ceilings, H100, l2_bytes=4 << 10, sm_count=4)
    assert toy.bottleneck.startswith("re-reads: DRAM traffic is 2.0× the compulsory bytes")
    assert "read again by later programs after the 4 KiB L2 had evicted it" in toy.bottleneck


# --- CUDA C on a CPU: what was checked, and what was not -------------------------------------

@pytest.mark.cpu("what a CPU can say about CUDA C")
def test_cuda_c_on_a_cpu_says_what_was_and_was_not_checked():
    from rooflab.autograder.device import cuda
    from rooflab.kernels.kmeans_cuda import update_cuda

    try:
        cuda.nvrtc_version()
    except cuda.NvrtcMissing:
        pytest.skip("NVRTC is not installed: nothing is compiled here")
    result = grade("kmeans/update_atomic", update_cuda)
    assert result.verdict == "NEEDS A GPU"
    assert "checked here: scatter_add and divide compile" in result.needs_gpu
    assert "Not checked: whether they compute the right answer" in result.needs_gpu
