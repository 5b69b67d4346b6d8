"""Versions of what rooflab stands on, and the combinations known to break."""

from __future__ import annotations

import platform
import re
import warnings
from importlib import metadata

from . import interpreter_enabled

PACKAGES = ["torch", "triton", "numpy", "cupy-cuda12x", "cupy-cuda13x", "jupyterlab",
            "ipywidgets", "plotly", "nbval"]


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _tuple(text: str | None) -> tuple[int, ...]:
    """"2.13.0+cpu" -> (2, 13, 0); "3.7rc1" -> (3, 7): the leading digits of each part."""
    parts = []
    for piece in (text or "0").split("+")[0].split(".")[:3]:
        digits = re.match(r"\d*", piece).group()
        parts.append(int(digits or 0))
        if len(digits) < len(piece):  # a pre-release tag ends the version proper
            break
    return tuple(parts)


def installed() -> dict[str, str | None]:
    found = {"python": platform.python_version()}
    found.update({name: version(name) for name in PACKAGES})
    return found


def known_problems(found: dict[str, str | None] | None = None, interpreter: bool | None = None
                   ) -> list[str]:
    """Combinations that are known to break, in words. Empty when all is well."""
    found = found if found is not None else installed()
    interpreter = interpreter_enabled() if interpreter is None else interpreter
    problems = []
    if found.get("python") and _tuple(found.get("python")) < (3, 10):
        problems.append(f"python {found.get('python')} is too old: rooflab needs 3.10 or newer")
    torch_v, triton_v, numpy_v = found.get("torch"), found.get("triton"), found.get("numpy")
    if torch_v is None:
        problems.append("torch is not installed")
    elif _tuple(torch_v) < (2, 4):
        problems.append(f"torch {torch_v} is too old: rooflab needs 2.4 or newer")
    if triton_v is None:
        problems.append("triton is not installed")
    elif not (3, 6) <= _tuple(triton_v)[:2] <= (3, 9):
        problems.append(f"triton {triton_v} is not supported: rooflab supports 3.6 to 3.9")
    if (interpreter and triton_v and numpy_v and _tuple(triton_v)[:2] == (3, 6)
            and _tuple(numpy_v)[:2] >= (2, 4)):
        problems.append(
            f"triton {triton_v} with numpy {numpy_v}: the interpreter fails on every loop "
            "('only 0-dimensional arrays can be converted to Python scalars'); install "
            "'numpy<2.4' or triton 3.7 or newer"
        )
    return problems


def warn_if_broken() -> None:
    for problem in known_problems():
        warnings.warn(f"rooflab: {problem}", RuntimeWarning, stacklevel=3)
