"""The evidence a check gathers about one run of a candidate, and how it weighs it.

* ``guard.py`` and ``poison.py``: poisoned margins around every tensor a kernel touches,
  and poison in memory no kernel has written yet, so that a stray write or an unwritten
  element shows;
* ``recording.py``: which torch ops the candidate called and which kernels it launched,
  and everything that wrote values, in order;
* ``replay.py``: those steps run again on new inputs: did the kernels compute the answer?
* ``compare.py``: an answer against the float64 reference, and what one case found.

The check engine (``checking/``) gathers this evidence for every problem, and a problem
(``problems/``) may use it for its own comparison. It imports the device layer and what a
problem is, nothing above them; the model, beside it, is none of its business.
"""
