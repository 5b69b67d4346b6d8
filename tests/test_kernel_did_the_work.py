"""The kernel did the work, on every case and for every output: answers computed beside a
kernel (numpy, a thread, a cache of earlier answers) fail, whatever shape the answer has."""

import contextlib
import threading

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from rooflab.autograder import check
from rooflab.autograder.checking import engine
from rooflab.autograder.evidence.live_memory import live
from rooflab.kernels.amp import bf16_round, fused_adamw
from rooflab.kernels.kmeans import _finalize as finalize
from rooflab.kernels.kmeans import assign
from rooflab.kernels.vector_add import vector_add


def grade(problem_id, candidate, seed=1):
    return check(problem_id, candidate, seed=seed, show=False, raise_on_failure=False)


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


def _copy(src, dst):
    """A kernel that copies: the work is done before it, elsewhere."""
    n = src.numel()
    _copy_kernel[(triton.cdiv(n, 256),)](src, dst, n, BLOCK=256)


@triton.jit
def _truncate_kernel(bits_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    bits = tl.load(bits_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, (bits >> 16).to(tl.int16), mask=mask)


def _bf16_in_numpy(x):
    """fp32 to bf16, round to nearest even, NaN kept: the exercise, done by numpy."""
    bits = x.detach().contiguous().numpy().view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(x.numpy())
    rounded[nan] = (bits[nan] >> 16) | 0x40
    return rounded.astype(np.uint16)


def _honest_first(honest, cheat):
    """A candidate whose first call is honest and whose later calls are the cheat's."""
    calls = []

    def candidate(*args):
        calls.append(1)
        return honest(*args) if len(calls) == 1 else cheat(*args)

    return candidate


def _bf16_beside_a_launch(x):
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    # A kernel that reads every input and writes every output, but truncates: wrong on
    # the ties and half the rest. numpy then writes the right answer over it.
    _truncate_kernel[(triton.cdiv(x.numel(), 256),)](x.view(torch.int32), out.view(torch.int16),
                                                     x.numel(), BLOCK=256)
    out.view(torch.int16).numpy()[...] = _bf16_in_numpy(x).reshape(x.shape).view(np.int16)
    return out


def _cached_per_shape():
    cache = {}

    def candidate(x, y):
        if x.shape not in cache:
            cache[x.shape] = vector_add(x, y)
        return cache[x.shape].clone()

    return candidate


@pytest.mark.parametrize("seed", range(20))
def test_every_case_after_the_first_and_every_repeat_of_a_shape_is_checked(seed):
    later = grade("amp/bf16_round", _honest_first(bf16_round, _bf16_beside_a_launch), seed)
    assert later.failed and "not computed by its kernels" in later.message()
    cached = grade("coalescing/vector_add", _cached_per_shape(), seed)
    assert cached.failed
    assert "called again with new values" in cached.causes[0]
    assert "keep an answer, or state, from an earlier call" in cached.causes[0]


def test_the_course_kernels_pass_every_case_run_again():
    for problem_id, kernel in (("amp/bf16_round", bf16_round),
                               ("coalescing/vector_add", vector_add)):
        assert grade(problem_id, kernel).passed


def test_labels_written_by_numpy_after_an_honest_first_call_fail():
    def numpy_labels(x, c):
        labels = torch.empty(x.shape[0], dtype=torch.int64)
        _copy(torch.zeros(x.shape[0], dtype=torch.int64), labels)  # a launch for show
        distances = ((x.numpy()[:, None, :] - c.numpy()[None]) ** 2).sum(-1)
        labels.numpy()[...] = distances.argmin(1)
        return labels

    assert grade("kmeans/assign", assign).passed
    result = grade("kmeans/assign", _honest_first(assign, numpy_labels))
    assert result.failed and "not computed by its kernels" in result.message()


def test_sums_and_counts_from_numpy_beside_a_finalizing_kernel_fail(monkeypatch):
    monkeypatch.setattr(engine, "_maybe_tracing", contextlib.nullcontext)  # as on a GPU

    def numpy_update(x, labels, k):
        sums = torch.zeros(k, x.shape[1], dtype=torch.float32)
        counts = torch.zeros(k, dtype=torch.int64)
        np.add.at(sums.numpy(), labels.numpy(), x.numpy())
        np.add.at(counts.numpy(), labels.numpy(), 1)
        return finalize(sums, counts)  # a kernel divides: both outputs are its stores

    result = grade("kmeans/update", numpy_update)
    assert result.failed and "not computed by its kernels" in result.causes[0]


def test_library_work_in_a_thread_started_during_the_check_is_seen_as_a_library_call():
    def threaded_topk(x, k):
        box = {}
        worker = threading.Thread(target=lambda: box.update(answer=torch.topk(x, k)))
        worker.start()
        worker.join()
        values, indices = box["answer"]
        out_values, out_indices = torch.empty_like(values), torch.empty_like(indices)
        _copy(values, out_values)
        _copy(indices, out_indices)
        return out_values, out_indices

    result = grade("topk/rows", threaded_topk)
    assert result.failed
    assert result.causes[0].startswith("calls the library (aten.topk)"), result.causes


def test_a_thread_of_the_learners_started_before_the_check_fails_it():
    stop = threading.Event()
    worker = threading.Thread(target=lambda: stop.wait(30), name="helper", daemon=True)
    worker.start()
    try:
        result = grade("amp/bf16_round", bf16_round)
    finally:
        stop.set()
        worker.join()
    assert result.failed
    assert "thread 'helper', started before the check" in result.causes[0]
    assert "out of the grader's sight" in result.causes[0]
    assert grade("amp/bf16_round", bf16_round).passed  # once it has ended


def test_an_optimizer_step_done_in_numpy_beside_the_kernels_fails(monkeypatch):
    # Without the interpreter's trace (as on a GPU), the replay alone must catch it.
    monkeypatch.setattr(engine, "_maybe_tracing", contextlib.nullcontext)
    def numpy_step(param, grad, exp_avg, exp_avg_sq, param_bf16, scale, *hyper):
        # The kernels step scratch copies; numpy moves the values in and out of them.
        state = (param, exp_avg, exp_avg_sq, param_bf16)
        scratch = [torch.empty_like(t) for t in state]
        for mine, t in zip(scratch, state, strict=True):
            mine.view(torch.int16).numpy()[...] = t.view(torch.int16).numpy()
        found = fused_adamw(*scratch[:1], grad, *scratch[1:], scale, *hyper)
        for mine, t in zip(scratch, state, strict=True):
            t.view(torch.int16).numpy()[...] = mine.view(torch.int16).numpy()
        return found

    result = grade("amp/fused_adamw", _honest_first(fused_adamw, numpy_step))
    assert result.failed and "not computed by its kernels" in result.message()


def test_live_memory_finds_tensors_bytes_and_autograd_saved_tensors_wherever_they_are():
    before = live("cpu")
    kept = {"chunks": [torch.ones(1000) for _ in range(3)], "blob": bytes(50_000)}
    x = torch.randn(2000, requires_grad=True)
    y = x.exp().sum()  # exp saves its result for backward: held only by the graph
    held = live("cpu") - before
    assert held.bytes >= 3 * 4000 + 50_000 + 2 * 8000
    view = kept["chunks"][0][10:20]  # a view holds nothing more
    assert (live("cpu") - before).bytes == held.bytes
    del kept, x, y, view
    assert (live("cpu") - before).bytes < 1000


def test_an_n_by_k_matrix_written_by_host_copies_fails_the_fused_assignment():
    def materialises(x, c):
        scratch = torch.empty(x.shape[0], c.shape[0])
        scratch.copy_(c[:, 0].expand(x.shape[0], c.shape[0]))  # no kernel wrote it
        return assign(x, c)

    result = grade("kmeans/assign", materialises)
    assert result.failed
    assert "its host code writes a tensor of shape" in result.causes[0]
    assert "n × k matrix of distances" in result.causes[0]


def test_gradscaler_driven_from_a_thread_is_seen_as_gradscaler():
    """A plain-Python exercise: a problem's own watch of torch ops follows the candidate
    into the threads it starts."""
    from mutants import only

    def in_a_thread(work):
        box = {}
        worker = threading.Thread(target=lambda: box.update(out=work()))
        worker.start()
        worker.join()
        return box.get("out")

    class ThreadedScaler:
        def __init__(self, **kwargs):
            self.inner = torch.amp.GradScaler("cpu", **kwargs)

        def scale(self, loss):
            return in_a_thread(lambda: self.inner.scale(loss))

        def step(self, optimizer):
            return in_a_thread(lambda: self.inner.step(optimizer))

        def update(self):
            return in_a_thread(self.inner.update)

        def get_scale(self):
            return self.inner.get_scale()

        @property
        def growth_tracker(self):
            return self.inner._get_growth_tracker()

    result = grade(only("amp/loss_scaler", "a scale near fp32's largest number"), ThreadedScaler)
    assert result.failed and "calls the library (aten._amp_" in result.causes[0], result.causes
