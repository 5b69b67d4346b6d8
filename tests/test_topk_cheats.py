"""Lab 05, what no case tested before: the memory a stream keeps, counted over the whole
process; positions past 2**32; answers as torch.topk returns them; and a library call
named as such, not blamed on the learner's kernels.

The memory a stream keeps does not depend on the scores, only on the sizes: so the
hoarders are graded on one seed, and the measured case's sizes are checked to leave every
hoarder far above the bound.
"""

import collections
import dataclasses
import gc
import pickle
import sys

import mutants
import numpy as np
import pytest
import torch
from mutants import grade, only
from test_topk_grading import StreamThroughRows

from rooflab.autograder import get_problem
from rooflab.autograder.evidence import guard
from rooflab.autograder.problems import topk as problems
from rooflab.kernels import topk

STREAM = get_problem("topk/stream")
MEMORY = only("topk/stream", problems.MEMORY)
PAST_32_BITS = only("topk/stream", problems.PAST_32_BITS)


# --- the memory a stream keeps, wherever it keeps it -------------------------------------

KEPT_HERE: dict = {}  # a module-level dict, a hiding place


class HidesItsChunks(topk.StreamingTopK):
    """A right stream that also keeps every chunk it is given, four times over: in a
    deque, a module-level dict, pickled bytes and a numpy copy; and a one-element view of
    its first chunk (which holds the whole storage it looks into). ``made``: every object
    of the class, in order; ``hidden()``: the bytes one of them hid."""

    made: list = []

    def __init__(self, k, offset=0):
        super().__init__(k, offset)
        self.made.append(self)
        self.queue, self.blob, self.arrays = collections.deque(), b"", ()

    def update(self, chunk):
        super().update(chunk)
        self.queue.append(chunk.clone())
        KEPT_HERE[(id(self), len(KEPT_HERE))] = chunk.clone()
        self.blob += pickle.dumps(chunk.tolist())
        self.arrays = (*self.arrays, chunk.numpy().copy())
        self.view = getattr(self, "view", chunk[:1])

    def hidden(self) -> int:
        tensors = [*self.queue, *(t for key, t in KEPT_HERE.items() if key[0] == id(self))]
        return (sum(t.untyped_storage().nbytes() for t in tensors)
                + self.view.untyped_storage().nbytes() + sys.getsizeof(self.blob)
                + sum(a.nbytes for a in self.arrays))


@pytest.mark.cpu("the chunks are numpy-copied on the host")
def test_a_stream_that_keeps_its_chunks_fails_with_every_byte_it_kept():
    """Every byte hidden, in each place, is counted (and the top k kept beside them),
    and the verdict says how many."""
    HidesItsChunks.made.clear()
    try:
        result = grade(MEMORY, HidesItsChunks)
        (case,) = MEMORY.cpu_cases
        k, devices = case.sizes["k"], case.sizes["devices"]
        measured = HidesItsChunks.made[-devices:]  # the measuring run's objects, made last
        kept = devices * k * (4 + 8) + sum(stream.hidden() for stream in measured)
        assert measured[0].view.untyped_storage().nbytes() > 2 * guard.MARGIN_BYTES
    finally:
        KEPT_HERE.clear()
        HidesItsChunks.made.clear()
    assert not result.passed
    cause = result.causes[0]
    assert f"the stream objects keep {kept:,} bytes alive after their updates" in cause, \
        (kept, cause)
    assert f"more than the {devices * problems.memory_bound(k):,} allowed (2 objects, each " \
           "with 64 bytes per kept result and 4 KiB)" in cause, cause


