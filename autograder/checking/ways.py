"""Two ways into one exercise: from a blank cell, and scaffolded.

A lab may give an exercise twice: a cell with the signature alone, checked with
``check(..., scratch=True)``, then the scaffolded cell for whoever gets stuck. Both define
the same names, so the scaffolded cell, run after a from-scratch solution passed, would
put its unwritten stubs in place of the learner's working code, and the exercises and
charts after it would run the stubs. The scaffolded cell therefore starts with

    %%scaffold coalescing/vector_add

which runs the cell as it is, unless that exercise passed from scratch in this session:
then it runs nothing and says so. The check under it then finds the function that passed
from scratch and keeps its verdict without running it again (``engine.check``).
"""

from __future__ import annotations

from .engine import solved_from_scratch

MAGIC = "scaffold"


def scaffold(line: str, cell: str) -> None:
    """The ``%%scaffold <problem id>`` cell magic."""
    problem_id = line.strip()
    if problem_id and solved_from_scratch(problem_id):
        print(f"{problem_id} passed from scratch above, so this scaffolded version is not "
              "run: it would replace your code with its blanks. To work through it anyway, "
              "delete this cell's first line and run it.")
        return
    from IPython import get_ipython

    shell = get_ipython()
    # Run it as the cell it is: its source kept where `inspect` finds it (Triton's jit
    # reads a kernel's source), its errors raised in this cell.
    name = shell.compile.cache(cell)
    exec(compile(cell, name, "exec"), shell.user_ns)


def register() -> None:
    """Make ``%%scaffold`` known to the IPython kernel this runs in, if any."""
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: no cells, no magics
        return
    shell = get_ipython()
    if shell is not None:
        shell.register_magic_function(scaffold, magic_kind="cell", magic_name=MAGIC)
