"""Parameter creation and argument checks shared by :class:`LLTMCell` and :class:`LLTM`."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..backends import check_backend_name


def check_sizes(owner: str, **sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")


def check_flags(owner: str, **flags: bool) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")


def check_probability(owner: str, name: str, value) -> float:
    """A dropout probability in [0, 1] (NaN refused), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{owner}: {name} must be a number in [0, 1], got {value!r}")
    return float(value)


def make_weights(module: nn.Module, suffix: str, input_size: int, hidden_size: int, bias: bool, factory: dict) -> None:
    """Registers ``weight_ih{suffix}`` (3H, I), ``weight_hh{suffix}`` (3H, H) and ``bias{suffix}`` (3H)."""
    H = hidden_size
    module.register_parameter(f"weight_ih{suffix}", nn.Parameter(torch.empty(3 * H, input_size, **factory)))
    module.register_parameter(f"weight_hh{suffix}", nn.Parameter(torch.empty(3 * H, H, **factory)))
    module.register_parameter(f"bias{suffix}", nn.Parameter(torch.empty(3 * H, **factory)) if bias else None)


def reset_uniform(module: nn.Module, hidden_size: int) -> None:
    """U(-1/sqrt(H), 1/sqrt(H)) for every parameter, as torch.nn.LSTM initialises."""
    bound = 1.0 / math.sqrt(hidden_size)
    for p in module.parameters(recurse=False):
        nn.init.uniform_(p, -bound, bound)


class BackendMixin:
    """A ``backend`` attribute that can be changed after construction and is checked when set."""

    _backend: str

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        check_backend_name(value)
        self._backend = value
