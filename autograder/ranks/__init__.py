"""The multi-rank harness: a learner's function run on N ranks of a process group, for
``check("collectives/...", fn)`` and for a lab's experiments.

On a CPU, and in CI, the ranks are processes on torch.distributed's gloo backend; the
learner's code is plain torch.distributed, so it runs unchanged under ``torchrun`` with
NCCL on a multi-GPU machine. The modules, in the order a check goes through them:

* ``problem.py``: ``RanksProblem``, a problem whose cases name their world size;
* ``transport.py``: the learner's function, pickled by value (it may live in a notebook
  cell, which no other process can import);
* ``launch.py``: from the grader's side, start the launcher, wait, kill its process
  group, read back the runs; the grader never joins a process group itself;
* ``forkserver.py``: a warm process, one per grader, that has imported torch and forks
  each launcher, so that a check does not spend seconds importing it again;
* ``launcher.py``: the one process that imports torch and forks the ranks of each case,
  keeps each case's time limit and reaps every rank;
* ``rank.py``: one rank: join the group, call the function, save its answer;
* ``record.py``: every torch.distributed call a rank makes (count, bytes, peer, order),
  and the one it is blocked in, logged as it happens;
* ``report.py``: a hang or a crash in words, rank by rank;
* ``experiment.py``: ``on_ranks(function, world, *args)`` runs any function on N ranks
  the same way, outside a check: for a lab's experiments, or a script.

The check engine judges the cases (``checking/rank_check.py``); the problems on ranks
(``problems/collectives.py``, ``problems/fsdp.py``) build on ``RanksProblem`` and read the
ranks' records. The harness imports what a case's result is (``evidence/``) and what a
problem is, nothing above them.
"""

from .experiment import on_ranks
from .problem import KIND, RanksProblem

__all__ = ["KIND", "RanksProblem", "on_ranks"]
