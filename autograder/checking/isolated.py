"""``rooflab check`` with the candidate in a child process: one verdict, whatever it does.

In a notebook, ``check`` runs the learner's code in the learner's own process: that is
what makes it quick to iterate with, and it is a learning tool, not a proof. Code that
calls ``sys.exit``, crashes the interpreter, never returns, or rewrites the grader it
shares a process with could decide that process's fate and say what it likes.

So from the shell the candidate runs in a child Python process, under the same ``check``,
and the parent, which never runs candidate code:

* ends the child at a time limit (a kernel that never returns, on a CPU or on a GPU);
* turns an exit, a crash or a signal into a FAIL that says which, never a silent 0;
* checks every answer again, against its own reference, with its own copy of the
  problem: mutating the problem or patching the comparison inside the child changes
  nothing;
* confines the child in a sandbox (``confine/``): it reads the system, this Python, the
  autograder and the candidate's own folder, writes only to its scratch folder, reaches
  no network but its own loopback, and nothing it starts outlives it. Where bubblewrap
  cannot run, ``rooflab check`` refuses unless told ``--unconfined`` (or
  ``$ROOFLAB_UNCONFINED=1``).

What cannot be seen from outside stays the child's report: which ops and kernels ran,
the traced traffic, the measured time. A candidate that rewrites the grader's own code in
its process could forge those; the answers it cannot. So the verdict line is the
parent's (``child_report``): a PASS is worded here from what the parent checked, its
figures formatted from numbers, and the child's report follows it, labelled as the
child's word.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import problems
from ..confine import Sandbox, ScratchWatch, over_words, package_folder, why_unavailable
from ..evidence import grader_calls
from ..problem import Problem, graded_cases
from ..ranks.problem import RanksProblem
from . import answers, child_report, handin
from . import time_limit as limits

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_NEEDS_GPU = 0, 1, 2, 3
STARTED = "started"  # the child writes it first, before it loads any learner code
UNCONFINED_ENV = "ROOFLAB_UNCONFINED"
EXIT_CODES = {"PASS": EXIT_PASS, "FAIL": EXIT_FAIL, "NOT IMPLEMENTED": EXIT_FAIL,
              "NEEDS A GPU": EXIT_NEEDS_GPU}
# Starting Python, importing torch and Triton, and on a GPU measuring the ceilings and
# timing the largest case: time a child needs beyond its cases' own limits.
OVERHEAD_S = 300.0


@dataclass
class Verdict:
    """What ``rooflab check`` prints (``text``, its last line the verdict) and exits with."""

    exit_code: int
    text: str


def check_in_child(problem_id: str, function: str, seed: int | None = None,
                   time_limit: float | None = None, verbose: bool = False,
                   unconfined: bool = False) -> Verdict:
    """Grade ``function`` ("FILE.py:FUNC" or "module:FUNC") on ``problem_id`` in a child
    process, confined unless ``unconfined``, and check its answers again here. Raises
    KeyError for an unknown problem."""
    spec = problems.get(problem_id)
    from .engine import new_seed

    unconfined = unconfined or os.environ.get(UNCONFINED_ENV) == "1"
    if not unconfined and why_unavailable():
        return Verdict(EXIT_USAGE, f"rooflab check: the candidate runs in a sandbox, and "
                                   f"{why_unavailable()}. Install it, or give --unconfined "
                                   "to run the candidate with your rights")
    seed = new_seed() if seed is None else seed
    # The child keeps $ROOFLAB_GRADE_*: graded, it runs the hidden cases too, as a notebook would.
    graded = handin.active()
    # Unless one is given, each problem keeps its own limit (a ring's is shorter).
    limit = _limit_of(spec, time_limit)
    with tempfile.TemporaryDirectory(prefix="rooflab-check-") as scratch:
        into = Path(scratch).resolve()  # as the sandbox names it: no link in the way
        target, cwd = function, Path.cwd()
        if not unconfined:
            target, cwd, sandbox = _confined(function, into)
        command = [sys.executable, "-m", "rooflab.autograder.checking.isolated", problem_id,
                   target, "--seed", str(seed), "--into", str(into)]
        if time_limit is not None:
            command += ["--time-limit", str(time_limit)]
        if not unconfined:
            command = sandbox.command(command, cwd=cwd)
        # Its own session: a time limit ends the child and anything it started. What it
        # prints comes through here, capped.
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                                 cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        printed = _Relay(child.stdout)
        cases = len(graded_cases(spec, _on_gpu(), seed, graded))
        overall = limit * (cases + 1) + OVERHEAD_S if limit > 0 else None
        with ScratchWatch(into, lambda used: os.killpg(child.pid, signal.SIGKILL),
                          left_out=GRADERS_FILES) as scratch_watch:
            try:
                status = child.wait(timeout=overall)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                printed.finish()
                return Verdict(EXIT_FAIL, f"FAIL {problem_id}: ran past the time limit of "
                                          f"{overall:g} s for the whole check and was stopped: "
                                          f"a kernel or a wait that never ends? (inputs seed "
                                          f"{seed})")
        printed.finish()
        if scratch_watch.over:
            return Verdict(EXIT_FAIL, f"FAIL {problem_id}: {over_words(scratch_watch.over)}")
        report = _read(into / "report.json")
        if report is None and not (into / STARTED).exists():
            return Verdict(EXIT_FAIL, f"FAIL {problem_id}: not checked: the check's process "
                                      f"did not start (exit status {status}; "
                                      f"{'the sandbox' if not unconfined else 'Python'} "
                                      "said why above). This is no fault of the candidate's")
        if report is None:
            if not unconfined and status > 128:  # bubblewrap reports a signal N as 128 + N
                status = 128 - status
            return Verdict(EXIT_FAIL, f"FAIL {problem_id}: {_ended_without_verdict(status)}")
        if "usage" in report:
            return Verdict(EXIT_USAGE, f"rooflab check: {str(report['usage'])[:500]}")
        # Every line this prints first is the parent's own: the report is the child's word.
        verdict = child_report.verdict_of(report)
        if verdict != "PASS":  # a failure needs its explanation
            shown = report["line"] if verdict == "NEEDS A GPU" and not verbose \
                else report["message"]
            return Verdict(EXIT_CODES[verdict],
                           child_report.fail_text(problem_id, verdict, str(shown)))
        borrowed = grader_calls.cause(report.get("grader_calls"))
        if borrowed:  # in its own report, whatever verdict came with it
            return Verdict(EXIT_FAIL, f"FAIL {problem_id}: {borrowed} (inputs seed {seed})")
        wrong = recheck(spec, into / "outputs.pt", seed, graded=graded)
        if wrong:
            return Verdict(EXIT_FAIL, f"FAIL {problem_id}: {wrong} (checked again outside "
                                      f"the candidate's process; inputs seed {seed})")
        line = child_report.pass_line(problem_id, judged_cases(spec, seed, graded),
                                      report.get("performance"), setting(spec))
        quoted = child_report.quoted(report["message"]) if verbose else ""
        return Verdict(EXIT_PASS, f"{line}\n{quoted}" if quoted else line)


GRADERS_FILES = ("report.json", "report.json.partial", "outputs.pt", STARTED)
PRINTED_CAP = 1 * 2**20  # bytes of the child's output passed on; the rest is counted


class _Relay:
    """Passes what the child prints on to this process's stdout, up to ``PRINTED_CAP``
    bytes, in a thread; past the cap it reads on (so the child never blocks on a full
    pipe) and counts what it drops, and ``finish`` says how much."""

    def __init__(self, pipe):
        self.pipe, self.passed, self.dropped = pipe, 0, 0
        self.thread = threading.Thread(target=self._relay, daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
        for chunk in iter(lambda: self.pipe.read1(65536), b""):
            keep = chunk[:max(PRINTED_CAP - self.passed, 0)]
            self.passed += len(keep)
            self.dropped += len(chunk) - len(keep)
            if keep:
                if out is not None:
                    out.write(keep)
                    out.flush()
                else:  # a captured stdout (pytest's, a notebook's) takes text
                    sys.stdout.write(keep.decode(errors="replace"))

    def finish(self) -> None:
        """Once the child has ended: wait for the pipe to drain (what the child started
        ended with it), then say what was cut."""
        self.thread.join(timeout=10)
        self.pipe.close()
        if self.dropped:
            print(f"[rooflab check: {self.dropped / 2**20:.1f} MB more of the candidate's "
                  f"output was cut: {PRINTED_CAP / 2**20:g} MB is passed on]", flush=True)


def judged_cases(spec: Problem, seed: int, graded: bool) -> int:
    """How many cases ``recheck`` judges here: the graded cases this device runs."""
    from ..device import interpreter_enabled
    from .engine import INTERPRETER_SKIPS

    cases = graded_cases(spec, _on_gpu(), seed, graded)
    return sum(not (interpreter_enabled() and case.dtype in INTERPRETER_SKIPS)
               for case in cases)


def setting(spec: Problem) -> str:
    """Where the grader's process says the check ran, as a result's card does."""
    from ..device import current

    info = current()
    if getattr(spec, "kernel", None) is None:
        return f"{'GPU' if info.is_gpu else 'CPU'}: plain Python, checked for correctness"
    return info.mode


def _limit_of(spec: Problem, given: float | None) -> float:
    """The seconds each case of ``spec`` may take, as the check will apply them."""
    if isinstance(spec, RanksProblem):
        from .rank_check import time_limit

        return time_limit(spec, given)
    return limits.default_s() if given is None else given


def _confined(function: str, into: Path) -> tuple[str, Path, Sandbox]:
    """The candidate as the confined child names it, the folder it runs in, and its
    sandbox: it writes to ``into``; it reads the autograder, the course's kernels as
    installed, and the candidate's own code: its file and the modules and packages beside
    it, or its module (found in the working folder or on $PYTHONPATH, as Python would find
    it), never whole folders of the user's."""
    from ..device.roofline import copy_cache

    readable = [package_folder("rooflab.autograder"), package_folder("rooflab.kernels")]
    env = {"ROOFLAB_CACHE_DIR": str(copy_cache(into / "home" / ".cache" / "rooflab"))}
    path, sep, name = function.rpartition(":")
    if path.endswith(".py"):
        file = Path(path).resolve()
        return f"{file}{sep}{name}", into, Sandbox(into, [*readable, *_code_beside(file)],
                                                   env=env)
    top = path.split(".")[0]
    bases = [Path.cwd(), *(Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p)]
    for base in bases:
        for found in (base / top, base / f"{top}.py"):
            if found.exists():
                env["PYTHONPATH"] = str(base.resolve())
                return function, into, Sandbox(into, [*readable, found.resolve()], env=env)
    return function, into, Sandbox(into, readable, env=env)  # installed: already there


