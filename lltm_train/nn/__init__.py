"""``torch.nn``-style modules of every cell: one step (:class:`LLTMCell`, :class:`LSTMCell`, :class:`GRUCell`)
and layers over sequences (:class:`LLTM`, :class:`LSTM`, :class:`GRU`)."""

from .cell import GRUCell, LLTMCell, LSTMCell
from .rnn import GRU, LLTM, LSTM

__all__ = ["GRU", "GRUCell", "LLTM", "LLTMCell", "LSTM", "LSTMCell"]
