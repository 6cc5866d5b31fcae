"""Parameter creation shared by the cell and layer modules, and their settable ``backend``."""

from __future__ import annotations

import math
import sys

import torch
from torch import nn

from ..backends import check_backend_name
from ..ops.cells import CellSpec


def make_weights(module: nn.Module, spec: CellSpec, suffix: str, input_size: int, hidden_size: int, bias: bool,
                 factory: dict) -> None:
    """Registers ``weight_ih{suffix}`` (G H, I), ``weight_hh{suffix}`` (G H, H) and the cell's biases
    (``bias{suffix}``, or ``bias_ih{suffix}`` and ``bias_hh{suffix}``; G H each), in torch.nn's order."""
    rows = spec.num_gates * hidden_size
    params = {f"weight_ih{suffix}": nn.Parameter(torch.empty(rows, input_size, **factory)),
              f"weight_hh{suffix}": nn.Parameter(torch.empty(rows, hidden_size, **factory)),
              **{f"{name}{suffix}": nn.Parameter(torch.empty(rows, **factory)) if bias else None for name in spec.biases}}
    for name, p in params.items():
        module.register_parameter(name, p)
        if p is not None:
            p.register_hook(_own_gradient(p))


def _own_gradient(param: nn.Parameter):
    """A gradient hook for torch.compile(mode="reduce-overhead") training that accumulates ``.grad``.

    A compiled backward's CUDA graph hands out gradients in its own memory, which the next replay reuses.
    When ``.grad`` is None, autograd would keep that tensor as ``.grad`` and, at the next backward, add to
    memory that the replay has overwritten ("accessing tensor output of CUDAGraphs that has been
    overwritten"). While torch's CUDA graph trees are in use, the first gradient is copied instead (one
    copy of the parameter per zero_grad(set_to_none=True)); otherwise the hook passes it through.
    """
    def hook(grad):
        if param.grad is None and grad.is_cuda and _cudagraph_trees_in_use(grad.device):
            return grad.clone()
        return grad

    return hook


def _cudagraph_trees_in_use(device: torch.device) -> bool:
    trees = sys.modules.get("torch._inductor.cudagraph_trees")  # imported by the first reduce-overhead compile
    if trees is None:
        return False
    try:
        return trees.get_manager(device.index or 0, create_if_none_exists=False) is not None
    except Exception:  # noqa: BLE001 - a private API; without it, torch's own error stands
        return False


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
