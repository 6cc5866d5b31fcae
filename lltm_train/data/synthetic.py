"""Synthetic long-memory benchmarks, generated from a seed: the adding problem and the copy task."""

from __future__ import annotations

import math
from abc import abstractmethod

import torch
from torch.utils.data import TensorDataset

from .. import checks as v
from .base import Problem, SequenceDataModule


class _Generated(SequenceDataModule):
    """Three splits of train_size, val_size and test_size samples, drawn in that order from one seed."""

    def __init__(self, train_size: int, val_size: int, test_size: int, seed: int, batch_size: int,
                 num_workers: int) -> None:
        super().__init__(batch_size, num_workers)
        owner = type(self).__name__
        self.sizes = tuple(v.positive_int(owner, name, n) for name, n in
                           (("train_size", train_size), ("val_size", val_size), ("test_size", test_size)))
        self.seed = seed

    def build(self) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        self.train_set, self.val_set, self.test_set = (TensorDataset(*self.generate(n, generator)) for n in self.sizes)

    @abstractmethod
    def generate(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n samples: (inputs, targets)."""


class AddingDataModule(_Generated):
    """The adding problem (Hochreiter & Schmidhuber 1997; as in Arjovsky, Shah & Bengio 2016).

    Each step carries (value ~ U(0, 1), marker); exactly two markers are 1, one in each half of the
    sequence, and the target is the sum of the two marked values. Predicting the mean (1) gives an MSE of
    1/6: :attr:`problem` carries it as the baseline. Batches are (x (B, seq_len, 2), y (B, 1)), float32.
    """

    def __init__(self, seq_len: int = 100, train_size: int = 10000, val_size: int = 1000, test_size: int = 1000,
                 seed: int = 0, batch_size: int = 64, num_workers: int = 0) -> None:
        super().__init__(train_size, val_size, test_size, seed, batch_size, num_workers)
        self.seq_len = v.positive_int("AddingDataModule", "seq_len", seq_len)
        if self.seq_len < 2:
            raise ValueError("AddingDataModule: seq_len must be at least 2")
        self.problem = Problem("regression", 2, 1, baseline_loss=1 / 6)

    def generate(self, n: int, generator: torch.Generator):
        T, half = self.seq_len, self.seq_len // 2
        values = torch.rand(n, T, generator=generator)
        first = torch.randint(0, half, (n,), generator=generator)
        second = torch.randint(half, T, (n,), generator=generator)
        markers = torch.zeros(n, T)
        rows = torch.arange(n)
        markers[rows, first] = 1.0
        markers[rows, second] = 1.0
        target = values[rows, first] + values[rows, second]
        return torch.stack([values, markers], -1), target[:, None]


class CopyDataModule(_Generated):
    """The copy task (Hochreiter & Schmidhuber 1997; Arjovsky, Shah & Bengio 2016).

    Input: ``length`` symbols drawn from 1..8, ``delay - 1`` blanks (0), a delimiter (9), then ``length``
    blanks; target: blanks until the delimiter's step and after, the symbols in the last ``length`` steps.
    A memoryless predictor's cross-entropy is length * ln 8 / (delay + 2 * length), the baseline in :attr:`problem`.
    Batches are (x, y), each (B, delay + 2 * length) int64; 10 input symbols, 9 output classes.
    """

    def __init__(self, delay: int = 100, length: int = 10, train_size: int = 10000, val_size: int = 1000,
                 test_size: int = 1000, seed: int = 0, batch_size: int = 64, num_workers: int = 0) -> None:
        super().__init__(train_size, val_size, test_size, seed, batch_size, num_workers)
        self.delay = v.positive_int("CopyDataModule", "delay", delay)
        self.length = v.positive_int("CopyDataModule", "length", length)
        total = self.delay + 2 * self.length
        self.problem = Problem("tokens", 10, 9, baseline_loss=self.length * math.log(8) / total)

    def generate(self, n: int, generator: torch.Generator):
        k, total = self.length, self.delay + 2 * self.length
        symbols = torch.randint(1, 9, (n, k), generator=generator)
        x = torch.zeros(n, total, dtype=torch.long)
        x[:, :k] = symbols
        x[:, self.delay + k - 1] = 9
        y = torch.zeros(n, total, dtype=torch.long)
        y[:, -k:] = symbols
        return x, y
