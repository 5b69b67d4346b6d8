"""A check: run a candidate on every case of a problem, judge it, and show the card.

* ``engine.py``: ``check(problem, candidate)``, the cases on fresh inputs inside guard
  bands, recorded, compared and replayed, the largest timed on a GPU (or its traffic
  predicted in the interpreter); ``explore``, ``passed`` and ``passing``;
* ``rank_check.py``: the same for a problem on N ranks, through the ``ranks/`` harness;
* ``result.py``: what a check found, as data, one line, a message and a card;
* ``time_limit.py``: a time limit for each case, so that an endless loop fails;
* ``candidate.py`` and ``isolated.py``: ``rooflab check``, the candidate loaded from a
  file and run in a child process, its answers checked again outside it
  (``answers.py``: those answers, in types the grader loads safely);
* ``handin.py``: under ``rooflab grade``, what each check leaves for the grader;
* ``hints.py``: ``hint(problem, level)``, up to the key lines of the course's answer;
* ``trace_report.py``: ``rooflab trace``, a candidate's traffic on its largest CPU case.

It finds problems by id in ``problems/`` and imports every layer under that (the ranks
harness, the evidence, the model, the device, the course's sources); the grader and the
command line build on it.
"""
