"""Checks of scalar arguments, shared by the modules, models, tasks and data modules.

Each returns the value it checked (as the expected type) or raises ValueError with a message that names
the owner and the argument, e.g. ``LLTM: hidden_size must be a positive integer, got 0``. Booleans are
refused where numbers are expected (``True`` is an int to Python, never a size to a user).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_int(owner: str, name: str, value) -> int:
    """An int >= 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(owner: str, name: str, value, upper: int | None = None) -> int:
    """An int in [0, upper] (no upper bound when None)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (upper is not None and value > upper):
        bound = f"in [0, {upper}]" if upper is not None else ">= 0"
        raise ValueError(f"{owner}: {name} must be an integer {bound}, got {value!r}")
    return value


def flag(owner: str, name: str, value) -> bool:
    """True or False (not a string or a number that looks like one)."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")
    return value


def probability(owner: str, name: str, value) -> float:
    """A number in [0, 1] (NaN refused), as a float."""
    if not _number(value) or not 0 <= value <= 1:
        raise ValueError(f"{owner}: {name} must be a number in [0, 1], got {value!r}")
    return float(value)


def dropout(owner: str, value) -> float:
    """A model's dropout probability: a number in [0, 1); 1 would zero every activation it drops from."""
    p = probability(owner, "dropout", value)
    if p == 1:
        raise ValueError(f"{owner}: dropout must be below 1 (1 zeroes every activation before the output layer), "
                         f"got {value!r}")
    return p


def fraction(owner: str, name: str, value, upper: float = 0.5) -> float:
    """A number in the open interval (0, upper), as a float."""
    if not _number(value) or not 0 < value < upper:
        raise ValueError(f"{owner}: {name} must be a number in (0, {upper}), got {value!r}")
    return float(value)


def positive_finite(owner: str, name: str, value) -> float:
    """A finite number > 0, as a float."""
    if not _number(value) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{owner}: {name} must be a positive number, got {value!r}")
    return float(value)


def one_of(owner: str, name: str, value, choices: Iterable[str]) -> str:
    """One of the given names."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def finite_tensor(owner: str, what: str, tensor: torch.Tensor) -> torch.Tensor:
    """Returns ``tensor``, or raises ValueError if it holds NaN or infinity (which would poison training)."""
    bad = ~torch.isfinite(tensor)
    if bad.any():
        raise ValueError(f"{owner}: {what} holds {int(bad.sum())} non-finite values (NaN or inf)")
    return tensor
