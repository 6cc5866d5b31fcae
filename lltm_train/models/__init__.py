"""Networks for the three task kinds, each built around :class:`lltm_train.nn.LLTM`."""

from .char_lm import CharLM
from .sequence import SequenceClassifier, SequenceRegressor

__all__ = ["CharLM", "SequenceClassifier", "SequenceRegressor"]
