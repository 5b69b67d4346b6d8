"""The sandbox graded code runs in (``confine/``): each thing it forbids, tried from inside.

Each test runs a few lines of plain Python in the sandbox and checks, from outside, that
what it tried had no effect: it reads no file of another submission, writes nowhere but its
own folder, reaches no server but its own loopback, keeps no process alive once it ends,
and inherits none of the grader's secrets. Skipped where bubblewrap cannot run."""

import inspect
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cheats
import pytest

from rooflab.autograder.confine import Sandbox, why_unavailable

pytestmark = pytest.mark.skipif(bool(why_unavailable()), reason=f"no sandbox here: "
                                f"{why_unavailable()}")


def confined(tmp_path: Path, code: str, **kwargs) -> subprocess.CompletedProcess:
    box = tmp_path / "box"
    box.mkdir(exist_ok=True)
    command = Sandbox(box, **kwargs).command([sys.executable, "-c", textwrap.dedent(code)])
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.fixture
def other(tmp_path):
    """Another learner's submission, and a gradebook, beside this one's folder."""
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "lab.ipynb").write_text("bob's answers")
    (tmp_path / "out").mkdir()
    return tmp_path


def test_it_cannot_read_another_submission_or_the_home_folder(other):
    # Of the home folder it sees at most the way to this Python (pyenv keeps it there).
    python = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix)}
    private = [entry for entry in Path.home().iterdir()
               if not any(p.is_relative_to(entry) for p in python)]
    done = confined(other, f"""
        import os
        for path in [{str(other / "bob" / "lab.ipynb")!r}, *{[str(p) for p in private]!r}]:
            print(os.path.exists(path), path)
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("False") == 1 + len(private) and "True" not in done.stdout


def test_it_writes_only_into_its_own_folder(other):
    done = confined(other, f"""
        import os, sys
        for path in [{str(other / "out" / "forged.json")!r}, sys.prefix + "/forged",
                     "/usr/forged", "/forged", "/tmp/forged", os.getcwd() + "/mine.txt"]:
            try:
                open(path, "w").write("x")
                print("wrote", path)
            except OSError as error:
                print("refused", path, type(error).__name__)
        """)
    assert done.returncode == 0, done.stderr
    assert not (other / "out" / "forged.json").exists()
    assert not Path(sys.prefix, "forged").exists() and not Path("/tmp/forged").exists()
    for refused in (f"{sys.prefix}/forged", "/usr/forged", "/forged"):
        assert f"refused {refused} " in done.stdout, done.stdout
    assert (other / "box" / "tmp" / "forged").exists()  # its /tmp is in its own folder
    assert (other / "box" / "mine.txt").read_text() == "x"  # its own folder: yes


def test_it_reaches_no_server_but_its_own_loopback(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.settimeout(0.5)
    try:
        done = confined(tmp_path, f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2)
                print("reached the host")
            except OSError as error:
                print("host refused", type(error).__name__)
            own = socket.create_server(("127.0.0.1", 0))
            socket.create_connection(own.getsockname(), timeout=2)
            print("own loopback ok")
            """)
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert "host refused" in done.stdout and "own loopback ok" in done.stdout


def test_nothing_it_starts_outlives_it(tmp_path):
    marker = f"rooflab-sandbox-test-{os.getpid()}-{time.monotonic_ns()}"
    done = confined(tmp_path, f"""
        import os, subprocess, sys
        # A daemon in a session of its own, as a learner's background job would be.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", {marker!r}],
                         start_new_session=True)
        print("started", flush=True)
        """)
    assert done.returncode == 0 and "started" in done.stdout, done.stderr
    time.sleep(0.5)
    alive = [entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit()
             and marker.encode() in _cmdline(entry)]
    assert alive == []


def _cmdline(entry: Path) -> bytes:
    try:
        return (entry / "cmdline").read_bytes()
    except OSError:
        return b""


