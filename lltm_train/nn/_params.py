"""Parameter creation shared by the cell and layer modules, and their settable ``backend``."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..backends import check_backend_name
from ..ops.cells import CellSpec


def make_weights(module: nn.Module, spec: CellSpec, suffix: str, input_size: int, hidden_size: int, bias: bool,
                 factory: dict) -> None:
    """Registers ``weight_ih{suffix}`` (G H, I), ``weight_hh{suffix}`` (G H, H) and the cell's biases
    (``bias{suffix}``, or ``bias_ih{suffix}`` and ``bias_hh{suffix}``; G H each), in torch.nn's order."""
    rows = spec.num_gates * hidden_size
    module.register_parameter(f"weight_ih{suffix}", nn.Parameter(torch.empty(rows, input_size, **factory)))
    module.register_parameter(f"weight_hh{suffix}", nn.Parameter(torch.empty(rows, hidden_size, **factory)))
    for name in spec.biases:
        module.register_parameter(f"{name}{suffix}", nn.Parameter(torch.empty(rows, **factory)) if bias else None)


def reset_uniform(module: nn.Module, hidden_size: int) -> None:
    """U(-1/sqrt(H), 1/sqrt(H)) for every parameter, as torch.nn.LSTM and GRU initialise."""
    bound = 1.0 / math.sqrt(hidden_size)
    for p in module.parameters(recurse=False):
        nn.init.uniform_(p, -bound, bound)


class BackendMixin:
    """A ``backend`` attribute that can be changed after construction and is checked when set."""

    _backend: str
    cell: CellSpec

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        check_backend_name(value, self.cell.name)
        self._backend = value
