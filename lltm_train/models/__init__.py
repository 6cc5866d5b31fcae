"""Networks for the three task kinds, each built around a recurrent layer (:mod:`.recurrent`)."""

from .char_lm import CharLM
from .recurrent import CELLS, recurrent_layer
from .sequence import SequenceClassifier, SequenceRegressor

__all__ = ["CELLS", "CharLM", "SequenceClassifier", "SequenceRegressor", "recurrent_layer"]
