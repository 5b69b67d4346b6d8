"""Inside the learner's kernel, while ``rooflab grade`` runs a notebook: what each check
leaves for the grader.

The grader starts the kernel with ``ROOFLAB_GRADE_INTO`` (a folder) and
``ROOFLAB_GRADE_SEED`` in its environment, and puts ``at_cell("<id>")`` at the top of each
check cell. Then every ``check`` writes, into that folder, its verdict, the performance it
saw, and every case's answer, which the grader checks again in its own process
(``grading/verdicts.py``): a check the learner's code patched, skipped or silenced leaves no record,
or answers that are wrong, and either way fails.

What cannot be checked again from outside is the timing. So, when the autograder is
imported (the lab's first cell, before any learner code), this module notes every timer a
measurement depends on and every function of the grader itself; each record says which
of them were replaced since. A replaced timer fails the exercise: a time read from a
patched clock proves nothing.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from pathlib import Path

INTO_ENV, SEED_ENV = "ROOFLAB_GRADE_INTO", "ROOFLAB_GRADE_SEED"

# What a measurement reads, by its dotted path, and the grader's own modules, whose every
# function and class (and their methods) must stay the ones imported.
TIMERS = ["time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.time",
          "time.sleep", "torch.cuda.synchronize", "torch.cuda.Event",
          "torch.cuda.Event.elapsed_time", "torch.cuda.Event.record",
          "torch.cuda.Event.synchronize", "triton.testing.do_bench"]
GRADER_MODULES = ["rooflab.autograder", "rooflab.autograder.checking.engine",
                  "rooflab.autograder.device.timing", "rooflab.autograder.checking.result",
                  "rooflab.autograder.evidence.compare", "rooflab.autograder.problem",
                  "rooflab.autograder.checking.handin", "rooflab.autograder.evidence.recording",
                  "rooflab.autograder.evidence.grader_calls"]

_noted: dict[str, int] = {}  # name -> id() of the object when the autograder was imported
_cell = ""
_count = 0


def active() -> bool:
    return bool(os.environ.get(INTO_ENV))


def seed() -> int | None:
    value = os.environ.get(SEED_ENV, "")
    return int(value) if value.isdigit() else None


def _resolve(path: str) -> object:
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            target = inspect.getattr_static(target, name)
        return target
    raise ImportError(path)


def _watched() -> dict[str, int]:
    """id() of each watched object now, by name."""
    found = {}
    for path in TIMERS:
        try:
            found[path] = id(_resolve(path))
        except (ImportError, AttributeError):
            continue  # no CUDA build, no triton.testing: nothing to replace there
    for module_name in GRADER_MODULES:
        module = importlib.import_module(module_name)
        for name, value in list(vars(module).items()):
            if inspect.isfunction(value) or inspect.isclass(value):
                found[f"{module_name}.{name}"] = id(value)
                if inspect.isclass(value) and value.__module__ == module_name:
                    for attr, member in vars(value).items():
                        if callable(member) or isinstance(member, (property, staticmethod,
                                                                   classmethod)):
                            found[f"{module_name}.{name}.{attr}"] = id(member)
    return found


def start() -> None:
    """Note what the timers and the grader are, before any learner code runs."""
    global _noted
    if active() and not _noted:
        _noted = _watched()


def replaced() -> list[str]:
    """The watched names whose object is no longer the one noted at import."""
    now = _watched()
    return sorted(name for name, ident in _noted.items() if now.get(name) != ident)


def at_cell(cell_id: str) -> None:
    """The check cell about to run (the grader puts this call at the top of each)."""
    global _cell
    _cell = cell_id


def keep(result: object) -> None:
    """Write what ``check`` found, for the grader: ``NNN.json`` and ``NNN-outputs.pt``."""
    global _count
    if not active():
        return
    from . import answers

    into = Path(os.environ[INTO_ENV])
    _count += 1
    stem = into / f"{_count:03d}"
    answers.save(result.outputs, f"{stem}-outputs.pt")
    record = {"cell": _cell, "problem": result.problem_id, "seed": result.seed,
              "verdict": result.verdict, "line": result.line, "message": result.message(),
              "mode": result.mode, "replaced": replaced(),
              "grader_calls": result.grader_calls,
              "performance": performance(result)}
    partial = Path(f"{stem}.json.partial")
    partial.write_text(json.dumps(record))
    partial.replace(f"{stem}.json")


def performance(result: object) -> dict:
    """The figures a gradebook shows: measured on a GPU, predicted on a CPU (labelled)."""
    perf = result.performance
    if perf is None:
        return {}
    figures: dict = {"measured": bool(perf.measured), "line": perf.line}
    if perf.measured:
        figures.update(seconds=perf.seconds, roofline_fraction=perf.fraction,
                       level=perf.level, vs_baseline=perf.vs_baseline,
                       baseline=perf.baseline_name)
    elif perf.prediction is not None and perf.prediction.seconds > 0:
        # The traffic alone as well: at a CPU's small sizes a launch's fixed cost outweighs
        # the rest, and a grade on speed wants what the kernel's accesses decide.
        figures.update(predicted_roofline_fraction=perf.prediction.floor_s
                       / perf.prediction.seconds, predicted_for=perf.prediction.target,
                       predicted_traffic_fraction=perf.prediction.traffic_fraction)
    return figures
