"""The correctness engine: run a candidate on every case of a problem and judge it.

For each case the engine makes fresh random inputs (inside guard bands), computes the
float64 reference, and runs the candidate while poisoning its allocations and recording
what it calls. It then checks, in order: no write outside any tensor, inputs bit-for-bit
unchanged, an output that is not an input in disguise, and the output itself
(``evidence/compare.py``). On a GPU it finally times the candidate on the largest case, places it
on the measured roofline, and checks the answer again on the timed inputs.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from .. import device as device_layer
from .. import problems
from ..course.build import STUB_RAISE, course_stub, course_stub_called, is_stub_raise
from ..device import cuda, roofline, versions
from ..device.timing import time_gpu
from ..evidence import grader_calls, guard, poison, replay
from ..evidence.compare import CaseResult, Comparison, bits, compare
from ..evidence.recording import Recording, host_writes, recorder
from ..model import matrix_units, traffic
from ..model.trace import tracing
from ..problem import Case, Problem, dtype_name, graded_cases, hidden_count
from . import handin
from .result import CheckResult, Performance
from .time_limit import ENV as TIME_LIMIT_ENV
from .time_limit import TimeLimitExceeded, limited
from .time_limit import default_s as default_time_limit

# Frames from these folders are the grader's or a library's, never the learner's bug.
_NOT_LEARNER = [str(Path(torch.__file__).parent), str(Path(__file__).parents[1])]
try:
    import triton

    _NOT_LEARNER.append(str(Path(triton.__file__).parent))
except ImportError:  # pragma: no cover
    pass

# The interpreter cannot compute in bf16 (it stores bf16 as raw 16-bit integers), so a
# correct kernel that adds or multiplies bf16 values gets garbage there.
INTERPRETER_SKIPS = {torch.bfloat16: "bf16 is graded on a GPU only: Triton's interpreter "
                                     "computes bf16 arithmetic wrongly"}


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") & 0x7FFF_FFFF


def _guard_inputs(inputs: tuple) -> tuple[tuple, list[guard.Guarded]]:
    """Move every tensor input into a guarded buffer, keeping shape and strides."""
    moved, guards = [], []
    for position, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and poison.supports(x.dtype):
            guarded = guard.copy(x, name=f"argument {position}")
            guards.append(guarded)
            moved.append(guarded.view)
        else:
            moved.append(x)
    return tuple(moved), guards


def _modified_inputs(inputs: tuple, originals: tuple) -> list[int]:
    return [
        position
        for position, (now, before) in enumerate(zip(inputs, originals, strict=True))
        if isinstance(now, torch.Tensor) and not torch.equal(bits(now), bits(before))
    ]


def _aliases_an_input(output: object, inputs: tuple) -> int | None:
    if not isinstance(output, torch.Tensor):
        return None
    storage = output.untyped_storage().data_ptr()
    for position, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() == storage:
            return position
    return None


def _learner_frame(error: BaseException) -> str:
    """" (at file:line)" for the innermost frame in the learner's code, if any."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if _is_learners(frame.filename):
            return f" (at {Path(frame.filename).name}:{frame.lineno}, `{frame.line}`)"
    return ""


