"""LightningModules, one per task kind (:class:`lltm_train.data.TaskSpec`)."""

from .base import LLTMTask
from .language_model import LanguageModelTask
from .sequence import ClassificationTask, RegressionTask

__all__ = ["ClassificationTask", "LLTMTask", "LanguageModelTask", "RegressionTask"]
