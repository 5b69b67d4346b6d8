"""``check`` for a problem on N ranks: run the cases in rank processes, then judge.

The engine hands a ``RanksProblem`` here. Each case's inputs are made here, one set per
rank, from the seed; all cases go to the ranks in one launch (``ranks/launch.py``); the answers
and the call records come back, and each case is judged in this process, against the
problem's own reference: nothing the ranks do can change the verdict on their answers.
A case that hangs, or in which a rank raises or dies, is reported here rank by rank
(``ranks/report.py``); one that ends with every rank returning goes to the problem's ``grade``.

That judging runs in the process that called ``check``: under ``rooflab check`` or
``rooflab grade`` the candidate's own, where its module could have replaced ``grade`` or
what it calls. So ``keep_outputs`` keeps, for each case, what every rank returned and its
record of calls (``kept``), and the grader's process judges them again with its own copy
of the problem (``recheck_ranks``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from ..course.build import course_stub_called
from ..evidence.compare import CaseResult
from ..problem import Case
from ..ranks import launch, record, report, transport
from ..ranks.problem import RanksProblem, world_size
from .result import CheckResult
from .time_limit import ENV as TIME_LIMIT_ENV
from .time_limit import default_s

MODE = "CPU: gloo, one process per rank; nothing timed (graded on counts)"


def time_limit(spec: RanksProblem, given: float | None) -> float:
    """check(time_limit=...) if given, else $ROOFLAB_TIME_LIMIT if set, else the problem's."""
    if given is not None:
        return given
    return default_s() if os.environ.get(TIME_LIMIT_ENV) else spec.time_limit_s


def check_ranks(spec: RanksProblem, candidate: Callable, seed: int,
                time_limit_s: float | None = None, keep_outputs: bool = False) -> CheckResult:
    """Grade ``candidate`` on every case of ``spec``; the CheckResult, shown by no one."""
    result = CheckResult(spec.id, MODE, seed)
    limit = time_limit(spec, time_limit_s)
    cases, inputs = case_inputs(spec, seed)
    launched = launch.run(candidate, [(world_size(case), per_rank) for case, per_rank
                                      in zip(cases, inputs, strict=True)], limit,
                          harness=spec.harness, preload=spec.preload)
    if not launched.cases:  # the function could not be sent, or loaded
        result.causes = [launched.error]
        return result
    files = transport.code_files(candidate)
    for index, (case, run) in enumerate(zip(cases, launched.cases, strict=True)):
        if run.ended == "not run":  # the launcher stopped early: a failure, never a pass
            why = launched.error or _why_not_run(launched.cases[:index])
            result.cases.append(CaseResult(case, error=f"not run: {why}"))
            break
        if run.ended == "time limit":
            error, advice, details = report.hang(run, files)
            result.cases.append(CaseResult(case, error=error, advice=advice,
                                           details=details + report.printed(run)))
            break  # every later case would most likely hang too
        if run.ended != "returned":
            raised = [rank for rank in run.ranks if rank.log.raised is not None]
            called = next((name for rank in raised
                           if (name := report.course_stub_reached(rank, files))), "")
            if called:  # every case would reach it again
                result.cases.append(CaseResult(case, error=course_stub_called(called)))
                break
            if raised and all(report.is_stub(rank, files) for rank in raised):
                result.not_implemented = True
                break
            error, details = report.failure(run, files)
            result.cases.append(CaseResult(case, error=error,
                                           details=details + report.printed(run)))
            continue
        outputs = [rank.output for rank in run.ranks]
        assert spec.grade is not None, f"{spec.id}: a RanksProblem needs grade"
        judged = judge(spec, case, inputs[index], outputs, [rank.log for rank in run.ranks])
        if not judged.ok:
            judged.details += report.printed(run)
            judged.advice = report.unwaited(run, files) or judged.advice
        result.cases.append(judged)
        if keep_outputs:
            result.outputs[index] = kept(outputs, [rank.log for rank in run.ranks])
    result.causes = _causes(result)
    return result


def case_inputs(spec: RanksProblem, seed: int) -> tuple[list[Case], list[list[tuple]]]:
    """The cases a check runs, and each one's inputs (a tuple per rank), case i's drawn
    from ``seed + i``. Gloo processes on a CPU in either world: the same cases in both."""
    cases = list(spec.cases(on_gpu=False)) or list(spec.gpu_cases)
    inputs = [spec.make_inputs(case, torch.Generator().manual_seed(seed + index),
                               torch.device("cpu")) for index, case in enumerate(cases)]
    return cases, inputs


