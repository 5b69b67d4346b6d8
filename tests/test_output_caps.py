"""A graded notebook's outputs are capped as they arrive, per cell and in all: what is
past a cap never reaches the grader's memory or the learner's feedback notebook, and the
cell, and the gradebook's problems, say how much was cut. A kernel runs the notebook, as
`rooflab grade` runs it (here without the sandbox, which caps nothing of this)."""

import json

import nbformat

from rooflab.autograder.grading import execute

MB = 2**20


def notebook(*sources: str) -> dict:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def printed(cell) -> int:
    return sum(len("".join(o.get("text", ""))) for o in cell["outputs"]
               if o["output_type"] == "stream")


def test_output_past_the_caps_is_cut_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(execute, "OUTPUT_PER_CELL", 1 * MB)
    monkeypatch.setattr(execute, "OUTPUT_PER_NOTEBOOK", 3 * MB // 2)
    line = "x" * 1023
    run = execute.run(notebook(
        f"for _ in range(3000):\n    print({line!r})",  # 3 MB: cut at 1 MB
        "print('small')",
        f"for _ in range(900):\n    print({line!r})",   # within its cap, but not the notebook's
        "raise ValueError('y' * 100_000)",              # an error is kept, its text cut
    ), tmp_path, cell_timeout=120, confine=None)
    executed = json.loads((tmp_path / "executed.ipynb").read_text())
    first, small, third, error = executed["cells"]
    cut = {cell["index"]: cell["output_cut"] for cell in run["cells"]}
    assert 0.9 * MB < printed(first) <= 1.1 * MB
    assert cut[0] > 1.8 * MB
    assert "of this cell's output was cut" in "".join(first["outputs"][-1]["text"])
    assert printed(small) == len("small\n") and cut[1] == 0
    assert cut[2] > 0 and "was cut" in "".join(third["outputs"][-1]["text"])
    assert printed(first) + printed(small) + printed(third) <= 1.6 * MB
    [failure] = [o for o in error["outputs"] if o["output_type"] == "error"]
    assert failure["ename"] == "ValueError" and len(failure["evalue"]) <= 4000
    assert (tmp_path / "executed.ipynb").stat().st_size < 3 * MB


def test_a_cell_within_the_caps_is_kept_whole(tmp_path):
    run = execute.run(notebook("print('a' * 10_000)"), tmp_path, cell_timeout=60,
                      confine=None)
    executed = json.loads((tmp_path / "executed.ipynb").read_text())
    assert printed(executed["cells"][0]) == 10_001 and run["cells"][0]["output_cut"] == 0


# --- rooflab check: what the child prints, and what it writes ---------------------------

PRINTS = '''\
from rooflab.kernels.vector_add import vector_add

def add(x, y):
    print("z" * 1023 * 3000)  # about 3 MB
    return vector_add(x, y)
'''
FILLS = '''\
from rooflab.kernels.vector_add import vector_add

def add(x, y):
    with open("filler.bin", "wb") as out:
        for _ in range(64):
            out.write(b"x" * 2**20)
            out.flush()
    return vector_add(x, y)
'''


def run_check(capfd, tmp_path, source: str) -> tuple[int, str]:
    from rooflab.autograder.cli import main

    candidate = tmp_path / "candidate.py"
    candidate.write_text(source)
    code = main(["check", "coalescing/vector_add", f"{candidate}:add"])
    captured = capfd.readouterr()
    return code, captured.out + captured.err


def test_rooflab_check_passes_on_a_megabyte_of_what_the_child_prints(capfd, tmp_path,
                                                                      monkeypatch):
    from rooflab.autograder.checking import isolated

    monkeypatch.setattr(isolated, "PRINTED_CAP", MB // 2)
    code, out = run_check(capfd, tmp_path, PRINTS)
    lines = out.splitlines()
    assert code == 0, out[-2000:]
    assert len(out) < MB
    assert any("MB more of the candidate's output was cut" in line for line in lines)
    assert lines[-1].startswith("PASS coalescing/vector_add")


def test_rooflab_check_stops_a_child_that_fills_its_scratch(capfd, tmp_path, monkeypatch):
    from rooflab.autograder.confine import quota

    monkeypatch.setattr(quota, "SCRATCH_CAP", 16 * MB)
    code, out = run_check(capfd, tmp_path, FILLS)
    assert code == 1, out[-2000:]
    assert "into its scratch folder, past the cap of 16 MB, and was stopped" in out
    monkeypatch.setattr(quota, "SCRATCH_CAP", 128 * MB)  # within the cap: it passes
    code, out = run_check(capfd, tmp_path, FILLS)
    assert code == 0, out[-2000:]


def test_a_graded_notebook_that_fills_its_folder_is_ended_and_the_rest_graded(
        tmp_path, monkeypatch):
    from rooflab.autograder.confine import quota

    monkeypatch.setattr(quota, "SCRATCH_CAP", 16 * MB)
    fill = ("import time\nwith open('filler.bin', 'wb') as out:\n"
            "    for _ in range(256):\n        out.write(b'x' * 2**20)\n        out.flush()\n"
            "        time.sleep(0.01)\n")
    run = execute.run(notebook("x = 1", fill, "print('after')"), tmp_path,
                      cell_timeout=120, confine=None)
    assert run["crashed"] == [1], run
    executed = json.loads((tmp_path / "executed.ipynb").read_text())
    [error] = executed["cells"][1]["outputs"]
    assert "past the cap of 16 MB" in error["evalue"], error
    assert "".join(executed["cells"][2]["outputs"][0]["text"]) == "after\n"
