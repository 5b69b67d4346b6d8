"""Graded code in a sandbox: what a learner's kernel may see, write, start and reach.

``rooflab grade`` runs each notebook's kernel, and ``rooflab check`` its child, inside
bubblewrap (``bwrap``), the unprivileged sandbox Flatpak is built on. ``sandbox.py``
builds its command line: a file system that holds only the system, this Python and the
grader (read-only) and the graded code's own scratch folder (writable); no network but a
loopback of its own; a pid namespace of its own, so that nothing it starts outlives it.

``quota.py`` caps what it writes into that folder, which bubblewrap does not bound.

It imports nothing of rooflab's: the grader says which folders to add or hide.
"""

from .quota import SCRATCH_CAP, ScratchWatch, over_words
from .sandbox import Sandbox, package_folder, why_unavailable

__all__ = ["SCRATCH_CAP", "Sandbox", "ScratchWatch", "over_words", "package_folder",
           "why_unavailable"]
