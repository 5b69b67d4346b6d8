"""`make lab` starts JupyterLab: start it headless and fetch its API, as a browser would."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not (ROOT / ".venv" / ".installed").exists(),
                    reason="needs the environment `make test` builds")
def test_make_lab_serves_jupyterlab(tmp_path):
    port, token = _free_port(), "rooflab-test"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.token={token}"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path)}
    lab = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                url = f"http://127.0.0.1:{port}/api/status?token={token}"
                with urllib.request.urlopen(url, timeout=2) as response:
                    status = json.load(response)
                break
            except OSError:
                if lab.poll() is not None or time.monotonic() > deadline:
                    output = lab.stdout.read().decode() if lab.stdout else ""
                    pytest.fail(f"JupyterLab did not answer on port {port}:\n{output[-3000:]}")
                time.sleep(0.5)
        assert "started" in status
        url = f"http://127.0.0.1:{port}/lab?token={token}"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert b"JupyterLab" in response.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}",
                                    timeout=10) as response:
            listing = {item["name"] for item in json.load(response)["content"]}
        assert "README.md" in listing  # served from labs/
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