def test_it_inherits_none_of_the_graders_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("CI_JOB_TOKEN", "secret")
    monkeypatch.setenv("ROOFLAB_TIME_LIMIT", "7")
    done = confined(tmp_path, """
        import os
        print(os.environ.get("CI_JOB_TOKEN"), os.environ.get("ROOFLAB_TIME_LIMIT"))
        """)
    assert done.stdout.split() == ["None", "7"], done.stderr


def test_no_process_inside_holds_a_variable_set_for_the_grader_alone(tmp_path, monkeypatch):
    """bubblewrap is the first process inside: its environment and memory are in view
    (/proc/1/environ, /proc/1/mem), and must not hold the grader's."""
    name, secret = cheats.GRADERS_SECRET
    monkeypatch.setenv(name, secret)
    # The secret reversed: the code is bubblewrap's command line, in view too.
    done = confined(tmp_path, inspect.getsource(cheats.seen_in_proc) + f"""
import json
print(json.dumps(seen_in_proc({secret[::-1]!r}[::-1].encode())))
""")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["holding"] == [], seen
    # It looked: at bubblewrap and itself, and read bubblewrap's memory.
    assert seen["processes"] >= 2 and seen["memory_read"] > 0, seen


def test_a_pinned_folder_cannot_be_replaced_by_a_link(tmp_path):
    (tmp_path / "box" / "records").mkdir(parents=True)
    done = confined(tmp_path, """
        import os, shutil
        for how in (lambda p: shutil.rmtree(p), lambda p: os.rename(p, p + ".old")):
            try:
                how("records")
                print("replaced")
            except OSError as error:
                print("refused", type(error).__name__)
        open("records/001.json", "w").write("{}")
        """, pinned=[tmp_path / "box" / "records"])
    assert done.stdout.split() == ["refused", "OSError", "refused", "OSError"], done
    assert (tmp_path / "box" / "records" / "001.json").exists()  # still its own to write


def test_an_overlay_replaces_a_folder_it_sees(tmp_path):
    real, stand_in = tmp_path / "real", tmp_path / "stand-in"
    for folder, text in ((real, "answer"), (stand_in, "stub")):
        folder.mkdir()
        (folder / "module.py").write_text(text)
    done = confined(tmp_path, f"print(open({str(real / 'module.py')!r}).read())",
                    read_only=[real], overlays={real: stand_in})
    assert done.stdout.strip() == "stub", done.stderr


def test_rooflab_check_runs_where_the_temporary_folder_is_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    candidate = tmp_path / "mine.py"
    candidate.write_text("def cost(n, dtype_bytes):\n    return n, 3 * n * dtype_bytes\n")
    done = subprocess.run([sys.executable, "-m", "rooflab.autograder.cli", "check",
                           "roofline/cost_vector_add", f"{candidate}:cost"], text=True,
                          capture_output=True, timeout=120,
                          env=dict(os.environ, TMPDIR=str(tmp_path / "linked")))
    assert done.returncode == 0, done.stdout + done.stderr


def test_rooflab_check_s_sandbox_holds_none_of_the_graders_environment(tmp_path):
    name, secret = cheats.GRADERS_SECRET
    done = subprocess.run([sys.executable, "-m", "rooflab.autograder.cli", "check",
                           "roofline/cost_vector_add",
                           f"{Path(cheats.__file__)}:cost_if_nothing_leaks"], text=True,
                          capture_output=True, timeout=180, env=dict(os.environ, **{name: secret}))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the secret in: []" in done.stdout and "looked at" in done.stdout, done.stdout


@pytest.mark.gpu
def test_a_gpu_is_seen_inside(tmp_path):
    from rooflab.autograder.confine import package_folder

    done = confined(tmp_path, """
        import torch, triton, triton.language as tl

        @triton.jit
        def double(x_ptr, n, BLOCK: tl.constexpr):  # compiled here: gcc, ptxas, a cache
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)

        x = torch.ones(1 << 20, device="cuda")
        double[(x.numel() // 1024,)](x, x.numel(), BLOCK=1024)
        print(torch.cuda.get_device_name(), float(x.sum()))
        """, read_only=[package_folder("rooflab.autograder")])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == str(float(2 << 20))
