"""LightningModules, one per problem kind (:class:`lltm_train.data.Problem`), on :class:`RecurrentTask`."""

from .base import LLTMTask, RecurrentTask
from .language_model import LanguageModelTask
from .sequence import ClassificationTask, RegressionTask

__all__ = ["ClassificationTask", "LLTMTask", "LanguageModelTask", "RecurrentTask", "RegressionTask"]
