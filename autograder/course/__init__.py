"""The course's sources: the lab masters in ``book/`` and the solution regions in
``kernels/``.

* ``build.py``: ``rooflab build``, each master into a learner notebook (every solution
  region replaced by its stub) and a solved one; the markers and the stub themselves;
* ``solutions.py``: ``course_solution``, the course's own kernel where this copy of the
  course holds it (a release holds stubs), for the charts that run before an exercise
  is solved;
* ``points.py``: what each exercise is worth, from a master's front matter, carried in
  the lab notebook's metadata for the grader.

It reads files and imports nothing of rooflab's: the grader (release, the cells a
learner may change) and the hints build on it.
"""
