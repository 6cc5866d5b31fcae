"""``torch.nn``-style modules of every cell: one step (:class:`LLTMCell`, :class:`LSTMCell`, :class:`GRUCell`,
:class:`RNNCell`, :class:`SLSTMCell`) and layers over sequences (:class:`LLTM`, :class:`LSTM`, :class:`GRU`, :class:`RNN`,
:class:`SLSTM`); any cell of
:mod:`lltm_train.ops.cells` through :class:`RecurrentCell`, :class:`RecurrentLayers`, :func:`recurrent_cell` or
:func:`recurrent_layers`."""

from .cell import GRUCell, LLTMCell, LSTMCell, RecurrentCell, RNNCell, SLSTMCell, recurrent_cell
from .rnn import GRU, LLTM, LSTM, RNN, SLSTM, RecurrentLayers, recurrent_layers

__all__ = ["GRU", "GRUCell", "LLTM", "LLTMCell", "LSTM", "LSTMCell", "RNN", "RNNCell", "RecurrentCell",
           "RecurrentLayers", "SLSTM", "SLSTMCell", "recurrent_cell", "recurrent_layers"]
