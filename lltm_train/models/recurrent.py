"""The recurrent layer of every model: a fused cell of :mod:`lltm_train.nn` (LLTM, LSTM, GRU, RNN, any cell of
:mod:`lltm_train.ops.cells`), or with ``backend="torch"`` PyTorch's own layer of the cell (``torch.nn.LSTM``,
``GRU``, ``RNN``: cuDNN on a GPU, oneDNN on a CPU), the baseline.

All of them share one parameter layout per cell (``torch.nn``'s names and shapes), so a checkpoint moves
between backends, ``torch`` included, and a sweep over ``model.cell`` or ``backend`` compares them at equal
width with everything else equal.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import checks as v
from ..backends import check_backend_name
from ..nn import recurrent_layers
from ..ops.cells import CELLS as _SPECS

CELLS = tuple(_SPECS)  # the cells' names (model.cell): lltm, lstm, gru, rnn, rnn_relu


def recurrent_layer(cell: str, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0,
                    bidirectional: bool = False, backend: str = "auto", forget_bias: float | None = None,
                    weight_drop: float = 0.0, zoneout: float | Sequence[float] = 0.0, num_heads: int = 1) -> nn.Module:
    """A time-major recurrent layer: ``layer(x (T, B, F) or PackedSequence, state=None) -> (output, state)``.

    ``forget_bias``: the forget gate's initial bias in every layer and direction (``bias_ih``'s forget rows;
    ``bias_hh``'s are zero, so that the two add up to it), for the cells with a forget gate (the LSTM, the sLSTM); None
    keeps the uniform initialisation of ``torch.nn``. A bias of 1 keeps the cell state through the first
    steps of training (Gers, Schmidhuber & Cummins 2000; Jozefowicz, Zaremba & Sutskever 2015).

    ``weight_drop``: DropConnect on every ``weight_hh`` in training mode, one mask per forward call, in [0, 1)
    (:class:`lltm_train.nn.LSTM`'s argument; with ``backend="torch"`` the same on ``torch.nn``'s layer).
    ``zoneout``: one probability for both states or a pair ``[cell, hidden]`` (Krueger et al. 2017), inside the
    fused kernels (:class:`lltm_train.nn.LSTM`'s argument); ``backend="torch"`` has none.
    ``num_heads``: the recurrence in that many independent heads (:class:`lltm_train.nn.LSTM`'s argument); with
    ``backend="torch"``, :class:`lltm_train.nn.LSTM` runs PyTorch's kernels on the block-diagonal matrix.

    Raises:
        ValueError: an unknown cell or backend, ``backend="torch"`` for a cell PyTorch lacks (the LLTM), a
            bad size, dropout, weight_drop, zoneout (or zoneout with ``backend="torch"``) or num_heads (one that
            does not divide hidden_size), or a forget_bias that is not a finite number or is given for a cell
            without a forget gate.
    """
    v.one_of("model", "cell", cell, CELLS)
    check_backend_name(backend, cell)
    v.positive_int("model", "num_heads", num_heads)  # (True and 1.0 are not 1 head)
    dropout = v.probability("model", "dropout", dropout) if num_layers > 1 else 0.0  # between layers only
    if forget_bias is not None:
        if "forget" not in _SPECS[cell].gates:
            with_gate = ", ".join(name for name, spec in _SPECS.items() if "forget" in spec.gates)
            raise ValueError(f"model: forget_bias is for cells with a forget gate ({with_gate}); the {cell} cell "
                             "has none (leave forget_bias null)")
        if isinstance(forget_bias, bool) or not isinstance(forget_bias, (int, float)) or not math.isfinite(forget_bias):
            raise ValueError(f"model: forget_bias must be a finite number or null, got {forget_bias!r}")
    if backend == "torch" and zoneout not in (0, 0.0, None) and not (isinstance(zoneout, Sequence) and not any(zoneout)):
        raise ValueError(f"model: zoneout={zoneout!r} runs inside the fused kernels; backend=torch (torch.nn's "
                         f"{_SPECS[cell].title}) has none: choose backend=auto, cpp, cuda or python, or zoneout=0")
    if backend == "torch" and num_heads == 1:
        v.positive_int("model", "hidden_size", hidden_size)
        v.positive_int("model", "num_layers", num_layers)
        spec = _SPECS[cell]
        weight_drop = v.probability("model", "weight_drop", weight_drop)
        if weight_drop == 1:
            raise ValueError("model: weight_drop must be below 1 (1 would drop every recurrent weight)")
        make = _WEIGHT_DROPPED[spec.torch_module] if weight_drop > 0 else getattr(nn, spec.torch_module)
        layer = make(input_size, hidden_size, num_layers=num_layers, dropout=dropout, bidirectional=bidirectional,
                     **dict(spec.torch_kwargs))
        layer.weight_drop = weight_drop
    else:
        layer = recurrent_layers(cell, input_size, hidden_size, num_layers=num_layers, dropout=dropout,
                                 bidirectional=bidirectional, backend=backend, weight_drop=weight_drop,
                                 zoneout=zoneout, num_heads=num_heads)
    if forget_bias is not None:
        set_forget_bias(layer, cell, hidden_size, float(forget_bias))
    return layer


class _WeightDrop:
    """A ``torch.nn`` recurrent layer with a ``weight_drop`` attribute: DropConnect on its ``weight_hh`` tensors in
    training mode, one mask per forward call, as :class:`lltm_train.nn.LSTM`'s. Same parameters and state dict
    as the ``torch.nn`` layer."""

    weight_drop = 0.0

    def forward(self, input, hx=None):
        if not (self.weight_drop > 0 and self.training):
            return super().forward(input, hx)
        flat = self._flat_weights
        self._flat_weights = [F.dropout(w, self.weight_drop, training=True) if name.startswith("weight_hh") else w
                              for name, w in zip(self._flat_weights_names, flat)]
        try:
            with warnings.catch_warnings():  # cuDNN copies the new weights into one buffer, and says so each call
                warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")
                return super().forward(input, hx)
        finally:
            self._flat_weights = flat


class WeightDropLSTM(_WeightDrop, nn.LSTM):
    pass


class WeightDropGRU(_WeightDrop, nn.GRU):
    pass


class WeightDropRNN(_WeightDrop, nn.RNN):
    pass


_WEIGHT_DROPPED = {"LSTM": WeightDropLSTM, "GRU": WeightDropGRU, "RNN": WeightDropRNN}


@torch.no_grad()
def set_forget_bias(layer: nn.Module, cell: str, hidden_size: int, value: float) -> None:
    """Sets the forget-gate rows of every ``bias_ih*`` of ``layer`` (or ``bias*``: a cell of one bias, the sLSTM) to
    ``value`` and of every ``bias_hh*`` to 0 (torch.nn's parameter names and gate order, which every backend
    shares)."""
    gate = _SPECS[cell].gates.index("forget")
    rows = slice(gate * hidden_size, (gate + 1) * hidden_size)
    for name, parameter in layer.named_parameters():
        if name.startswith("bias_ih") or (name.startswith("bias") and not name.startswith("bias_hh")):
            parameter[rows] = value
        elif name.startswith("bias_hh"):
            parameter[rows] = 0.0


def final_hidden(state) -> Tensor:
    """h_n (layers * directions, B, H) from a layer's final state: (h_n, c_n) for the cells with a c state,
    h_n alone for the others."""
    return state[0] if isinstance(state, tuple) else state
