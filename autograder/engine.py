"""The correctness engine: run a candidate on every case of a problem and judge it.

For each case the engine makes fresh random inputs, computes the float64 reference,
runs the candidate while poisoning its allocations and recording what it calls, then
checks the output (``compare.py``) and that the inputs are bit-for-bit unchanged.
On a GPU it then times the candidate on the largest case, places it on the measured
roofline, and checks the answer again on the timed inputs.
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Callable

import torch

from . import device as device_layer
from . import poison, problem, roofline
from .compare import Comparison, compare
from .recording import Recording, recorder
from .result import CaseResult, CheckResult, Performance
from .timing import time_gpu


def _to_reference_dtype(x: object) -> object:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().to(torch.float64)
    return x


def _snapshot(inputs: tuple) -> list[torch.Tensor | None]:
    return [x.detach().clone() if isinstance(x, torch.Tensor) else None for x in inputs]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A view to compare bit for bit (NaN == NaN, -0.0 != 0.0)."""
    t = t.contiguous()
    width = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()]
    return t.view(width) if t.dtype != torch.bool else t


def _modified_inputs(inputs: tuple, snapshot: list[torch.Tensor | None]) -> list[int]:
    changed = []
    for position, (now, before) in enumerate(zip(inputs, snapshot, strict=True)):
        if before is not None and not torch.equal(_bits(now), _bits(before)):
            changed.append(position)
    return changed


def _describe_exception(error: BaseException) -> str:
    explained = device_layer.explain_launch_error(error)
    if explained:
        return explained
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"raised {type(error).__name__}: {error}{where}"


class _Runner:
    """Runs the candidate in the problem's calling convention."""

    def __init__(self, spec: problem.Problem, candidate: Callable, dev: torch.device):
        self.spec, self.candidate, self.dev = spec, candidate, dev

    def __call__(self, case: problem.Case, inputs: tuple) -> object:
        if self.spec.output_arg:
            assert self.spec.out_shape is not None, f"{self.spec.id}: output_arg needs out_shape"
            out = poison.empty(self.spec.out_shape(case), self.spec.expected_dtype(case), self.dev)
            self.candidate(*inputs, out)
            return out
        return self.candidate(*inputs)


def _judge(
    spec: problem.Problem,
    case: problem.Case,
    inputs: tuple,
    output: object,
    snapshot: list[torch.Tensor | None],
    on_gpu: bool,
    dev: torch.device,
) -> CaseResult:
    changed = _modified_inputs(inputs, snapshot)
    if changed:
        names = ", ".join(f"argument {i}" for i in changed)
        return CaseResult(case, error=f"modified its input ({names}); inputs must be read-only")
    reference = spec.reference(*(_to_reference_dtype(x) for x in snapshot_or(inputs, snapshot)))
    dtype = spec.expected_dtype(case)
    comparison: Comparison = compare(
        output, reference, dtype=dtype, device=dev, tolerance=spec.tolerance(dtype, on_gpu)
    )
    return CaseResult(case, comparison)


def snapshot_or(inputs: tuple, snapshot: list[torch.Tensor | None]) -> tuple:
    """Inputs as they were before the candidate ran (tensors from the snapshot)."""
    return tuple(s if s is not None else x for x, s in zip(inputs, snapshot, strict=True))


def _new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") & 0x7FFF_FFFF


