"""The answers a check keeps, saved for a grader in another process to check again.

Under ``rooflab check`` (``isolated.py``) and ``rooflab grade`` (``handin.py``) every
case's answer crosses into the grader's process as a file, which the grader loads with
``torch.load(weights_only=True)``: that runs no code from the file, and so loads only
tensors, numbers, strings, and tuples, lists and dicts of them. An answer is saved in
those types: numpy, fractions and named tuples become torch or plain Python, anything
else its repr. A case on N ranks
saves, as its answer, what each rank returned and each rank's log of calls
(``rank_check.kept``): a dict, by name.
"""

from __future__ import annotations

import decimal
import numbers
from pathlib import Path

import torch


def portable(answer: object) -> object:
    """An answer in the types the grader loads safely, keeping its value: numpy's numbers
    and arrays, a ``Fraction``, a named tuple (``torch.topk``'s own answer is one) become
    their plain Python or torch equals; anything else its repr."""
    import numpy as np

    if isinstance(answer, torch.Tensor) or answer is None:
        return answer
    if isinstance(answer, (bool, np.bool_)):
        return bool(answer)
    if isinstance(answer, numbers.Integral):  # int, numpy's integers
        return int(answer)
    if isinstance(answer, numbers.Rational):  # a Fraction: a count stays a whole number
        return int(answer) if answer.denominator == 1 else float(answer)
    if isinstance(answer, (numbers.Real, decimal.Decimal)):  # float, numpy's floats
        return float(answer)
    if isinstance(answer, str):
        return str(answer)
    if isinstance(answer, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(answer).copy())
    if isinstance(answer, np.generic):
        return portable(answer.item())
    if isinstance(answer, tuple):  # named tuples too: their fields, in order
        return tuple(portable(item) for item in answer)
    if isinstance(answer, list):
        return [portable(item) for item in answer]
    if isinstance(answer, dict) and all(isinstance(key, str) for key in answer):
        return {str(key): portable(value) for key, value in answer.items()}
    return repr(answer)


def save(outputs: dict[int, object], path: Path | str) -> None:
    """Each case's answer, by case index, to ``path``."""
    torch.save({index: portable(output) for index, output in outputs.items()}, path)


def load(path: Path | str) -> dict:
    """What ``save`` wrote (and nothing that runs code): raises if it cannot be read."""
    return torch.load(path, weights_only=True)
