"""The recurrent layer of every model: the fused LLTM, LSTM or GRU (:mod:`lltm_train.nn`), or with
``backend="torch"`` PyTorch's own ``torch.nn.LSTM``/``GRU`` (cuDNN on a GPU, oneDNN on a CPU), the baseline.

All of them share one parameter layout per cell (``torch.nn``'s names and shapes), so a checkpoint moves
between backends, ``torch`` included, and a sweep over ``model.cell`` or ``backend`` compares them at equal
width with everything else equal.
"""

from __future__ import annotations

from torch import Tensor, nn

from .. import validation as v
from ..backends import check_backend_name
from ..nn import GRU, LLTM, LSTM
from ..ops.cells import CELLS as _SPECS

CELLS = tuple(_SPECS)  # lltm, lstm, gru
_FUSED = {"lltm": LLTM, "lstm": LSTM, "gru": GRU}
_TORCH = {"lstm": nn.LSTM, "gru": nn.GRU}


def recurrent_layer(cell: str, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0,
                    bidirectional: bool = False, backend: str = "auto") -> nn.Module:
    """A time-major recurrent layer: ``layer(x (T, B, F) or PackedSequence, state=None) -> (output, state)``.

    Raises:
        ValueError: an unknown cell or backend, ``backend="torch"`` with the LLTM, or a bad size or dropout.
    """
    v.one_of("model", "cell", cell, CELLS)
    check_backend_name(backend, cell)
    dropout = v.probability("model", "dropout", dropout) if num_layers > 1 else 0.0  # between layers only
    if backend == "torch":
        v.positive_int("model", "hidden_size", hidden_size)
        v.positive_int("model", "num_layers", num_layers)
        return _TORCH[cell](input_size, hidden_size, num_layers, dropout=dropout, bidirectional=bidirectional)
    return _FUSED[cell](input_size, hidden_size, num_layers, dropout=dropout, bidirectional=bidirectional,
                        backend=backend)


def final_hidden(state) -> Tensor:
    """h_n (layers * directions, B, H) from a layer's final state: (h_n, c_n) for LLTM and LSTM, h_n for GRU."""
    return state[0] if isinstance(state, tuple) else state
