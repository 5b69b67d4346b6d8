"""``on_ranks(function, world, *args)``: any function on N ranks, outside a check.

A lab's experiments (how many bytes a naive all-reduce sends on 2 to 5 ranks, what data
parallelism's buckets cost) run the learner's or the course's code exactly as a check
would, through the same launcher, and read back each rank's answer and its record of
torch.distributed calls. A rank that hangs or fails raises here, with what each rank was
doing, in the words a check would use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import report, transport
from .launch import RankRun, run


def on_ranks(function: Callable, world: int | Sequence[int], *args: object,
             limit: float = 60.0, preload: Sequence[str] = ()
             ) -> list[RankRun] | list[list[RankRun]]:
    """``function(*args)`` on every rank of a gloo group of ``world`` processes, for a
    notebook or a script: the ranks' runs, each with ``.output`` (its answer, a tensor)
    and ``.log`` (its torch.distributed calls). With several world sizes, one list of
    runs for each. Raises if a rank does not return within ``limit`` seconds, with what
    each rank was doing. ``args`` are tensors or plain numbers (torch.save'd to the
    ranks). ``preload``: modules to import once before the ranks start, which each rank
    would import for itself (``("torch._dynamo",)`` where the function builds an
    optimizer: torch.optim's first one imports it, seconds a rank)."""
    worlds = [world] if isinstance(world, int) else list(world)
    launched = run(function, [(n, [args] * n) for n in worlds], limit, preload=preload)
    if launched.error:
        raise RuntimeError(f"the ranks could not run {getattr(function, '__name__', '')}: "
                           f"{launched.error}")
    for case in launched.cases:
        if case.ended != "returned":
            files = transport.code_files(function)
            if case.ended == "time limit":
                error, _, details = report.hang(case, files)
            else:
                error, details = report.failure(case, files)
            raise RuntimeError("\n".join([f"on {case.world} ranks: {error}", *details]))
    runs = [case.ranks for case in launched.cases]
    return runs[0] if isinstance(world, int) else runs