def check(
    problem_id: str | problem.Problem,
    candidate: Callable,
    *,
    seed: int | None = None,
    measure: bool = True,
    show: bool = True,
    raise_on_failure: bool = True,
) -> CheckResult:
    """Grade ``candidate`` on the problem ``problem_id`` ("<lab>/<exercise>").

    Runs every case for this device (small ones on a CPU, chip-filling ones on a GPU),
    on fresh random inputs; ``seed`` repeats a previous run's inputs. On a GPU, and if
    ``measure``, also times the largest case and grades its roofline fraction.

    Shows the result (HTML in Jupyter, one line elsewhere) and returns a CheckResult.
    Raises AssertionError, with the cause in the message, if the candidate fails.
    """
    spec = problem.get(problem_id) if isinstance(problem_id, str) else problem_id
    info = device_layer.current()
    dev = torch.device(info.torch_device)
    seed = _new_seed() if seed is None else seed
    result = CheckResult(spec.id, info.mode, seed)
    run = _Runner(spec, candidate, dev)
    recording = Recording()

    # Chip-filling cases and TF32 tolerances only where kernels really run on the GPU.
    on_gpu = info.can_measure
    for index, case in enumerate(spec.cases(on_gpu)):
        generator = torch.Generator(device=dev).manual_seed(seed + index)
        inputs = spec.make_inputs(case, generator, dev)
        snapshot = _snapshot(inputs)
        try:
            with recorder(recording), warnings.catch_warnings():
                # numpy's overflow warnings from inside the interpreter: the comparison
                # reports what matters (inf where the answer is finite) more clearly.
                warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton")
                output = run(case, inputs)
        except NotImplementedError:
            result.not_implemented = True
            result.causes.append("not implemented yet: replace `raise NotImplementedError` "
                                 "with your code")
            break
        except Exception as error:  # the candidate's bug, reported as the case's failure
            result.cases.append(CaseResult(case, error=_describe_exception(error)))
            continue
        result.cases.append(_judge(spec, case, inputs, output, snapshot, on_gpu, dev))

    result.library_calls = recording.library_calls(spec.library_ops)
    result.triton_launches = dict(recording.triton_launches)
    _collect_causes(spec, result)

    if result.passed:
        result.performance = _performance(spec, run, info, dev, seed, measure, result)

    if show:
        result.show()
    if raise_on_failure and not result.passed:
        raise AssertionError(result.message())
    return result


def _collect_causes(spec: problem.Problem, result: CheckResult) -> None:
    if result.not_implemented:
        return
    failing = [c for c in result.cases if not c.ok]
    worst = result.worst_case
    if failing and worst is not None:
        result.causes.append(f"wrong on {worst.case.label}: {worst.summary}")
        if len(failing) > 1:
            result.causes.append(f"{len(failing)} of {len(result.cases)} cases fail")
    if spec.kernel_required and result.library_calls:
        ops = ", ".join(f"aten.{op}" for op in result.library_calls)
        result.causes.append(
            f"calls the library ({ops}) instead of launching its own kernel; "
            "this exercise asks for a kernel you write"
        )
    elif spec.kernel_required and not result.triton_launches and not failing:
        result.causes.append("launched no Triton kernel; this exercise asks for one")


def _largest(cases, spec: problem.Problem) -> problem.Case:
    return max(cases, key=lambda c: spec.cost(c).bytes)


def _performance(
    spec: problem.Problem,
    run: _Runner,
    info: device_layer.Device,
    dev: torch.device,
    seed: int,
    measure: bool,
    result: CheckResult,
) -> Performance:
    """Time the largest case on a GPU; elsewhere only say what would bound it."""
    if not info.can_measure or not measure:
        # Nothing can be measured here; say what would bound the real-size case on the
        # default card, from the cost model and the datasheet alone.
        case = _largest(spec.gpu_cases or spec.cpu_cases, spec)
        cost = spec.cost(case)
        ceilings = roofline.from_datasheet()
        return Performance(case, cost, ceilings, roofline.time_floor(cost, ceilings))

    case = _largest(spec.gpu_cases, spec)
    cost = spec.cost(case)
    ceilings = roofline.ceilings()
    floor = roofline.time_floor(cost, ceilings)
    # Fresh inputs, never seen during the correctness pass, so nothing can be replayed.
    generator = torch.Generator(device=dev).manual_seed(seed + 1_000_003)
    inputs = spec.make_inputs(case, generator, dev)
    snapshot = _snapshot(inputs)
    timing = time_gpu(lambda: run(case, inputs))
    output = run(case, inputs)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    after = _judge(spec, case, inputs, output, snapshot, True, dev)
    if not after.ok:
        result.causes.append(f"correct before timing but wrong after it on {case.label}: "
                             f"{after.summary}")
    fraction = roofline.roofline_fraction(floor, timing.median_s)
    level = spec.levels.grade(fraction)
    perf = Performance(case, cost, ceilings, floor, timing.median_s, timing.method, fraction,
                       level)
    if level == "below target":
        result.causes.append(
            f"too slow: {fraction:.0%} of roofline, needs {spec.levels.passing:.0%}; "
            f"{perf.bottleneck}"
        )
    return perf
