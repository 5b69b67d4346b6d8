"""``rooflab trace PROBLEM FILE.py:FUNC``: what a candidate's launches cost the memory
system on a problem's largest CPU case, traced in Triton's interpreter, and where that
work would land on a card (predicted, never measured)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..device import roofline
from ..model import traffic
from ..model.trace import tracing
from ..problem import Problem
from .engine import CaseRun, timed_case


def report(spec: Problem, function: Callable, card: str | None = None) -> list[str]:
    """Run ``function`` on ``spec``'s largest CPU case (bf16 aside: the interpreter cannot
    compute it) under the tracer: each launch's traffic, then the prediction for ``card``
    (a datasheet name or a ceilings JSON; None: the default target). Needs the
    interpreter."""
    case = timed_case([c for c in spec.cpu_cases if c.dtype is not torch.bfloat16], spec)
    attempt = CaseRun(spec, case, torch.Generator().manual_seed(0), torch.device("cpu"))
    with tracing() as tracer:
        function(*attempt.inputs)
    ceilings, target = roofline.target(card)
    lines = [f"{spec.id} at {case.label}, on {target.name} (L2 {target.l2_bytes >> 20} MiB, "
             f"{target.sm_count} SMs)"]
    for launch in tracer.launches:
        lines += traffic.analyze(launch, target).lines()
    cost = spec.cost(case)
    if cost.bytes:
        prediction = traffic.predict(tracer.launches, cost.flops, cost.bytes, cost.dtype,
                                     ceilings, target, case.label)
        lines += [prediction.line, f"  {prediction.bottleneck}"]
    return lines