def _code_beside(file: Path) -> list[Path]:
    """A candidate's file, and the Python modules and packages in its folder (which it
    may import), each on its own."""
    beside = [p for p in file.parent.iterdir() if p.suffix == ".py" and p.is_file()
              or p.is_dir() and (p / "__init__.py").is_file()]
    return sorted({file, *(p.resolve() for p in beside)})


def _on_gpu() -> bool:
    from ..device import current

    return current().can_measure


def _read(path: Path) -> dict | None:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(report, dict) and ("usage" in report or {"verdict", "line", "message"}
                                       <= report.keys())
    return report if ok else None


def _ended_without_verdict(status: int) -> str:
    """Why a child left no report, in words."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:  # a signal this Python has no name for
            name = f"signal {-status}"
        return (f"the candidate's process was killed by {name} before a verdict (a crash: a "
                "wild pointer in a kernel, or a broken extension?)")
    return (f"the candidate's process ended with exit status {status} before a verdict: "
            "os._exit or a crash in native code? A kernel must return its answer")


def recheck(spec: Problem, outputs_path: Path, seed: int, graded: bool = True) -> str:
    """Check every case's answer again, here, on the same inputs (same seed): "" if all
    are right, else the first that is not. ``graded`` (a notebook's record, under
    ``rooflab grade``): its hidden cases too, drawn from the same seed, in the check's
    order. A problem on N ranks is judged again from what its ranks returned and
    recorded."""
    from ..device import current, interpreter_enabled
    from ..ranks import RanksProblem
    from .engine import INTERPRETER_SKIPS, CaseRun
    from .rank_check import recheck_ranks

    ranks = isinstance(spec, RanksProblem)
    if not spec.deterministic_reference and not ranks and spec.plausible is None:
        return ""  # its answer depends on the run itself: the child's word only
    try:
        outputs = answers.load(outputs_path)
    except Exception:  # noqa: BLE001 (missing, corrupt or hostile: all the same here)
        return "its answers never reached the grader"
    if ranks:
        return recheck_ranks(spec, outputs, seed)
    info = current()
    dev = torch.device(info.torch_device)
    for index, case in enumerate(graded_cases(spec, info.can_measure, seed, graded)):
        if interpreter_enabled() and case.dtype in INTERPRETER_SKIPS:
            continue
        if index not in outputs:
            return f"no answer for {case.label} reached the grader"
        run = CaseRun(spec, case, torch.Generator(device=dev).manual_seed(seed + index), dev)
        if not spec.deterministic_reference:  # it depends on the run: is it plausible?
            assert spec.plausible is not None
            wrong = spec.plausible(case, run.originals, outputs[index])
            if wrong:
                return f"wrong on {case.label}: {wrong}"
            continue
        answer = run.answer(spec, outputs[index], info.can_measure, dev)
        if not answer.ok:
            return f"wrong on {case.label}: {answer.summary}"
    return ""


# --- the child ----------------------------------------------------------------------------

def _child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rooflab.autograder.checking.isolated")
    parser.add_argument("problem")
    parser.add_argument("function")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--time-limit", type=float, default=None)
    parser.add_argument("--into", type=Path, required=True)
    args = parser.parse_args(argv)
    (args.into / STARTED).touch()

    from .candidate import CandidateError, UsageError, load_function
    from .engine import check

    try:
        function = load_function(args.function)
    except UsageError as error:
        return _write(args.into, {"usage": str(error)})
    except CandidateError as error:
        line = f"FAIL {args.problem}: {error}"
        return _write(args.into, {"verdict": "FAIL", "line": line, "message": line})
    try:
        result = check(args.problem, function, seed=args.seed, show=False,
                       raise_on_failure=False, time_limit=args.time_limit, keep_outputs=True)
    except KeyboardInterrupt:
        line = f"FAIL {args.problem}: interrupted (KeyboardInterrupt) before a verdict"
        return _write(args.into, {"verdict": "FAIL", "line": line, "message": line})
    answers.save(result.outputs, args.into / "outputs.pt")
    return _write(args.into, {"verdict": result.verdict, "line": result.line,
                              "message": result.message(),
                              "grader_calls": result.grader_calls,
                              "performance": handin.performance(result)})


def _write(into: Path, report: dict) -> int:
    """Write the report whole or not at all (a rename is atomic)."""
    partial = into / "report.json.partial"
    partial.write_text(json.dumps(report))
    partial.replace(into / "report.json")
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
