"""Forecasting the weekly Mauna Loa CO2 series (statsmodels' ``co2`` data set)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from dataclasses import replace

from .. import checks as v
from .base import Problem, SequenceDataModule


class CO2DataModule(SequenceDataModule):
    """Predict the next ``horizon`` weeks of atmospheric CO2 from the previous ``context`` weeks.

    Source: ``statsmodels.api.datasets.co2`` (Mauna Loa Observatory, 1958-03 to 2001-12, 2,284 weekly
    values, 59 missing and filled by linear interpolation; public domain). The series is split in time:
    the first part trains, then validation, then test (each window lies inside its split). Values are
    standardised with the training split's mean and deviation (the Problem's ``scale``: ppm per unit).
    Batches are (x, y): x (B, context, 1) and y (B, horizon), float32, standardised.
    """

    def __init__(self, context: int = 104, horizon: int = 4, val_fraction: float = 0.15, test_fraction: float = 0.15,
                 batch_size: int = 64, num_workers: int = 0) -> None:
        super().__init__(batch_size, num_workers)
        owner = "CO2DataModule"
        self.context = v.positive_int(owner, "context", context)
        self.horizon = v.positive_int(owner, "horizon", horizon)
        self.val_fraction = v.fraction(owner, "val_fraction", val_fraction)
        self.test_fraction = v.fraction(owner, "test_fraction", test_fraction)
        self.problem = Problem("regression", 1, self.horizon)

    def build(self) -> None:
        import statsmodels.api as sm

        values = sm.datasets.co2.load_pandas().data["co2"].interpolate(method="linear").to_numpy()
        series = v.finite_tensor("CO2DataModule", "the interpolated series", torch.tensor(values, dtype=torch.float32))
        n = len(series)
        n_test, n_val = int(n * self.test_fraction), int(n * self.val_fraction)
        bounds = [(0, n - n_val - n_test), (n - n_val - n_test, n - n_test), (n - n_test, n)]
        window = self.context + self.horizon
        if min(b - a for a, b in bounds) < window:
            raise ValueError(f"CO2DataModule: context + horizon = {window} weeks do not fit in every split of the {n}-week series")
        train = series[: bounds[0][1]]
        mean, std = train.mean(), train.std()
        self.problem = replace(self.problem, scale=float(std))
        sets = []
        for a, b in bounds:
            windows = ((series[a:b] - mean) / std).unfold(0, window, 1)  # (N, context + horizon)
            sets.append(TensorDataset(windows[:, : self.context, None].contiguous(), windows[:, self.context :].contiguous()))
        self.train_set, self.val_set, self.test_set = sets