def _course_stub(error: BaseException) -> str:
    """The name of the course's stub the candidate called (``course.build.course_stub``),
    when that is where its NotImplementedError came from; "" otherwise."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, NotImplementedError) and not _text(seen):
            frames = traceback.extract_tb(seen.__traceback__)
            if frames:
                last = frames[-1]
                return course_stub(last.filename, last.name, last.line or "")
        seen = seen.__cause__ or seen.__context__
    return ""


def _is_stub(error: BaseException) -> bool:
    """The stub's own ``raise NotImplementedError()``, and nothing else: raised directly
    from the learner's code, from inside an interpreted kernel (wrapped in the
    interpreter's error), or quoted by the GPU compiler meeting it in a kernel. Any other
    error that mentions NotImplementedError (Triton's, torch's) is a real error."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, NotImplementedError) and not _text(seen):
            frames = traceback.extract_tb(seen.__traceback__)
            if frames and _is_learners(frames[-1].filename) and \
                    is_stub_raise(frames[-1].line or ""):
                return True
        if "CompilationError" in type(seen).__name__ and _compiler_points_at_stub(_text(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _compiler_points_at_stub(message: str) -> bool:
    """Triton's compile errors quote the kernel's source down to the failing line, then a
    line with a caret under it: is that line the stub's raise?"""
    lines = message.splitlines()
    return any(line.strip() == "^" and lines[i - 1].strip() == STUB_RAISE
               for i, line in enumerate(lines) if i)


def _is_learners(filename: str) -> bool:
    """Whether a frame's file is the learner's: not the grader's, torch's or Triton's, not
    the standard library's or an installed package's (``typing_extensions`` wraps calls
    too), and a real file (``<candidate>`` is the grader's wrapper; code sent to another
    process by cloudpickle is renamed ``<dynamic-code>``, its line no longer the learner's
    line) or a cell of IPython's."""
    if filename.startswith("<"):
        return filename.startswith("<ipython-input")
    return not any(filename.startswith(folder) for folder in _NOT_LEARNER) and \
        not filename.startswith(grader_calls.LIBRARY)


def _text(error: BaseException) -> str:
    """``str(error)``, even for an exception whose ``__str__`` itself raises."""
    try:
        return str(error)
    except BaseException:  # noqa: BLE001 (a hostile __str__ must not crash the grader)
        return f"<{type(error).__name__} whose message cannot be shown: its __str__ raised>"


def _describe_exception(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return (f"called sys.exit({error.code!r}): a kernel returns its answer; it does not end "
                "the process")
    explained = device_layer.explain_launch_error(_text(error))
    if explained:
        return explained
    text = f"raised {type(error).__name__}: {_text(error)}".strip()
    text = text.splitlines()[0] if text else type(error).__name__
    broken = versions.known_problems()
    if broken:  # say so: the learner's code may be fine
        text += f" — note: this environment has a known problem: {broken[0]}"
    return text + _learner_frame(error)


class _Runner:
    """Calls the candidate in the problem's convention: it returns the output, or writes
    into a poisoned output buffer the grader passes last."""

    def __init__(self, spec: Problem, candidate: Callable, dev: torch.device):
        self.spec, self.candidate, self.dev = spec, candidate, dev

    def output_buffer(self, case: Case) -> guard.Guarded | None:
        if not self.spec.output_arg:
            return None
        assert self.spec.out_shape is not None, f"{self.spec.id}: output_arg needs out_shape"
        return guard.empty(self.spec.out_shape(case), self.spec.expected_dtype(case), self.dev,
                           name="the output buffer")

    def __call__(self, inputs: tuple, out: guard.Guarded | None) -> object:
        if self.spec.invoke is not None:
            with torch.enable_grad():  # a backward exercise, even inside torch.no_grad()
                return self.spec.invoke(self.candidate, inputs)
        if out is None:
            return self.candidate(*inputs)
        self.candidate(*inputs, out.view)
        return out.view


class CaseRun:
    """Everything about one run of the candidate on one case."""

    def __init__(self, spec: Problem, case: Case, generator: torch.Generator,
                 dev: torch.device):
        self.case = case
        self.originals = spec.make_inputs(case, generator, dev)
        self.inputs, self.guards = _guard_inputs(self.originals)

    def reference(self, spec: Problem) -> torch.Tensor:
        as_float64 = (x.to(torch.float64) if isinstance(x, torch.Tensor)
                      and x.is_floating_point() else x for x in self.originals)
        with torch.enable_grad():  # a reference may differentiate (a backward exercise)
            return spec.reference(*as_float64)

    def judge(self, spec: Problem, output: object, allocations: list[guard.Guarded],
              on_gpu: bool, dev: torch.device) -> CaseResult:

        for guarded in [*self.guards, *allocations]:
            hit = guarded.margins_hit()
            if hit:
                return CaseResult(self.case, error=(
                    f"wrote {hit} elements outside {guarded.name}: an access without a mask, "
                    "or an offset past the end"))
        changed = _modified_inputs(self.inputs, self.originals)
        if changed:
            names = ", ".join(f"argument {i}" for i in changed)
            return CaseResult(self.case, error=f"modified its input ({names}); inputs must be "
                                               "read-only")
        alias = _aliases_an_input(output, self.inputs)
        if alias is not None and not spec.output_arg:
            return CaseResult(self.case, error=f"returned (a view of) argument {alias} instead "
                                               "of a new tensor")
        return self.answer(spec, output, on_gpu, dev)

    def answer(self, spec: Problem, output: object, on_gpu: bool, dev: torch.device
               ) -> CaseResult:
        """Is ``output`` the answer for these inputs? (Only the answer: ``judge`` also
        looks at what the run did to memory.)"""
        if spec.compare is not None:
            cause = spec.compare(output, self.reference(spec))
            return CaseResult(self.case, Comparison(ok=not cause, cause=cause))
        dtype = spec.expected_dtype(self.case)
        reference = self.reference(spec)
        comparison = compare(output, reference, dtype=dtype, device=dev,
                             tolerance=spec.tolerance(dtype, on_gpu),
                             contiguous=spec.out_contiguous)
        if not comparison.ok and spec.diagnose is not None and isinstance(output, torch.Tensor) \
                and output.shape == reference.shape:
            cause = spec.diagnose(self.inputs, output, reference)
            if cause:
                return CaseResult(self.case, comparison, advice=cause)
        return CaseResult(self.case, comparison)


def check(
    problem_id: str | Problem,
    candidate: Callable,
    *,
    seed: int | None = None,
    measure: bool = True,
    show: bool = True,
    raise_on_failure: bool = True,
    target: str | None = None,
    time_limit: float | None = None,
    keep_outputs: bool = False,
    scratch: bool = False,
) -> CheckResult:
    """Grade ``candidate`` on the problem ``problem_id`` ("<lab>/<exercise>").

    Runs every case for this device (small ones on a CPU, chip-filling ones on a GPU),
    on fresh random inputs; ``seed`` repeats a previous run's inputs. Under ``rooflab
    grade``, the problem's hidden cases too, their sizes drawn from the grader's seed
    (``problem.Hidden``); elsewhere the card only says how many there are. On a GPU, and if
    ``measure``, also times the largest case and grades its roofline fraction.

    In Triton's interpreter (no GPU), every launch is traced: an out-of-bounds access or
    a race fails the case, and the largest case's memory traffic predicts where the
    kernel would land on ``target`` (a card from the datasheet table, or a ceilings JSON
    measured on a GPU; default $ROOFLAB_TARGET or the H100 SXM datasheet).

    Each case may run for ``time_limit`` seconds (default $ROOFLAB_TIME_LIMIT, else 120;
    a problem on N ranks has its own default): an endless loop fails the check, naming
    the case, instead of hanging it.
    ``keep_outputs`` keeps a copy of each case's answer in ``result.outputs`` (by case
    index), for a grader in another process to check again (``isolated.py``).

    ``scratch`` marks the from-scratch way into an exercise that also has a scaffolded
    one: not written yet, it stops nothing (the scaffolded cell below is the other way);
    and a scaffolded cell left unwritten after the same exercise passed from scratch
    stops nothing either.

    Shows the result (HTML in Jupyter, one line elsewhere) and returns a CheckResult.
    Raises AssertionError, with the cause in the message, if the candidate fails.
    """
    spec = problems.get(problem_id) if isinstance(problem_id, str) else problem_id
    earlier = None if scratch else _passed_from_scratch.get(spec.id)
    if earlier is not None and _passing.get(spec.id) is candidate:
        # The scaffolded cell was skipped (``%%scaffold``): the names are still the ones
        # that passed from scratch, and their verdict stands without a second run. It is
        # shown, not handed in: the grader counts the from-scratch cell's own record.
        again = copy.copy(earlier)
        again.skipped = [*earlier.skipped, "every case: this is the function that passed "
                         "from scratch above, not run again"]
        if show:
            again.show()
        return again
    info = device_layer.current()
    dev = torch.device(info.torch_device)
    graded = handin.active()
    if graded:  # under `rooflab grade`: its seed, its hidden cases, answers to recheck
        seed = handin.seed() if seed is None else seed
        keep_outputs = True
    seed = new_seed() if seed is None else seed
    if spec.kernel == "ranks":  # N processes in a process group: ranks/ runs and judges them
        from .rank_check import check_ranks

        return _finish(spec, check_ranks(spec, candidate, seed, time_limit, keep_outputs),
                       show, raise_on_failure, candidate, scratch)
    result = CheckResult(spec.id, info.mode, seed, kernel=spec.kernel)
    # A plain-Python exercise has no kernel to watch: its calls into the grader are.
    watched = spec.kernel is None
    run = _Runner(spec, grader_calls.as_learner(candidate) if watched else candidate, dev)
    if watched:
        result.grader_calls += grader_calls.inherited(candidate)
    else:  # a thread of the learner's, started earlier, could do a kernel's work unseen
        result.grader_calls += grader_calls.threads_of_its_own(pools=False)
    recording = Recording()
    # Chip-filling cases and TF32 tolerances only where kernels really run on the GPU.
    on_gpu = info.can_measure
    traced: tuple[Case, list] | None = None  # the largest case's launches, in the interpreter
    tile_findings: dict[str, list[str]] = {}  # tensor-core and fit rules -> the cases
    limit = default_time_limit() if time_limit is None else time_limit
    if spec.kernel == "cupy" and (not on_gpu or cuda.cupy_missing() or _stubbed(candidate)):
        return _finish(spec, _compile_only(candidate, result), show, raise_on_failure,
                       candidate, scratch)

    runs = _runs(spec, on_gpu, seed, graded)
    estimate = _Estimate(spec, runs, show and device_layer.interpreter_enabled())
    for index, case, again in runs:
        if device_layer.interpreter_enabled() and case.dtype in INTERPRETER_SKIPS:
            result.skipped.append(f"{case.label}: {INTERPRETER_SKIPS[case.dtype]}")
            continue
        estimate.case_begins()
        generator = torch.Generator(device=dev).manual_seed(seed + index)
        attempt = CaseRun(spec, case, generator, dev)
        out = run.output_buffer(case)
        tracer = watch = None
        try:
            with limited(limit), recorder(recording), warnings.catch_warnings(), \
                    _maybe_tracing() as tracer, _maybe_watching(watched, attempt) as watch:
                # numpy's overflow warnings from inside the interpreter: the comparison
                # reports what matters (inf where the answer is finite) more clearly.
                warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton")
                output = run(attempt.inputs, out)
        except TimeLimitExceeded as late:  # every later case would most likely hang too
            result.cases.append(CaseResult(case, error=(
                f"{late}: an endless loop, or a wait that never ends? (set the limit with "
                f"check(..., time_limit=seconds) or ${TIME_LIMIT_ENV})")))
            break
        except (Exception, SystemExit) as error:  # the candidate's bug: this case's failure
            called = _course_stub(error)
            if called:  # every case would reach it again
                result.cases.append(CaseResult(case, error=course_stub_called(called)))
                break
            if _is_stub(error):
                result.not_implemented = True
                break
            result.cases.append(CaseResult(case, error=_describe_exception(error)))
            continue
        finally:
            allocations, recording.allocations = recording.allocations, []
            steps, recording.steps = recording.steps, []
            if watch is not None:
                result.grader_calls += [c for c in watch.calls if c not in result.grader_calls]
        if out is not None:
            allocations.append(out)
        launches = tracer.launches if tracer else []
        broken = _memory_violations(launches)
        judged = CaseResult(case, error=broken) if broken else \
            attempt.judge(spec, output, allocations, on_gpu, dev)
        judged.again = again
        if again and not judged.ok and all(c.ok for c in result.cases if c.case == case):
            judged.advice = ("right on the first call with these sizes, wrong on a second "
                             "call with new values: does it keep an answer, or state, from an "
                             "earlier call?")
        if judged.ok and spec.host_check is not None:
            judged.error = spec.host_check(case, attempt.inputs, host_writes(steps))
        if judged.ok and launches and spec.trace_check is not None:
            # Right answer; does the traced work match what the exercise is about?
            judged.error = spec.trace_check(case, attempt.inputs, launches, output)
        result.cases.append(judged)
        if keep_outputs and not again:
            result.outputs[index] = _copy_of(output)
        # Public cases only: the prediction, and the traffic targets graded from it, must
        # be the same whether or not the notebook is graded.
        if launches and not case.hidden and \
                (traced is None or spec.cost(case).bytes >= spec.cost(traced[0]).bytes):
            traced = (case, launches)
        if launches and judged.ok and not again:  # a case run twice is one finding
            for finding in _tile_findings(spec, case, launches):
                tile_findings.setdefault(finding, []).append(case.label)
        if judged.ok and _replayable(spec, output, steps, recording):
            # Last: it overwrites this case's inputs and outputs (a copy is kept above).
            judged.error = _replay(spec, attempt, output, steps, allocations, on_gpu, dev,
                                   seed + 7919 * (index + 1), limit)

    result.library_calls = recording.library_calls(spec.library_ops)
    result.grader_calls += [c for c in recording.grader_calls if c not in result.grader_calls]
    result.triton_launches = dict(recording.triton_launches)
    result.autotuned = dict(recording.autotuned)
    result.cuda_launches = dict(recording.cuda_launches)
    hidden = hidden_count(spec, on_gpu)
    if hidden and not graded and result.cases:
        result.skipped.append(f"{hidden} hidden case{'s' if hidden > 1 else ''}: sizes drawn "
                              "from the grader's seed, run only when the notebook is graded")
    result.causes = _causes(spec, result)
    for finding, labels in tile_findings.items():
        more = f" and {len(labels) - 1} more" if len(labels) > 1 else ""
        result.causes.append(f"{finding} (at {labels[0]}{more})")
    if result.passed and spec.timed:
        result.performance = _performance(spec, run, info, seed, measure, result)
        if traced is not None:
            _predict(spec, traced, target, result)
    return _finish(spec, result, show, raise_on_failure, candidate, scratch)


class CheckFailed(AssertionError):
    """A check that failed. Its message is the whole explanation (for scripts and logs);
    in Jupyter, where the card above already shows it, its traceback is one short line
    instead of the grader's frames (IPython asks ``_render_traceback_``)."""

    def __init__(self, result: CheckResult):
        super().__init__(result.message())
        self.result = result

    def _render_traceback_(self) -> list[str]:
        red, plain = "\x1b[31m", "\x1b[0m"
        cause = self.result.causes[0] if self.result.causes else self.result.verdict
        if len(cause) > 160:
            cause = cause[:157] + "..."
        return [f"{red}{self.result.verdict} {self.result.problem_id}{plain}: {cause} "
                "(the card above says more)"]


def _finish(spec: Problem, result: CheckResult, show: bool, raise_on_failure: bool,
            candidate: Callable, scratch: bool) -> CheckResult:
    other_way = _the_other_way(spec.id, result, scratch)
    if other_way:
        result.causes = [other_way]
    if not other_way or scratch:  # an unwritten blank cell undoes its own earlier pass
        _passing.pop(spec.id, None)
        _passed_from_scratch.pop(spec.id, None)
        if result.passed:
            _passing[spec.id] = candidate
            if scratch:
                _passed_from_scratch[spec.id] = result
    handin.keep(result)
    if show:
        result.show()
    if raise_on_failure and result.failed and not exploring() and not other_way:
        raise CheckFailed(result)
    return result


def _the_other_way(problem_id: str, result: CheckResult, scratch: bool) -> str:
    """Why an unwritten way into an exercise with two ways stops nothing: the words for
    its card, or "" where it counts as any check does."""
    if not result.not_implemented:
        return ""
    if scratch:
        return ("not written yet: write it here from its signature, or take the scaffolded "
                "way below (either one passes this exercise)")
    if problem_id in _passed_from_scratch:
        return ("solved from scratch above: the scaffolded way is there if you want it, "
                "and nothing needs it")
    return ""


_explore = False


def explore(on: bool = True) -> None:
    """Let a failing check show its card without stopping the cells after it, so that
    Run All reaches the end of a lab you have not solved yet, charts and all. The
    verdicts do not change. Never under pytest: a notebook graded with nbval fails at its
    first failing check, explore or not."""
    global _explore
    _explore = on
    if on and not _under_pytest():
        print("Exploring: a failing check shows its card and the run goes on. "
              "explore(False) makes failing checks stop the run again.")


def exploring() -> bool:
    return _explore and not _under_pytest()


def _under_pytest() -> bool:
    # pytest sets this in its own process and in every kernel nbval starts from it.
    return bool(os.environ.get("PYTEST_CURRENT_TEST"))


def _compile_only(candidate: Callable, result: CheckResult) -> CheckResult:
    """CUDA C without a GPU: compile it with NVRTC and say so; it cannot run here, so it
    cannot pass here either (verdict "NEEDS A GPU"), but a compile error fails now."""
    kernels = cuda.kernels_of(candidate)
    if not kernels:
        result.causes.append("no CUDA C found to compile-check: pass a CudaKernel, or a "
                             "function with a `cuda_kernels` attribute listing them")
        return result
    if any(kernel.is_stub for kernel in kernels):
        result.not_implemented = True
        result.causes.append(f"not implemented yet: replace `// {cuda.STUB_MARK}` with your "
                             "CUDA C")
        return result
    try:
        for kernel in kernels:
            errors = kernel.compile_errors()
            if errors:
                result.causes.append(f"{kernel.name} does not compile: {errors[0]}")
                result.causes += errors[1:4]
    except cuda.NvrtcMissing as missing:
        result.needs_gpu = (f"nothing checked here: the CUDA C was neither compiled nor run "
                            f"({missing}); its results are graded on a GPU only")
        return result
    names = " and ".join(kernel.name for kernel in kernels)
    one = len(kernels) == 1
    where = ("; CuPy is not installed: `pip install cupy-cuda12x` (or cupy-cuda13x) to run "
             "the check here" if device_layer.current().can_measure
             else ", which needs a GPU: run this check on one to grade it")
    result.needs_gpu = (f"checked here: {names} compile{'s' if one else ''} (NVRTC "
                        f"{cuda.nvrtc_version()}, {cuda.NVRTC_ARCH}), and no more. Not "
                        f"checked: whether {'it computes' if one else 'they compute'} the "
                        "right answer, on any case, nor how fast; that takes running the "
                        f"CUDA C{where}")
    return result


def _stubbed(candidate: Callable) -> bool:
    return any(kernel.is_stub for kernel in cuda.kernels_of(candidate))


_passing: dict[str, Callable] = {}  # problem id -> what passed its last check
# ... where that check was the from-scratch way: its result
_passed_from_scratch: dict[str, CheckResult] = {}


def solved_from_scratch(problem_id: str) -> bool:
    """Whether ``problem_id`` passed from scratch in this session (and nothing failed it
    since): its scaffolded cell is not needed."""
    return problem_id in _passed_from_scratch


def passed(problem_id: str) -> bool:
    """Whether the last check of ``problem_id`` in this session passed. Lets a notebook
    show a learner's kernel in a plot only once it works, instead of crashing the cell."""
    return problem_id in _passing


def passing(problem_id: str) -> Callable | None:
    """The function that passed the last check of ``problem_id`` in this session, or
    None: a learner's own cell can run the very function that passed, whatever its name
    holds since."""
    return _passing.get(problem_id)


def _causes(spec: Problem, result: CheckResult) -> list[str]:
    """Why the candidate fails, most telling first; empty when it is correct."""
    if result.not_implemented:
        return ["not implemented yet: replace `raise NotImplementedError` with your code"]
    causes = []
    if result.grader_calls:
        causes.append(grader_calls.cause(result.grader_calls))
    launched = {"triton": result.triton_launches, "cupy": result.cuda_launches}.get(
        spec.kernel or "", {})
    kind = "CUDA C kernel (cuda.CudaKernel)" if spec.kernel == "cupy" else "Triton kernel"
    failing = [c for c in result.cases if not c.ok]
    # A library call first: it is what the advice about the kernel's answer follows from.
    if spec.kernel and result.library_calls:
        ops = ", ".join(f"aten.{op}" for op in result.library_calls)
        also = "" if launched else f", and launched no {kind}"
        causes.append(f"calls the library ({ops}){also}: the work of this exercise is the "
                      "kernel's, and its host code may only allocate, view, fill and copy")
    worst = result.worst_case
    if failing and worst is not None:
        causes.append(f"wrong on {worst.label}: {worst.explained}")
        if len(failing) > 1:
            causes.append(f"{len(failing)} of {len(result.cases)} cases fail")
        # Other advice, once each (the table of cases shows only what went wrong).
        shown = {worst.advice}
        for case in failing:
            if case.advice and case.advice not in shown:
                shown.add(case.advice)
                causes.append(f"on {case.label}: {case.advice}")
    if spec.kernel and result.library_calls:
        pass  # said first
    elif spec.kernel and not launched and not failing:
        causes.append(f"launched no {kind}; this exercise asks for one")
    elif spec.structure.autotuned and launched and not result.autotuned and not failing:
        causes.append("launched its kernel with one fixed configuration: this exercise asks "
                      "for @triton.autotune to choose among several for each shape")
    return causes


@contextlib.contextmanager
def _maybe_watching(watched: bool, attempt: CaseRun):
    """Watch a plain-Python candidate's calls into the grader; otherwise do nothing."""
    if not watched:
        yield None
        return
    with grader_calls.watching(grader_calls.allowed_code(attempt.inputs)) as watch:
        yield watch


@contextlib.contextmanager
def _maybe_tracing():
    """Trace memory accesses when kernels run in the interpreter; otherwise do nothing."""
    if not device_layer.interpreter_enabled():
        yield None
        return
    with tracing() as tracer:
        yield tracer


def _memory_violations(launches: list) -> str:
    """The first out-of-bounds access or race of a case's launches, in words."""
    for launch in launches:
        out_of_bounds, races = traffic.violations(launch)
        if out_of_bounds:
            return f"out-of-bounds access in {launch.kernel}: {out_of_bounds[0]}"
        if races:
            return f"in {launch.kernel}, {races[0]}"
    return ""


def _copy_of(output: object) -> object:
    """The answer as it is now, detached from the candidate's memory (which the replay
    and later cases may overwrite)."""
    if isinstance(output, torch.Tensor):
        return output.detach().clone()
    if isinstance(output, (tuple, list)):
        return type(output)(_copy_of(item) for item in output)
    return output


def _runs(spec: Problem, on_gpu: bool, seed: int, graded: bool
          ) -> list[tuple[int, Case, bool]]:
    """(index, case, again) for each run: every case (when ``graded``, the hidden ones
    drawn from ``seed`` too, after the public ones), then, for a kernel exercise, its
    cheapest case once more with new values. A kernel that keeps the answer of an earlier
    call and hands it back for the same sizes is right on every first call; on a CPU,
    where nothing is timed, nothing else would ever call it twice. The indices are those
    ``isolated.recheck`` gives the same list."""
    cases = graded_cases(spec, on_gpu, seed, graded)
    runs = [(index, case, False) for index, case in enumerate(cases)]
    runnable = [case for case in cases if not (device_layer.interpreter_enabled()
                                               and case.dtype in INTERPRETER_SKIPS)]
    if spec.kernel and runnable:
        cheapest = min(runnable, key=lambda case: spec.cost(case).bytes)
        runs.append((len(cases), cheapest, True))
    return runs


LONG_CHECK_S = 60.0  # a check expected to take longer says so once its first case is done


class _Estimate:
    """How long the rest of a check will take in the interpreter, said once, after its
    second case, where that is more than ``LONG_CHECK_S``: a case's time as a fixed cost
    plus a cost per byte it moves, both fitted to the first two. A kernel the interpreter
    runs slowly (``tl.sort`` costs seconds per thousand elements there) should not leave
    the learner waiting in silence."""

    def __init__(self, spec: Problem, runs: list, on: bool):
        self.spec, self.on = spec, on
        self.sizes = [spec.cost(case).bytes for _, case, _ in runs
                      if case.dtype not in INTERPRETER_SKIPS]
        self.times: list[float] = []
        self.last = time.monotonic()
        self.seen_one = False  # a case has begun: the next to begin ends it

    def case_begins(self) -> None:
        """Called as each case that runs begins: the one before it has ended."""
        now = time.monotonic()
        if self.on and len(self.times) < 2 and self.seen_one:
            self.times.append(now - self.last)
            if len(self.times) == 2:
                self._say()
        self.seen_one, self.last = True, now

    def _say(self) -> None:
        (t1, t2), (b1, b2) = self.times, self.sizes[:2]
        per_byte = max((t2 - t1) / (b2 - b1), 0.0) if b2 != b1 else 0.0
        fixed = max(min(t1, t2) - per_byte * min(b1, b2), 0.0)
        rest = sum(fixed + per_byte * size for size in self.sizes[2:])
        if rest > LONG_CHECK_S:
            print(f"{self.spec.id}: its first cases took {t1:.1f} and {t2:.1f} s in "
                  f"Triton's interpreter; the {len(self.sizes) - 2} others should take "
                  f"about {f'{rest:.0f} s' if rest < 120 else f'{rest / 60:.0f} min'} "
                  "more (each stops at its time limit). On a GPU "
                  "the same check takes seconds; in the interpreter, tl.sort and loops over "
                  "single elements cost most", flush=True)


def _replayable(spec: Problem, output: object, steps: list, recording: Recording) -> bool:
    """Kernel exercises whose answer holds tensors (one, several, or state updated in
    place), where the candidate launched kernels in this case and called no library op
    (that is reported already)."""
    return (bool(spec.kernel) and spec.replayed and any(step.launch for step in steps)
            and next(replay.tensors_in(output), None) is not None
            and not recording.library_calls(spec.library_ops))


def _replay(spec: Problem, attempt: CaseRun, output: object, steps: list,
            allocations: list[guard.Guarded], on_gpu: bool, dev: torch.device, seed: int,
            limit: float) -> str:
    """Run the case's recorded steps again on new inputs (see evidence/replay.py): "" if the output
    follows, else why the answer cannot have come from the kernels."""
    fresh = CaseRun(spec, attempt.case, torch.Generator(device=dev).manual_seed(seed), dev)
    try:
        with limited(limit), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton")
            replay.refill_inputs(attempt.inputs, fresh.originals)
            replay.run_again(steps, allocations)
    except TimeLimitExceeded as late:
        return f"its launches, run again on new inputs, {late}"
    except Exception as error:
        return f"its launches, run again on new inputs, {_describe_exception(error)}"
    again = fresh.judge(spec, output, [], on_gpu, dev)
    if again.ok:
        return ""
    return (f"right, but not computed by its kernels: run again on new inputs, the same "
            f"launches are wrong ({again.summary}). The answer came from elsewhere (torch, "
            "numpy, another thread), and the exercise asks for a kernel that computes it")


def _predict(spec: Problem, traced: tuple[Case, list], target: str | None,
             result: CheckResult) -> None:
    """Predict the largest traced case on the target card; grade structural targets."""
    case, launches = traced
    ceilings, card = roofline.target(target)
    cost = spec.cost(case)
    prediction = traffic.predict(launches, cost.flops, cost.bytes, cost.dtype, ceilings, card,
                                 case.label)
    perf = result.performance
    assert perf is not None
    perf.prediction = prediction
    perf.predicted_case = case
    if prediction.floor_s and cost.flops / ceilings.peak_flops(cost.dtype) < prediction.floor_s \
            and perf.floor.bound == "compute":
        # A CPU-sized case is too small to be compute-bound: its fraction says little.
        perf.notes.append(f"at this CPU size the work itself is memory-bound, while at "
                          f"{perf.case.label} it is compute-bound: read the traffic, not the "
                          "fraction")
    if spec.structure.toy_card:
        prediction = traffic.predict(launches, cost.flops, cost.bytes, cost.dtype, ceilings,
                                     card, case.label, spec.structure.l2_bytes,
                                     spec.structure.sm_count)
        limit = spec.structure.dram_over_compulsory
        ratio = f"DRAM {prediction.dram / prediction.compulsory:.2f}× compulsory"
        perf.notes.append(f"graded{spec.structure.toy_card}: {ratio}, at most {limit:g}× "
                          "allowed" if limit else f"{spec.structure.toy_card.strip()[1:-1]}: "
                          f"{ratio} (shown, not graded)")
    result.causes += spec.structure.failures(prediction)


def _tile_findings(spec: Problem, case: Case, launches: list) -> list[str]:
    """The matrix-unit rules (or just the fit rules) on one traced case, for its dtype."""
    if not (spec.structure.tensor_cores or spec.structure.tile_fit):
        return []
    _, card = roofline.target(None)
    rules = matrix_units.rules_for(card)
    if spec.structure.tensor_cores:
        found = matrix_units.failures(launches, dtype_name(case.dtype), rules)
    else:
        found = [text for launch in launches if (dot := matrix_units.main_dot(launch))
                 for text in matrix_units.misfits(launch, dot, rules)]
    return found


def timed_case(cases, spec: Problem) -> Case:
    """The case to time: the one marked ``timed``, else the one that moves the most bytes."""
    marked = [case for case in cases if case.timed]
    return marked[0] if marked else max(cases, key=lambda c: spec.cost(c).bytes)


def _performance(
    spec: Problem,
    run: _Runner,
    info: device_layer.Device,
    seed: int,
    measure: bool,
    result: CheckResult,
) -> Performance:
    """Time the largest case on a GPU; elsewhere only say what would bound it."""
    # Never under `rooflab grade`: a record must carry its timing, whatever the shell said.
    shared = info.can_measure and device_layer.gpu_shared() and not handin.active()
    if not info.can_measure or not measure or shared:
        # Nothing is measured; say what would bound the real-size case on the default card,
        # from the cost model and the datasheet alone.
        case = timed_case(spec.gpu_cases or spec.cpu_cases, spec)
        cost = spec.cost(case)
        ceilings = roofline.from_datasheet()
        why = ("no GPU" if not info.is_gpu else "interpreter forced" if not info.can_measure
               else "measure=False" if not measure
               else f"the GPU is shared with other work now: {device_layer.SHARED_GPU_VAR}=1")
        return Performance(case, cost, ceilings, roofline.time_floor(cost, ceilings),
                           not_measured=why)

    dev = torch.device(info.torch_device)
    case = timed_case(spec.gpu_cases, spec)
    cost = spec.cost(case)
    ceilings = roofline.ceilings()
    floor = roofline.time_floor(cost, ceilings)
    # Fresh inputs, never seen during the correctness pass, so nothing can be replayed.
    generator = torch.Generator(device=dev).manual_seed(seed + 1_000_003)
    attempt = CaseRun(spec, case, generator, dev)
    out = run.output_buffer(case)  # allocated once: its poison fill is not timed
    try:
        timing = time_gpu(lambda: run(attempt.inputs, out))
        output = run(attempt.inputs, out)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    except Exception as error:
        result.causes.append(f"failed while being timed on {case.label}: "
                             f"{_describe_exception(error)}")
        return Performance(case, cost, ceilings, floor, not_measured="failed while timed")
    after = attempt.judge(spec, output, [out] if out else [], True, dev)
    raised = []
    if after.ok:  # only a right answer's time says what the card can do
        mine = f"your kernel for {spec.id} on {case.label}"
        raised += roofline.observe(cost, timing.median_s, mine, ceilings, info)
    else:
        result.causes.append(f"correct before timing but wrong after it on {case.label}: "
                             f"{after.summary}")
    baseline_name, baseline_s = _time_baseline(spec, attempt)
    if baseline_s is not None:
        raised += roofline.observe(cost, baseline_s, f"{baseline_name} on {case.label}",
                                   ceilings, info)
    # Against the ceilings as they are now: a timing above a ceiling has just raised it.
    floor = roofline.time_floor(cost, ceilings)
    fraction = roofline.roofline_fraction(floor, timing.median_s)
    perf = Performance(case, cost, ceilings, floor, timing.median_s, timing.method, fraction,
                       spec.levels.grade(fraction), baseline_name=baseline_name,
                       baseline_seconds=baseline_s, raised=raised, l2_bytes=info.l2_bytes)
    if perf.level == "below target":
        result.causes.append(f"too slow: {fraction:.0%} of roofline, needs "
                             f"{spec.levels.passing:.0%}; {perf.bottleneck}")
    ratio = perf.vs_baseline
    if ratio is not None and ratio < spec.at_least_vs_baseline:
        result.causes.append(f"too slow against {perf.baseline_name}: {ratio:.2f}× its speed "
                             f"on {case.label}, needs {spec.at_least_vs_baseline:g}×")
    return perf


def _time_baseline(spec: Problem, attempt: CaseRun) -> tuple[str, float | None]:
    """The library call's name and median time on the timed inputs; ("", None) if none."""
    if spec.baseline is None:
        return "", None
    baseline = spec.baseline
    name = spec.baseline_name or getattr(baseline, "__name__", "the library")
    return name, time_gpu(lambda: baseline(*attempt.inputs)).median_s
