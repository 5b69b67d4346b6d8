"""What a learner reads when code on several ranks goes wrong in gloo, or is still a stub.

Each mistake keeps its verdict and gets its cause named from what the ranks recorded, not
gloo's own text: a message whose sender and receiver disagree on its size, an
asynchronous call never waited for, the rank that ended first (its peers' "Connection
reset by peer" is a consequence). The course's stub is NOT IMPLEMENTED wherever it is
raised, and a right sharding passes with a real error figure. Every check runs real gloo
ranks, so each is one case on two ranks, run once for all the asserts on it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from mutants import grade, mutant

from rooflab.autograder import get_problem
from rooflab.autograder.ranks import record, report
from rooflab.autograder.ranks.launch import CaseRun, RankRun
from rooflab.autograder.ranks.problem import world_size
from rooflab.kernels import fsdp

GLOO_TEXT = ("GLHF", "pair.cc", "os._exit")

# The ring's all-gather with the message one element too long on the sending side (at
# N = 2, rank 1 sends chunk 0 and one element of chunk 1): rank 0 posted 2,048 elements.
LONG_SEND = ("        requests = [dist.isend(done, right), dist.irecv(arriving, left)]\n",
             "        start = done.data_ptr() // done.element_size() - flat.data_ptr() // "
             "flat.element_size()\n"
             "        done = flat[start:start + done.numel() + 1]\n"
             "        requests = [dist.isend(done, right), dist.irecv(arriving, left)]\n")
# Prefetch whose handle nobody waits for: the next block's forward uses, then frees, a
# vector the all-gather may still be writing into, and its handle is overwritten later.
UNWAITED = ("            unit.gather()  # a no-op if prefetched\n            unit.wait()\n",
            "            unit.gather()  # a no-op if prefetched\n")
# The stub left in ShardedLayer.reduce_gradients: raised from a method of a class, inside
# a gradient hook, in the middle of backward.
STUB_IN_A_HOOK = ("        flat = torch.cat([p.grad.reshape(-1) for p in self.params])\n",
                  "        raise NotImplementedError()\n")


def two_ranks(problem: str):
    """The problem's first case on two ranks, alone."""
    spec = get_problem(problem)
    case = next(c for c in spec.cpu_cases if world_size(c) == 2)
    return dataclasses.replace(spec, cpu_cases=[case], gpu_cases=[case])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("rank_messages")


def test_a_ring_message_longer_than_its_receive_names_both_sizes(folder):
    broken = mutant(folder, "collectives", LONG_SEND, name="long_send")
    result = grade(two_ranks("collectives/ring_allreduce"), broken.ring_allreduce)
    message = result.message()
    assert result.verdict == "FAIL", message
    assert "rank 0 ended (killed by SIG" in message, message
    assert "rank 1 sent 2,049 elements (8,196 B) to rank 0 in its isend at step 1" in message
    assert "rank 0's matching irecv (its receive at step 1) has room for 2,048 elements " \
           "(8,192 B)" in message, message
    assert not any(text in message for text in GLOO_TEXT), message
    # Whether rank 1 got rank 0's message before rank 0 ended is a race: if it did not,
    # its lost connection is named as what followed.
    if "Connection" in message:
        assert "a consequence of rank 0 ending first, not a cause" in message, message


def test_a_prefetch_never_waited_for_is_named(folder):
    broken = mutant(folder, "fsdp", UNWAITED, name="unwaited")
    result = grade(two_ranks("fsdp/prefetch"), broken.shard_layers)
    message = result.message()
    assert result.verdict == "FAIL", message
    # Where the ranks crash, their records show the all-gathers not waited for; where
    # they do not, the grade's own check of the prefetch says the same.
    assert "never waited for" in message or "had not waited for" in message, message
    assert "all_gather_into_tensor" in message or "all-gather" in message, message
    assert not any(text in message for text in GLOO_TEXT), message


def test_the_stub_in_a_method_run_by_a_hook_is_not_implemented(folder):
    unsolved = mutant(folder, "fsdp", STUB_IN_A_HOOK, name="stub_in_a_hook")
    result = grade(two_ranks("fsdp/zero3"), unsolved.shard_layers)
    assert result.verdict == "NOT IMPLEMENTED", result.message()
    assert result.causes == ["not implemented yet: replace `raise NotImplementedError` "
                             "with your code"]


def test_the_course_prefetch_passes_with_a_real_error_figure():
    result = grade(two_ranks("fsdp/prefetch"), fsdp.shard_layers)
    assert result.verdict == "PASS", result.message()
    [case] = result.cases
    assert case.summary.startswith("rel error ") and "nan" not in case.summary, case.summary


# --- a peer that lost its connection, found before the rank that ended: no processes -----------

def logged(rank: int, *events: dict) -> record.RankLog:
    return record.parse("\n".join(json.dumps(event) for event in events), rank)


def test_a_lost_connection_is_a_consequence_even_when_found_first():
    # On a busy machine the launcher may find rank 1 gone a second after rank 0 raised
    # for want of it: rank 1's end is still the cause.
    receive = {"e": "call", "seq": 0, "op": "recv", "peer": 1, "elements": 4, "bytes": 16,
               "dtype": "float32", "blocking": True, "at": None, "t": 9.0}
    send = dict(receive, op="send", peer=0)
    lost = {"e": "raised", "t": 10.0, "type": "RuntimeError", "frames": [],
            "message": "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                       "[127.0.0.1]:5000: Connection reset by peer. This is typically "
                       "caused by a remote worker hanging or bugs in the application. "
                       "GLHF!"}
    ranks = [RankRun(0, -9, True, logged(0, {"e": "ready"}, receive, lost)),
             RankRun(1, -11, False, logged(1, {"e": "ready"}, send), exited=11.0)]
    error, details = report.failure(CaseRun(2, "a rank failed", 15.0, ranks=ranks), {})
    assert error.startswith("rank 1 ended (killed by SIGSEGV) before returning, in send to "
                            "rank 0 at step 0 (16 B)"), error
    assert details == ['rank 0 then lost its connection, in recv from rank 1 at step 0 '
                       '(16 B) ("Connection reset by peer"): a consequence of rank 1 ending '
                       'first, not a cause'], details


def test_a_wrong_answer_beside_an_unwaited_handle_names_the_handle():
    # The handle's call may not have crashed anything, only left garbage in its tensor
    # (a NaN loss): the wrong answer is then put down to the wait that never came.
    gather = {"e": "call", "seq": 0, "op": "all_gather_into_tensor", "peer": None, "elements": 48,
              "bytes": 192, "dtype": "float32", "blocking": False, "at": None, "t": 9.0}
    ranks = [RankRun(r, 0, False, logged(r, {"e": "ready"}, dict(gather),
                                         {"e": "dropped", "seqs": [0]})) for r in (0, 1)]
    words = report.unwaited(CaseRun(2, "returned", 15.0, ranks=ranks), {})
    assert words.startswith("rank 0 never waited for one of its asynchronous calls"), words
    waited = [RankRun(r, 0, False, logged(r, {"e": "ready"}, dict(gather))) for r in (0, 1)]
    assert report.unwaited(CaseRun(2, "returned", 15.0, ranks=waited), {}) == ""
