"""rooflab's autograder: is the kernel correct, and how close does it run to the roofline?

    from rooflab.autograder import check
    check("coalescing/vector_add", my_vector_add)

Importing this package is enough to make Triton kernels defined *afterwards* run on a
machine without a GPU (in Triton's interpreter): do it at the top of a notebook or test.
"""

from . import device as _device

_device.enable_interpreter_if_no_gpu()
if not _device.current().is_gpu:  # autotuners rank configurations by predicted time
    from .model import autotune as _autotune

    _autotune.rank_by_prediction()

from .device import versions as _versions  # noqa: E402

_versions.warn_if_broken()

from .checking import handin as _handin  # noqa: E402
from .checking.engine import CheckFailed, check, explore, passed, passing  # noqa: E402
from .checking.hints import hint  # noqa: E402
from .checking.result import CheckResult  # noqa: E402
from .device import current as current_device  # noqa: E402
from .device import datasheet, roofline  # noqa: E402  (the roofline helpers, by module)
from .problem import Case, Cost, Levels, Problem, Tolerance, register  # noqa: E402
from .problems import all_problems  # noqa: E402
from .problems import get as get_problem  # noqa: E402

# Under `rooflab grade`: note the timers and the grader now, before any learner code.
_handin.start()

from .checking import ways as _ways  # noqa: E402

_ways.register()  # %%scaffold, in a notebook

__all__ = [
    "Case",
    "CheckFailed",
    "CheckResult",
    "Cost",
    "Levels",
    "Problem",
    "Tolerance",
    "all_problems",
    "check",
    "current_device",
    "datasheet",
    "explore",
    "get_problem",
    "hint",
    "passed",
    "passing",
    "register",
    "roofline",
]
