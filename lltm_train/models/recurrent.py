"""The recurrent layer of every model: the LLTM, or a ``torch.nn`` baseline of the same width.

``cell="lstm"`` and ``cell="gru"`` build ``torch.nn.LSTM`` / ``torch.nn.GRU`` (cuDNN on a GPU) with the same
input size, hidden size, layers, dropout and directions, so a sweep over ``model.cell`` compares the cells
at equal width and with everything else equal. ``backend`` applies to the LLTM only.
"""

from __future__ import annotations

from torch import Tensor, nn

from .. import validation as v
from ..nn import LLTM

CELLS = ("lltm", "lstm", "gru")


def recurrent_layer(cell: str, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0,
                    bidirectional: bool = False, backend: str = "auto") -> nn.Module:
    """A time-major recurrent layer: ``layer(x (T, B, F) or PackedSequence, state=None) -> (output, state)``.

    Raises:
        ValueError: an unknown cell, or a bad size or dropout.
    """
    v.one_of("model", "cell", cell, CELLS)
    dropout = v.probability("model", "dropout", dropout) if num_layers > 1 else 0.0  # between layers only
    if cell == "lltm":
        return LLTM(input_size, hidden_size, num_layers, dropout=dropout, bidirectional=bidirectional, backend=backend)
    v.positive_int("model", "hidden_size", hidden_size)
    v.positive_int("model", "num_layers", num_layers)
    baseline = nn.LSTM if cell == "lstm" else nn.GRU
    return baseline(input_size, hidden_size, num_layers, dropout=dropout, bidirectional=bidirectional)


def final_hidden(state) -> Tensor:
    """h_n (layers * directions, B, H) from a layer's final state: (h_n, c_n) for LLTM and LSTM, h_n for GRU."""
    return state[0] if isinstance(state, tuple) else state
