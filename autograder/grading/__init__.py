"""The instructor's side of the course: hand it out, then grade what comes back.

* ``release.py``: ``rooflab release OUT/``, the course without its answers.
* ``cells.py``: which cells of a submission are the learner's; every other is put back
  as the lab has it, so a deleted or edited check changes nothing.
* ``execute.py``: one notebook in a fresh kernel, with time limits and a memory cap; a
  crash ends an exercise, not the grading.
* ``verdicts.py``: the grade of each exercise, decided outside the learner's process.
* ``scoring.py``: its points (a correctness part, a speed part scaled by the roofline
  fraction), and a lab's, less any late penalty.
* ``feedback.py``: each learner's folder: their notebook as graded, and their page.
* ``exports.py``: the grades as Canvas and Moodle import them.
* ``gradebook.py``: the gradebook as JSON, CSV, HTML and JUnit XML, written atomically,
  with the exports and feedback pages; shards merged.
* ``shards.py``: a class graded in shares, each from its own learners, and their
  manifests, which a merge checks.
* ``grade.py``: ``rooflab grade SUBMISSIONS… --out DIR``, the whole class, in parallel,
  resumable, in shards.

Inside the learner's kernel, each check leaves its record for the grader
(``checking/handin.py``); ``verdicts.py`` checks its answers again with the ``recheck`` of
``rooflab check`` (``checking/isolated.py``). This package sits on top, beside ``bench/``:
it imports the check engine and everything under it, and nothing imports it but the
command line.
"""
