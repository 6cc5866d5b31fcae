"""What the cell and layer modules share: parameter creation, the settable ``backend``, and the cell a module
runs (fixed by a drop-in class, or given to the generic one)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from ..backends import check_backend_name
from ..checks import positive_int
from ..ops.cells import CellSpec, cell_spec


def make_weights(module: nn.Module, spec: CellSpec, suffix: str, input_size: int, hidden_size: int, bias: bool,
                 factory: dict, num_heads: int = 1) -> None:
    """Registers ``weight_ih{suffix}`` (G H, I), ``weight_hh{suffix}`` (G H, H / num_heads: the heads' blocks,
    :func:`lltm_train.functional.dense_weight_hh`) and the cell's biases (``bias{suffix}``, or ``bias_ih{suffix}``
    and ``bias_hh{suffix}``; G H each), in torch.nn's order."""
    rows = spec.num_gates * hidden_size
    params = {f"weight_ih{suffix}": nn.Parameter(torch.empty(rows, input_size, **factory)),
              f"weight_hh{suffix}": nn.Parameter(torch.empty(rows, hidden_size // num_heads, **factory)),
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
        # (grad is None where autograd passes an undefined gradient, as torch.autograd.gradcheck's checks do)
        if grad is not None and param.grad is None and grad.is_cuda and _cudagraph_trees_in_use(grad.device):
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


def check_heads(owner: str, hidden_size: int, num_heads) -> int:
    """num_heads: a positive integer that divides hidden_size (ValueError otherwise)."""
    positive_int(owner, "num_heads", num_heads)
    if hidden_size % num_heads:
        raise ValueError(f"{owner}: hidden_size ({hidden_size}) must be a multiple of num_heads ({num_heads}): each "
                         "head is hidden_size / num_heads units wide")
    return num_heads


def explain_heads_mismatch(module: nn.Module, state_dict: dict, prefix: str, error_msgs: list[str]) -> None:
    """For ``_load_from_state_dict``: a ``weight_hh*`` of another width in the state dict is another num_heads's
    blocks; say so beside PyTorch's size mismatch. (Not where the state dict has ``weight_hr*``: torch.nn.LSTM's
    ``proj_size``, whose weight_hh has proj_size columns; load_state_dict names those keys as unexpected.)"""
    if any(key.startswith(prefix + "weight_hr") for key in state_dict):
        return
    for name, own in module.named_parameters(recurse=False):
        theirs = state_dict.get(prefix + name)
        if (name.startswith("weight_hh") and isinstance(theirs, torch.Tensor) and theirs.dim() == 2
                and theirs.shape[0] == own.shape[0] and 0 < theirs.shape[1] != own.shape[1]
                and module.hidden_size % theirs.shape[1] == 0):
            # (shapes alone cannot tell the cell: a GRU's 3 gates of 8 units have the rows of an LSTM's 4 of 6)
            error_msgs.append(f"{prefix}{name} is {tuple(theirs.shape)} in the state dict: if it holds this module's "
                              f"cell ({type(module).__name__}, hidden_size {module.hidden_size}), those are the blocks of "
                              f"num_heads={module.hidden_size // theirs.shape[1]}; this one has "
                              f"num_heads={module.num_heads} ({tuple(own.shape)}): build it with the saved model's cell "
                              "and num_heads")


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

    def __prepare_scriptable__(self):
        """torch.jit.script calls this first: TorchScript cannot compile the backends' dispatch (the custom ops
        are chosen in Python), so it is refused in one line instead of TorchScript's internal error."""
        raise RuntimeError(f"{type(self).__name__} cannot be compiled by torch.jit.script (its backends are chosen in "
                           "Python); record it with torch.jit.trace, or with torch.export.export (lltm-export "
                           "writes both)")


class CellMixin:
    """The cell a module runs: fixed by a subclass (its class attribute ``cell``), which is then that cell's
    drop-in (``LSTM`` for ``lstm``), or given as ``cell=`` to the generic class (``RecurrentLayers``), which
    holds the registry ``drop_ins`` (cell name -> drop-in) that :meth:`for_cell` builds from."""

    cell: CellSpec | None = None
    drop_ins: ClassVar[dict[str, Callable]]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if isinstance(cls.__dict__.get("cell"), CellSpec):
            cls.drop_ins.setdefault(cls.cell.name, cls)

    def _take_cell(self, cell: str | CellSpec | None) -> None:
        """Sets ``self.cell`` from ``cell=``, which only the generic class takes; TypeError otherwise."""
        owner = type(self).__name__
        if cell is not None:
            if type(self).cell is not None:
                raise TypeError(f"{owner} is the {type(self).cell.name} cell; cell= is for the generic class")
            self.cell = cell_spec(cell)
        elif getattr(self, "cell", None) is None:
            raise TypeError(f"{owner}: give the cell, e.g. cell='lltm'")

    @classmethod
    def for_cell(cls, cell: str | CellSpec, input_size: int, hidden_size: int, **kwargs):
        """A module of ``cell`` (name or spec): its drop-in where it has one, else this class with ``cell=``."""
        spec = cell_spec(cell)
        make = cls.drop_ins.get(spec.name)
        return cls(input_size, hidden_size, cell=spec, **kwargs) if make is None else make(input_size, hidden_size, **kwargs)

    def _cell_repr(self) -> str:
        return f", cell={self.cell.name!r}" if type(self).cell is None else ""
