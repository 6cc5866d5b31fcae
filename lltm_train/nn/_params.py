"""Parameter creation shared by :class:`LLTMCell` and :class:`LLTM`, and their settable ``backend``."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..backends import check_backend_name


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
