"""The recurrent layer of every model: a fused cell of :mod:`lltm_train.nn` (LLTM, LSTM, GRU, RNN, any cell of
:mod:`lltm_train.ops.cells`), or with ``backend="torch"`` PyTorch's own layer of the cell (``torch.nn.LSTM``,
``GRU``, ``RNN``: cuDNN on a GPU, oneDNN on a CPU), the baseline.

All of them share one parameter layout per cell (``torch.nn``'s names and shapes), so a checkpoint moves
between backends, ``torch`` included, and a sweep over ``model.cell`` or ``backend`` compares them at equal
width with everything else equal.
"""

from __future__ import annotations

from torch import Tensor, nn

from .. import checks as v
from ..backends import check_backend_name
from ..nn import recurrent_layers
from ..ops.cells import CELLS as _SPECS

CELLS = tuple(_SPECS)  # the cells' names (model.cell): lltm, lstm, gru, rnn, rnn_relu


def recurrent_layer(cell: str, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0,
                    bidirectional: bool = False, backend: str = "auto") -> nn.Module:
    """A time-major recurrent layer: ``layer(x (T, B, F) or PackedSequence, state=None) -> (output, state)``.

    Raises:
        ValueError: an unknown cell or backend, ``backend="torch"`` for a cell PyTorch lacks (the LLTM), or a
            bad size or dropout.
    """
    v.one_of("model", "cell", cell, CELLS)
    check_backend_name(backend, cell)
    dropout = v.probability("model", "dropout", dropout) if num_layers > 1 else 0.0  # between layers only
    if backend == "torch":
        v.positive_int("model", "hidden_size", hidden_size)
        v.positive_int("model", "num_layers", num_layers)
        return _SPECS[cell].torch_layer(input_size, hidden_size, num_layers=num_layers, dropout=dropout,
                                        bidirectional=bidirectional)
    return recurrent_layers(cell, input_size, hidden_size, num_layers=num_layers, dropout=dropout,
                            bidirectional=bidirectional, backend=backend)


def final_hidden(state) -> Tensor:
    """h_n (layers * directions, B, H) from a layer's final state: (h_n, c_n) for the cells with a c state,
    h_n alone for the others."""
    return state[0] if isinstance(state, tuple) else state