def judge(spec: RanksProblem, case: Case, inputs: list[tuple], outputs: list[object],
          logs: list[record.RankLog]) -> CaseResult:
    """The problem's verdict on a case, and the rule every problem on ranks shares: what a
    rank keeps or sends is in its memory or its messages, where the grader counts it, not
    in a file it wrote during the check and read back."""
    assert spec.grade is not None, f"{spec.id}: a RanksProblem needs grade"
    judged = spec.grade(case, inputs, outputs, logs)
    reread = next(((log.rank, path, at) for log in logs for path, at in log.reread), None)
    if judged.ok and reread is not None:
        rank, path, at = reread
        where = f" (at {Path(at[0]).name}:{at[1]})" if at and len(at) >= 2 else ""
        judged.error = (f"rank {rank} read {path}, a file written during this check{where}: "
                        "what a rank keeps, or hands another rank, must stay in its memory "
                        "or go in its messages, where the grader counts it")
    return judged


def kept(outputs: list[object], logs: list[record.RankLog]) -> dict:
    """A case's answer as a grader in another process needs it: what each rank returned
    and each rank's log as it wrote it (``answers.save`` carries both)."""
    return {"outputs": list(outputs), "logs": [log.text for log in logs]}


def recheck_ranks(spec: RanksProblem, saved: object, seed: int) -> str:
    """Judge each case again, here, with this process's ``spec.grade``: on inputs made
    from ``seed``, what ``kept`` saved of its ranks. "" if every case passes, else the
    first that does not, in words."""
    assert spec.grade is not None, f"{spec.id}: a RanksProblem needs grade"
    cases, inputs = case_inputs(spec, seed)
    by_case = saved if isinstance(saved, dict) else {}
    for index, case in enumerate(cases):
        answer = _unpacked(by_case.get(index), world_size(case))
        if answer is None:
            return f"no answer for {case.label} reached the grader"
        outputs, logs = answer
        try:
            judged = judge(spec, case, inputs[index], outputs, logs)
        except Exception as error:  # noqa: BLE001 (what came back is not what ranks return)
            return (f"wrong on {case.label}: the grader could not judge what its ranks "
                    f"returned ({type(error).__name__}: {error})")
        if not judged.ok:
            return f"wrong on {case.label}: {judged.explained}"
    return ""


def _unpacked(answer: object, world: int) -> tuple[list, list[record.RankLog]] | None:
    """Each rank's output and log from what ``kept`` saved; None unless one of each came
    for every rank."""
    if not isinstance(answer, dict):
        return None
    outputs, logs = answer.get("outputs"), answer.get("logs")
    if not (isinstance(outputs, list) and isinstance(logs, list) and
            len(outputs) == len(logs) == world and all(isinstance(t, str) for t in logs)):
        return None
    try:
        return outputs, [record.parse(text, rank) for rank, text in enumerate(logs)]
    except Exception:  # noqa: BLE001 (a line that is JSON but no event of a rank's)
        return None


def _why_not_run(before: list[launch.CaseRun]) -> str:
    """Why the launcher ran no more cases, where it finished. A NotImplementedError raised
    on every rank stops it (``launcher.py``), though raised from a line other than the
    stub's it is reported as the case's failure, not as "not implemented"."""
    if before and before[-1].ranks and all(
            rank.log.raised is not None and rank.log.raised["type"] == "NotImplementedError"
            for rank in before[-1].ranks):
        return "every rank raised NotImplementedError on the case before"
    return "the rank processes stopped before it"


def _causes(result: CheckResult) -> list[str]:
    """Why the candidate fails, most telling first (as the engine words it)."""
    if result.not_implemented:
        return ["not implemented yet: replace `raise NotImplementedError` with your code"]
    failing = [case for case in result.cases if not case.ok]
    if not failing:
        return []
    first = failing[0]
    causes = [f"wrong on {first.label}: {first.explained}"]
    if len(failing) > 1:
        causes.append(f"{len(failing)} of {len(result.cases)} cases fail")
    shown = {first.error, first.advice}
    for case in failing[1:]:
        for text in (case.error, case.advice):
            if text and text not in shown:
                shown.add(text)
                causes.append(f"on {case.label}: {text}")
    return causes
