"""`rooflab` from the shell: right verdicts, right exit statuses, messages a learner reads."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rooflab.autograder.cli import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, main

BROKEN = Path(__file__).with_name("broken_kernels.py")
ON_GPU = torch.cuda.is_available()


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_check_passes_a_correct_kernel(capsys):
    # The course's own kernel: on a GPU the check also grades its speed.
    code, out = run(capsys, "check", "coalescing/vector_add",
                    "rooflab.kernels.vector_add:vector_add")
    assert code == EXIT_PASS
    assert out.startswith("PASS coalescing/vector_add")


@pytest.mark.parametrize(
    "function, words",
    [
        ("skips_tail", "never written"),
        # Named from the trace on a CPU, from the poisoned margins on a GPU.
        ("writes_out_of_bounds", "past its end" if not ON_GPU else "elements outside"),
        ("leaves_half_unwritten", "elements were never written"),
        ("modifies_input", "modified its input"),
        ("wrong_dtype", "dtype fp32, expected fp16"),
        ("overflows", "NaN/inf values where the reference is finite"),
        ("calls_library", "calls the library (aten.add)"),
        ("not_implemented", "not implemented yet"),
    ],
)
def test_check_fails_each_broken_kernel_with_its_cause(capsys, function, words):
    code, out = run(capsys, "check", "coalescing/vector_add", f"{BROKEN}:{function}")
    assert code == EXIT_FAIL
    assert words in out
    assert "seed" in out  # so the failure can be repeated


def test_check_accepts_module_function(capsys):
    code, out = run(capsys, "check", "matmul/tiled", "rooflab.kernels.matmul:matmul")
    assert code == EXIT_PASS, out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["check", "nope/nothing", f"{BROKEN}:correct"], "unknown problem"),
        (["check", "coalescing/vector_add", "missing.py:f"], "no such file"),
        (["check", "coalescing/vector_add", f"{BROKEN}:absent"], "no function 'absent'"),
        (["check", "coalescing/vector_add", "no_colon"], "FILE.py:FUNCTION"),
        (["check", "coalescing/vector_add", "no.such.module:f"], "no module named"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, words):
    code, out = run(capsys, *argv)
    assert code == EXIT_USAGE
    assert words in out


@pytest.mark.parametrize("source, words", [
    ("def add(x, y:\n    pass\n", "SyntaxError"),
    ("import no_such_module_here\n", "No module named 'no_such_module_here'"),
])
def test_a_learner_file_that_does_not_load_fails_with_its_line(capsys, tmp_path, source, words):
    candidate = tmp_path / "mine.py"
    candidate.write_text(source)
    code, out = run(capsys, "check", "coalescing/vector_add", f"{candidate}:add")
    assert code == EXIT_FAIL
    assert words in out and "line 1" in out


def test_unknown_card_is_a_usage_error(capsys):
    code, out = run(capsys, "roofline", "--card", "Voodoo 2")
    assert code == EXIT_USAGE
    assert "unknown card 'Voodoo 2'" in out and "H100 SXM" in out


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "coalescing/vector_add"])
    assert exit_info.value.code == EXIT_USAGE


def test_list_shows_every_problem_with_its_signature(capsys):
    code, out = run(capsys, "list")
    assert code == EXIT_PASS
    for problem_id in ("coalescing/vector_add", "coalescing/transpose", "matmul/tiled"):
        assert problem_id in out
    assert "(x: Tensor[n], y: Tensor[n]) -> Tensor[n]" in out


def test_doctor_reports_versions_and_mode(capsys):
    code, out = run(capsys, "doctor")
    for name in ("python", "torch", "triton", "numpy", "cupy"):
        assert name in out
    if not ON_GPU:
        assert "CPU (Triton interpreter): nothing timed, performance predicted" in out
    assert code in (EXIT_PASS, EXIT_FAIL)
    assert ("OK: no known-bad combination" in out) == (code == EXIT_PASS)
    from rooflab.autograder.confine import why_unavailable

    assert ("sandbox  bubblewrap" in out) == (not why_unavailable())


@pytest.mark.cpu("what a CPU says instead of measuring")
def test_roofline_on_cpu_says_nothing_was_measured(capsys, tmp_path):
    import json

    code, out = run(capsys, "roofline", "--card", "A100 80GB", "--json", f"{tmp_path}/")
    (target,) = tmp_path.glob("*.json")  # <card>-<date>.json
    assert code == EXIT_PASS
    assert "Nothing measured" in out and "A100 80GB" in out
    record = json.loads(target.read_text())
    assert record["measured"] is None
    assert record["datasheet"]["device"] == "A100 80GB"


def test_console_script_exit_status(tmp_path):
    """The installed `rooflab` command, as a shell or CI would call it."""
    rooflab = Path(sys.executable).with_name("rooflab")
    ok = subprocess.run([rooflab, "check", "coalescing/transpose",
                         "rooflab.kernels.transpose:transpose"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([rooflab, "check", "coalescing/vector_add", f"{BROKEN}:skips_tail"],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "FAIL coalescing/vector_add" in bad.stdout


@pytest.mark.cpu("traces the interpreter")
def test_trace_prints_the_traffic_report_and_a_labelled_prediction(capsys):
    code, out = run(capsys, "trace", "coalescing/transpose",
                    "rooflab.kernels.transpose:transpose_rows")
    assert code == EXIT_PASS
    assert "out_ptr: 49,152 B in 12,288 sectors, 12.5% used" in out
    assert "predicted for H100 SXM, datasheet (not measured)" in out
    assert "uncoalesced" in out


# --- `rooflab roofline` on a GPU: when and how the figures were measured (stand-in GPU) -------


@pytest.fixture
def stand_in_h200(monkeypatch, tmp_path):
    """`rooflab roofline` on a stand-in H200 with ceilings cached in a temporary folder,
    measured 2026-11-26 and raised since by a library matmul."""
    from rooflab.autograder import device
    from rooflab.autograder.device import Device, roofline
    from rooflab.autograder.problem import Cost

    gpu = Device(kind="gpu", name="NVIDIA H200", torch_device="cpu", driver="13.0",
                 l2_bytes=60 << 20)
    monkeypatch.setenv("ROOFLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(device, "current", lambda: gpu)
    monkeypatch.setattr(roofline, "current", lambda: gpu)
    copy = roofline.Measurement("device-to-device copy", 3,
                                {"512 MiB": 4.2e12, "1 GiB": 4.25e12, "2 GiB": 4.24e12}, "1 GiB")
    matmul = roofline.Measurement("torch.matmul", 3,
                                  {"4096³": 690e12, "6144³": 681e12, "8192³": 672e12}, "4096³")
    cached = roofline.Ceilings(gpu.name, "measured", 4.25e12, {"bf16": 690e12}, driver="13.0",
                               measured_at="2026-11-26T14:02:00+00:00",
                               method={"bandwidth": copy, "bf16": matmul}, warmup_s=1.0,
                               measuring_s=11.8)
    cost = Cost(2 * 4096**3, 3 * 4096**2 * 2, "bf16")
    roofline.save(cached, gpu)
    roofline.observe(cost, cost.flops / 714e12, "torch.matmul at 4096x4096x4096 bfloat16",
                     cached, gpu)
    return gpu


def test_roofline_on_a_gpu_says_when_and_how_it_measured(capsys, tmp_path, stand_in_h200):
    import json

    code, out = run(capsys, "roofline", "--json", f"{tmp_path}/")
    assert code == EXIT_PASS
    flat = " ".join(out.split())  # the lines are wrapped for a terminal
    assert "measured 2026-11-26 14:02 UTC, driver 13.0, in 11.8 s" in flat
    assert "after 1 s of matmuls to warm the card up" in flat
    assert "every shape below timed 3 times" in flat and "best median" in flat
    assert "device-to-device copy: 512 MiB 4.2, 1 GiB 4.25, 2 GiB 4.24; best at 1 GiB" in flat
    assert "(72% of the datasheet)" in flat  # bf16, 714 of 989 TFLOP/s
    assert "from 690 TFLOP/s by torch.matmul at 4096x4096x4096 bfloat16" in flat
    assert "cached in" in flat and str(tmp_path / "cache") in flat
    (written,) = tmp_path.glob("*.json")
    record = json.loads(written.read_text())
    assert record["measured"]["method"]["bf16"]["chosen"] == "4096³"
    assert record["measured"]["raised"][0]["workload"].startswith("torch.matmul at 4096")
    assert " ".join(" ".join(line.split()) for line in record["how_measured"]) in flat
    assert record["cache"].startswith(str(tmp_path / "cache"))


def test_roofline_remeasure_on_a_busy_card_says_it_rejected_it(capsys, monkeypatch,
                                                               stand_in_h200):
    from rooflab.autograder.device import roofline

    busy = roofline.Ceilings("NVIDIA H200", "measured", 1.2e12, {"bf16": 700e12},
                             measured_at="2026-11-28T10:00:00+00:00")
    monkeypatch.setattr(roofline, "measure", lambda device=None: busy)
    code, out = run(capsys, "roofline", "--remeasure")
    flat = " ".join(out.split())
    assert code == EXIT_PASS
    assert "measured 1.2 TB/s copy bandwidth, 25% of the H200 datasheet's 4.8 TB/s: is " \
        "another process using the GPU" in flat
    assert "rejected 2026-11-28 10:00 UTC: measured 1.2 TB/s copy bandwidth" in flat
    assert "measured 2026-11-26 14:02 UTC" in flat  # the good figures stay in use


# --- whatever the candidate does, one verdict and its exit code --------------------------------

HOSTILE = {
    "exits": "import sys\ndef add(x, y):\n    sys.exit(0)\n",
    "exits_hard": "import os\ndef add(x, y):\n    os._exit(0)\n",
    "exits_on_import": "import sys\nsys.exit(0)\ndef add(x, y):\n    pass\n",
    "crashes": "import ctypes\ndef add(x, y):\n    ctypes.string_at(0)\n",
    "interrupts": "def add(x, y):\n    raise KeyboardInterrupt\n",
    "bad_str": ("class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError()\n"
                "def add(x, y):\n    raise Odd()\n"),
    "loops": "def add(x, y):\n    while True:\n        pass\n",
    # Right for the grader it patched, wrong for the one it cannot reach.
    "tampers": '''\
import torch, triton, triton.language as tl
from rooflab.autograder import get_problem

get_problem("coalescing/vector_add").reference = lambda x, y: x - y  # the grader, patched

@triton.jit
def sub(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x - y).to(out_ptr.dtype.element_ty), mask=mask)

def add(x, y):
    out = torch.empty_like(x)
    sub[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
    return out
''',
}
WORDS = {
    "exits": "called sys.exit(0)",
    "exits_hard": "ended with exit status 0 before a verdict",
    "exits_on_import": "ended with exit status 0 before a verdict",
    "crashes": "killed by SIGSEGV",
    "interrupts": "interrupted (KeyboardInterrupt)",
    "bad_str": "whose message cannot be shown",
    "loops": "ran past the time limit of 2 s",
    "tampers": "checked again outside the candidate's process",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_candidate_gets_one_verdict_line_and_exit_1(capsys, tmp_path, name):
    candidate = tmp_path / f"{name}.py"
    candidate.write_text(HOSTILE[name])
    # 2 s for the endless loop; the others must not hit a limit on a busy machine.
    limit = "2" if name == "loops" else "60"
    code, out = run(capsys, "check", "coalescing/vector_add", f"{candidate}:add",
                    "--time-limit", limit)
    assert code == EXIT_FAIL, out
    assert out.startswith("FAIL coalescing/vector_add"), out
    assert WORDS[name] in out, out
