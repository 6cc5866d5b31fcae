"""The cells of the op library, each described once: :class:`CellSpec`, and the registry :data:`CELLS`.

The compiled side describes the same cells in ``csrc/cells.h`` (their traits) and lists them once in
``csrc/cell_list.h``; a test checks that both sides list the same cells with the same op signatures.
Everything per cell in Python reads its spec: the fake kernels, the functional API and the ``torch``
backend, the modules' parameters, the default learning rate, the configs (``cell_backend=<cell>_<backend>``,
:mod:`lltm_train.config`) and ``lltm-bench``. docs/adding-a-cell.md says how to add one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from . import reference


@dataclass(frozen=True)
class CellSpec:
    """One cell.

    Attributes:
        name: the cell's name in configs (``model.cell``) and the ops' names.
        title: its name in messages and reports.
        gates: the gate blocks of ``weight_ih`` and ``weight_hh``, in row order (G = len(gates)).
        states: the state tensors, h first: ``("h", "c")``, ``("h",)``, or the sLSTM's ``("h", "c", "n", "m")``.
            The ops take h and one c state that packs the others, ``cat(states[1:], 1)`` (B, (len(states) - 1) H)
            (:attr:`cell_blocks`).
        biases: the bias parameters: ``("bias",)`` (the LLTM's one, G * H) or ``("bias_ih", "bias_hh")``
            (``torch.nn``'s two, G * H each).
        saved: activation blocks of H that the forward op saves for its backward.
        split: whether the last gate's h-side pre-activation stays apart from its x-side one (the GRU's
            candidate); its gradient then has G + 1 blocks.
        needs_c_prev: whether the backward reads c at t - 1 (the LSTM's forget gate); under zoneout every cell
            with a c state reads it (the backward ops of those cells take c_0).
        step: the reference step (:mod:`.reference`): ``step(g, state)``, or ``step(gx, gh, state)`` when split.
        lr_at_256: AdamW's default peak learning rate at 256 units and below (``model.optimizer.lr``; wider
            layers scale it by 256 / hidden_size: :func:`default_lr`).
        torch_module: the ``torch.nn`` class of the same math and parameters (``"LSTM"``, ``"GRU"``,
            ``"RNN"``), whose ``...Cell`` is its one step; None when PyTorch has none (``backend="torch"``
            then refuses the cell by name).
        torch_kwargs: the keyword arguments that make that class this cell (``(("nonlinearity", "relu"),)``).
        torch_function: the ``torch`` function that runs one such layer (``torch.lstm``, ``torch.rnn_relu``).
        baselines: the cells whose ``torch.nn`` layers ``lltm-bench`` compares this one with, the main one
            first (the LLTM, which PyTorch lacks: the LSTM and the GRU).
        op_prefix: the ops are ``torch.ops.lltm.<op_prefix>layer_forward`` and ``..._backward``;
            ``<name>_`` unless given (the LLTM's ops keep their first names, which saved programs call).
        zoneout: whether the cell takes zoneout (``model.zoneout``); not the sLSTM, whose n and m are not states
            to keep in part.
    """

    name: str
    title: str
    gates: tuple[str, ...]
    states: tuple[str, ...]
    biases: tuple[str, ...]
    saved: int
    split: bool
    needs_c_prev: bool
    step: Callable
    lr_at_256: float
    torch_module: str | None = None
    torch_kwargs: tuple[tuple[str, object], ...] = ()
    torch_function: str | None = None
    baselines: tuple[str, ...] = ()
    op_prefix: str | None = None
    zoneout: bool = True

    @property
    def num_gates(self) -> int:
        return len(self.gates)

    @property
    def has_cell_state(self) -> bool:
        return len(self.states) >= 2

    @property
    def cell_blocks(self) -> int:
        """Blocks of H in the ops' c state (c0, c_n, ``cells``): 1, 0 without a c state, 3 for the sLSTM's c, n, m."""
        return len(self.states) - 1

    @property
    def op_states(self) -> int:
        """State arguments of the ops: 2 (h and the packed c state) or 1 (h)."""
        return min(len(self.states), 2)

    @property
    def grad_blocks(self) -> int:
        return self.num_gates + self.split

    @property
    def forward_op(self) -> str:
        return f"{self._prefix}layer_forward"

    @property
    def backward_op(self) -> str:
        return f"{self._prefix}layer_backward"

    @property
    def _prefix(self) -> str:
        return f"{self.name}_" if self.op_prefix is None else self.op_prefix

    @property
    def has_torch(self) -> bool:
        """Whether PyTorch has this cell (``backend="torch"`` runs it)."""
        return self.torch_module is not None

    @property
    def torch_label(self) -> str:
        """``nn.LSTM``, ``nn.RNN(nonlinearity='relu')``, ...: the torch.nn layer's name in tables."""
        if self.torch_module is None:
            raise ValueError(f"PyTorch has no {self.title} cell")
        args = ", ".join(f"{k}={v!r}" for k, v in self.torch_kwargs)
        return f"nn.{self.torch_module}" + (f"({args})" if args else "")

    def torch_layer(self, input_size: int, hidden_size: int, **kwargs) -> nn.Module:
        """A ``torch.nn`` layer of this cell (``torch.nn.LSTM(input_size, hidden_size, **kwargs)``, ...)."""
        if self.torch_module is None:
            raise ValueError(f"PyTorch has no {self.title} cell")
        return getattr(nn, self.torch_module)(input_size, hidden_size, **dict(self.torch_kwargs), **kwargs)

    def torch_cell(self, input_size: int, hidden_size: int, **kwargs) -> nn.Module:
        """A ``torch.nn`` cell (one step) of this cell (``torch.nn.LSTMCell(...)``, ...)."""
        if self.torch_module is None:
            raise ValueError(f"PyTorch has no {self.title} cell")
        return getattr(nn, f"{self.torch_module}Cell")(input_size, hidden_size, **dict(self.torch_kwargs), **kwargs)

    def torch_run(self) -> Callable:
        """PyTorch's function for one layer of this cell (``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh``)."""
        if self.torch_function is None:
            raise ValueError(f"PyTorch has no {self.title} cell")
        return getattr(torch, self.torch_function)


LLTM = CellSpec("lltm", "LLTM", ("input", "output", "candidate"), ("h", "c"), ("bias",), 3, False, False,
                reference.lltm_step, lr_at_256=0.008, baselines=("lstm", "gru"), op_prefix="")
LSTM = CellSpec("lstm", "LSTM", ("input", "forget", "cell", "output"), ("h", "c"), ("bias_ih", "bias_hh"), 4, False,
                True, reference.lstm_step, lr_at_256=0.008, torch_module="LSTM", torch_function="lstm",
                baselines=("lstm",))
GRU = CellSpec("gru", "GRU", ("reset", "update", "new"), ("h",), ("bias_ih", "bias_hh"), 4, True, False,
               reference.gru_step, lr_at_256=0.006, torch_module="GRU", torch_function="gru", baselines=("gru",))
RNN_TANH = CellSpec("rnn", "RNN", ("hidden",), ("h",), ("bias_ih", "bias_hh"), 1, False, False,
                    reference.rnn_tanh_step, lr_at_256=0.008, torch_module="RNN", torch_function="rnn_tanh",
                    baselines=("rnn",))
SLSTM = CellSpec("slstm", "sLSTM", ("input", "forget", "cell", "output"), ("h", "c", "n", "m"), ("bias",), 4, False,
                 True, reference.slstm_step, lr_at_256=0.008, baselines=("lstm",), zoneout=False)
RNN_RELU = CellSpec("rnn_relu", "RNN (ReLU)", ("hidden",), ("h",), ("bias_ih", "bias_hh"), 1, False, False,
                    reference.rnn_relu_step, lr_at_256=0.008, torch_module="RNN",
                    torch_kwargs=(("nonlinearity", "relu"),), torch_function="rnn_relu", baselines=("rnn_relu",))

CELLS: dict[str, CellSpec] = {spec.name: spec for spec in (LLTM, LSTM, GRU, RNN_TANH, RNN_RELU, SLSTM)}


def cell_spec(name: str | CellSpec) -> CellSpec:
    """The spec of a cell name. ValueError for an unknown one."""
    if isinstance(name, CellSpec):
        return name
    if name not in CELLS:
        raise ValueError(f"unknown cell {name!r}; choose one of {', '.join(CELLS)}")
    return CELLS[name]


def default_lr(cell: str, hidden_size: int) -> float:
    """The default peak learning rate of ``cell`` at ``hidden_size`` units (``model.optimizer.lr`` when it is
    not set): ``lr_at_256 * min(1, 256 / hidden_size)``, to 3 significant digits (a wider recurrent matrix
    takes smaller steps: at 512 units the GRU diverged at the LLTM's 0.008, H200, 2026-12-01; measured on the
    default job at 256, 512 and 1024 units, benchmarks/log). An unknown cell or a size below 1 gets the
    LLTM's rate: the model then refuses them with its own message.
    """
    base = CELLS[cell].lr_at_256 if cell in CELLS else LLTM.lr_at_256
    scale = 256 / hidden_size if isinstance(hidden_size, int) and not isinstance(hidden_size, bool) and hidden_size > 256 else 1.0
    return float(f"{base * scale:.3g}")
