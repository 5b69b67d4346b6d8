"""collectives/ring_allreduce from a real Jupyter kernel: a ring written in a cell reaches
the rank processes and passes; a deadlocking ring written in a cell is stopped, its card
names each rank's blocked call at its cell and line, and the kernel goes on; an exception
on one rank points at the cell's line."""

from __future__ import annotations

import inspect
import uuid

import pytest
from test_collectives import Watch

from rooflab.kernels import collectives

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

SETUP = """\
import dataclasses
import torch
import torch.distributed as dist
from rooflab.autograder import check, get_problem

spec = get_problem("collectives/ring_allreduce")
four = [case for case in spec.cpu_cases if case.sizes["ranks"] == 4 and not case.note]
small = dataclasses.replace(spec, cpu_cases=four, gpu_cases=four)
"""

DEADLOCK = """\
def my_ring(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = x.view(-1).tensor_split(world)
    for step in range(world - 1):
        incoming = torch.empty_like(chunks[(rank - step - 1) % world])
        dist.send(chunks[(rank - step) % world], (rank + 1) % world)
        dist.recv(incoming, (rank - 1) % world)
        chunks[(rank - step - 1) % world] += incoming
    return x
"""

RAISES = """\
def on_rank_2(x):
    if dist.get_rank() == 2:
        raise ValueError("no chunk for rank 2")
    return ring_allreduce(x)
"""


def _learners_ring() -> str:
    """The course's ring as a learner types it into a cell: source, markers removed."""
    source = inspect.getsource(collectives.ring_allreduce)
    return "\n".join(line for line in source.splitlines() if "SOLUTION" not in line)


def _outputs(cell, kind):
    return [out for out in cell.outputs if out.output_type == kind]


def _html(cell) -> str:
    return "".join(out.data.get("text/html", "") for out in _outputs(cell, "display_data"))


def test_a_ring_from_a_cell_is_graded_and_a_hang_leaves_the_kernel_alive(monkeypatch):
    mark = f"rooflab-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("ROOFLAB_TEST_MARK", mark)  # in the kernel and all it starts
    watch = Watch(mark)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        SETUP,
        _learners_ring(),
        "check(small, ring_allreduce)",
        DEADLOCK,
        "check(small, my_ring, time_limit=2)",
        RAISES,
        "check(small, on_rank_2)",
        'print("still here", 6 * 7)',
    )]
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            allow_errors=True).execute()
    cells = notebook.cells
    for index in (0, 1, 3, 5):
        assert not _outputs(cells[index], "error"), (index, cells[index].outputs)

    passing = cells[2]
    assert not _outputs(passing, "error"), passing.outputs
    assert "PASS" in _html(passing)

    hung = cells[4]
    (error,) = _outputs(hung, "error")
    assert error.ename == "CheckFailed"
    card = _html(hung)
    assert "ran past the time limit of 2 s" in card
    for rank in range(4):  # each rank, at the cell and line where it waits
        assert (f"rank {rank} blocked in send to rank {(rank + 1) % 4} at step 0 (4,096 B) "
                "(at cell In[4], line 6: `dist.send(chunks[(rank - step) % world], "
                "(rank + 1) % world)`)") in card, card

    crashed = cells[6]
    assert _outputs(crashed, "error")
    card = _html(crashed)
    assert "rank 2 raised ValueError: no chunk for rank 2 (at cell In[6], line 3: " \
        "`raise ValueError(&quot;no chunk for rank 2&quot;)`)" in card, card

    assert "still here 42" in _outputs(cells[7], "stream")[0].text
    assert len(watch.pids) > 5 and not watch.left_behind()  # the kernel, launchers, ranks
