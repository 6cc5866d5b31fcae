"""LightningDataModules, one per ``dataset=`` choice (see ``conf/dataset/``)."""

from .base import Batch, Problem, SequenceDataModule, TaskSpec
from .co2 import CO2DataModule
from .japanese_vowels import JapaneseVowelsDataModule
from .smnist import SequentialMNISTDataModule
from .synthetic import AddingDataModule, CopyDataModule
from .text import ShakespeareDataModule, TextDataModule

__all__ = [
    "AddingDataModule",
    "Batch",
    "CO2DataModule",
    "CopyDataModule",
    "JapaneseVowelsDataModule",
    "Problem",
    "SequenceDataModule",
    "SequentialMNISTDataModule",
    "ShakespeareDataModule",
    "TaskSpec",
    "TextDataModule",
]