def test_the_measuring_run_is_graded_too():
    """A stream that keeps less when it is measured must still answer right there."""
    class Reversed(topk.StreamingTopK):
        def result(self):
            values, indices = super().result()
            return values.flip(0), indices.flip(0)

    x = torch.randn(2000)
    held, wrong = problems.held_bytes(Reversed, (x, 4, 500, 2, 0, True, False))
    assert "not in descending order" in wrong and held == 2 * 4 * (4 + 8)
    reference = STREAM.reference(x.double(), 4, 500, 2, 0, True, False)
    answer = topk.StreamingTopK(4)
    answer.update(x)
    notes = {"library": [], "error": "", "again": wrong, "held": held, "allowed": 1 << 20}
    assert STREAM.compare((answer.result(), "fp32", notes), reference) == \
        f"run again on the same chunks (to measure its memory): {wrong}"


def test_the_measured_case_leaves_any_kept_chunk_above_the_bound():
    """What the verdicts rest on, for every measured case in both worlds and whatever the
    scores: one chunk per object is already more than an object may keep, and the
    stream is many times k."""
    for cases in (STREAM.cpu_cases, STREAM.gpu_cases):
        measured = [case for case in cases if case.note == problems.MEMORY]
        assert measured and not any(case.timed for case in measured)
        for case in measured:
            n, k, chunk = case.sizes["n"], case.sizes["k"], case.sizes["chunk"]
            assert chunk * case.dtype.itemsize > problems.memory_bound(k)
            assert n >= 1000 * k and case.sizes["devices"] > 1  # merge() is measured too


def test_a_stream_written_another_way_passes_the_bound_and_positions_past_2_32():
    class AsTorchTopk(StreamThroughRows):  # keeps (values, indices) of k, merges by kernels
        def update(self, chunk):  # each chunk's top k by one program a chunk
            values, indices = topk.topk_rows(chunk[None, :], min(self.k, chunk.numel()))
            self._take(values[0], indices[0], self.offset + self.seen)
            self.seen += chunk.numel()

        def result(self):
            return torch.return_types.topk((self.values, self.indices))

    both = dataclasses.replace(MEMORY, cpu_cases=[*MEMORY.cpu_cases, *PAST_32_BITS.cpu_cases],
                               gpu_cases=[*MEMORY.gpu_cases, *PAST_32_BITS.gpu_cases])
    result = grade(both, AsTorchTopk)  # int64 positions past 2**32, added in a kernel
    assert result.passed, result.message()


# --- positions past 2**32 ------------------------------------------------------------------

THIRTY_TWO_BITS = (
    """    best = merge_top(a_words, b_words)
    slot = (best & 0xFFFFFFFF).to(tl.int32)
    from_a = slot < K_PAD
    index = tl.where(from_a, tl.load(a_indices_ptr + slot, mask=from_a & (slots < K)),
                     tl.load(b_indices_ptr + slot - K_PAD, mask=~from_a & (slots < K))
                     + B_BASE)
""",
    """    a_at = tl.load(a_indices_ptr + slots, mask=slots < NA, other=0)
    b_at = tl.load(b_indices_ptr + slots, mask=slots < NB, other=0) + B_BASE
    a_words = tl.where(slots < NA, pack(float_key(a), a_at.to(tl.uint32)), 0)
    b_words = tl.where(slots < NB, pack(float_key(b), b_at.to(tl.uint32)), 0)
    best = merge_top(a_words, b_words)
    index = (best & 0xFFFFFFFF).to(tl.int64)
""")


@pytest.fixture(scope="module")
def packed_positions(tmp_path_factory):
    """The merge sorting (key, position) words, positions cut to 32 bits."""
    return mutants.mutant(tmp_path_factory.mktemp("topk_32"), "topk", THIRTY_TWO_BITS,
                          name="topk_positions_in_32_bits").StreamingTopK


def test_positions_cut_to_32_bits_fail_where_the_stream_starts_past_2_32(packed_positions):
    result = grade(PAST_32_BITS, packed_positions)
    assert not result.passed
    assert "the position of a top score modulo 2**32" in result.causes[0]
    assert "lost their bits above 32" in result.causes[0]


