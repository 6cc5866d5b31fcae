"""Japanese Vowels (UCI; UEA multivariate archive): speaker recognition from variable-length utterances."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from .. import checks as v
from .base import Batch, Problem, SequenceDataModule, package_data_dir


def read_ts(path: Path) -> tuple[list[torch.Tensor], torch.Tensor, list[str]]:
    """Reads a multivariate sktime/UEA ``.ts`` file: (series, each (T_i, channels) float32; labels; class names)."""
    series, labels, classes = [], [], []
    in_data = False
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not in_data:
            if line.lower().startswith("@classlabel"):
                classes = line.split()[2:]
            in_data = line.lower() == "@data"
            continue
        *channels, label = line.split(":")
        try:
            values = [[float(v) for v in ch.split(",")] for ch in channels]
            series.append(v.finite_tensor("read_ts", f"{path}:{line_no}", torch.tensor(values, dtype=torch.float32).t().contiguous()))
        except ValueError as exc:  # ragged channels or a non-number
            raise ValueError(f"{path}:{line_no}: malformed series ({exc})") from None
        labels.append(classes.index(label))
    return series, torch.tensor(labels), classes


class SeriesDataset(torch.utils.data.Dataset):
    def __init__(self, series: list[torch.Tensor], labels: torch.Tensor) -> None:
        self.series, self.labels = series, labels

    def __len__(self) -> int:
        return len(self.series)

    def __getitem__(self, i: int):
        return self.series[i], self.labels[i]


class JapaneseVowelsDataModule(SequenceDataModule):
    """Japanese Vowels: 12 LPC cepstrum channels, 7 to 29 steps, 9 speakers (Kudo, Toyama & Shimbo 1999).

    Source: the ``sktime`` package (PyPI, 1.2.0), ``datasets/data/JapaneseVowels/*.ts``: 270 training and 370
    test utterances. A seeded ``val_fraction`` of the training set is held out for validation; the test file
    is the test split. Channels are standardised with the training split's mean and deviation.
    Batches are (x, lengths, y): x (B, T_max, 12) zero-padded, lengths (B,) int64, y (B,) int64.
    """

    def __init__(self, val_fraction: float = 0.15, split_seed: int = 0, batch_size: int = 32, num_workers: int = 0) -> None:
        super().__init__(batch_size, num_workers)
        self.val_fraction = v.fraction("JapaneseVowelsDataModule", "val_fraction", val_fraction)
        self.split_seed = split_seed
        self.folder = package_data_dir("sktime", "sktime==1.2.0") / "datasets" / "data" / "JapaneseVowels"
        self.problem = Problem("classification", 12, 9)

    def build(self) -> None:
        train, train_y, _ = read_ts(self.folder / "JapaneseVowels_TRAIN.ts")
        test, test_y, _ = read_ts(self.folder / "JapaneseVowels_TEST.ts")
        steps = torch.cat(train)
        mean, std = steps.mean(0), steps.std(0)
        train, test = [(s - mean) / std for s in train], [(s - mean) / std for s in test]
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(self.split_seed)).tolist()
        n_val = max(1, int(len(train) * self.val_fraction))
        val_idx, train_idx = order[:n_val], order[n_val:]
        self.train_set = SeriesDataset([train[i] for i in train_idx], train_y[train_idx])
        self.val_set = SeriesDataset([train[i] for i in val_idx], train_y[val_idx])
        self.test_set = SeriesDataset(test, test_y)

    def collate(self, samples) -> Batch:
        series, labels = zip(*samples)
        lengths = torch.tensor([len(s) for s in series])
        return Batch(pad_sequence(list(series), batch_first=True), lengths, torch.stack(labels))