def test_positions_cut_to_32_bits_are_named_for_20_seeds(packed_positions):
    """The grader's own run of the stream and its comparison, without the rest of a
    check, on one chunk of the case's scores at the case's offset (the offset is what
    matters): the cause is named whatever the scores."""
    (case,) = PAST_32_BITS.cpu_cases
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        x, k, _, _, offset, *flags = STREAM.make_inputs(case, generator, torch.device("cpu"))
        inputs = (x[:300], k, 300, 1, offset, *flags)
        reference = STREAM.reference(x[:300].double(), *inputs[1:])
        wrong = STREAM.compare(problems._run_stream(packed_positions, inputs), reference)
        assert "modulo 2**32" in wrong, (seed, wrong)


def test_a_stream_that_ignores_its_offset_is_not_blamed_on_32_bits():
    class NoOffset(topk.StreamingTopK):  # positions counted from 0 in every shard
        def __init__(self, k, offset=0):
            super().__init__(k)

    result = grade(PAST_32_BITS, NoOffset)
    assert not result.passed
    assert "an index is a position in the stream, from offset 4,294,967,303" in \
        result.causes[0]


def test_a_stream_that_writes_into_its_chunks_fails():
    class Scribbles(topk.StreamingTopK):
        def update(self, chunk):
            super().update(chunk)
            chunk.fill_(0)  # the producer's memory

    result = grade(PAST_32_BITS, Scribbles)
    assert not result.passed
    assert "wrote into the chunk of positions 0 to 299" in result.causes[0], result.causes


# --- answers as torch.topk returns them, and library calls named as such ----------------

def test_an_answer_as_torch_return_types_topk_is_accepted():
    def as_torch_topk(x, k):
        return torch.return_types.topk(topk.topk_rows(x, k))

    result = grade(only("topk/rows", "ragged rows"), as_torch_topk)
    assert result.passed, result.message()


@pytest.mark.parametrize("problem_id, note, library", [
    ("topk/radix", "k = 1", "sort"), ("topk/rows", "ragged rows", "topk")])
def test_a_library_call_beside_a_kernel_is_named_not_blamed_on_the_kernel(problem_id, note,
                                                                          library):
    def beside_a_kernel(x, k):
        topk.topk_rows(x[:, :8], 1)  # a kernel for show, reading a few scores
        if library == "sort":
            values, indices = torch.sort(x, dim=-1, descending=True)
            return values[:, :k], indices[:, :k]
        return torch.topk(x, k)

    result = grade(only(problem_id, note), beside_a_kernel)
    assert not result.passed
    assert all("not written by a kernel" not in cause and "did not read every score" not in
               cause for cause in result.causes), result.causes
    assert f"calls the library (aten.{library})" in result.causes[0]


@pytest.mark.cpu("the trace shows which chunks the kernels read")
def test_a_stream_that_takes_each_chunks_top_k_on_the_host_fails():
    class OnTheHost(topk.StreamingTopK):
        def update(self, chunk):
            scores = chunk.float().numpy()
            order = np.argsort(-scores, kind="stable")[:min(self.k, chunk.numel())]
            values = torch.empty(len(order), dtype=chunk.dtype)
            indices = torch.empty(len(order), dtype=torch.int64)
            values.copy_(torch.from_numpy(scores[order]))
            indices.copy_(torch.from_numpy(order))
            self._absorb(values, indices, self.offset + self.seen)  # the merge: a kernel
            self.seen += chunk.numel()

    result = grade(only("topk/stream", "k = n"), OnTheHost)
    assert not result.passed
    assert "the kernels did not read every score" in result.causes[0]


def test_a_stream_that_freezes_what_it_keeps_out_of_sight_fails():
    """gc.freeze() hides objects from any count of live memory: freezing is the failure."""
    class Freezes(topk.StreamingTopK):
        kept: list = []

        def update(self, chunk):
            Freezes.kept.append(chunk.clone())
            gc.freeze()
            super().update(chunk)

    try:
        held, wrong = problems.held_bytes(Freezes, (torch.randn(2000), 4, 500, 1, 0, True,
                                                    False))
    finally:
        gc.unfreeze()
        Freezes.kept.clear()
    assert "froze" in wrong and "gc.freeze" in wrong, wrong
