"""Per-sequence targets: classification (accuracy) and regression / forecasting (MSE)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanAbsoluteError
from torchmetrics.classification import MulticlassAccuracy

from ..models import SequenceClassifier, SequenceRegressor
from .base import LLTMTask


def _unpack(batch):
    return batch if len(batch) == 3 else (batch[0], None, batch[1])


class ClassificationTask(LLTMTask):
    """Trains :class:`~lltm_train.models.SequenceClassifier` on (x, y) or (x, lengths, y) batches.

    Logs ``{train,val,test}/loss`` (cross-entropy, nats) and ``{val,test}/acc``.
    """

    def __init__(self, input_size: int, num_classes: int, hidden_size: int = 128, num_layers: int = 1, dropout: float = 0.0,
                 bidirectional: bool = False, backend: str = "auto", **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"], logger=False)  # callables do not load with weights_only
        self.net = SequenceClassifier(input_size, num_classes, hidden_size=hidden_size, num_layers=num_layers,
                                      dropout=dropout, bidirectional=bidirectional, backend=backend)
        self.acc = torch.nn.ModuleDict({s: MulticlassAccuracy(num_classes, average="micro") for s in ("val", "test")})

    def step(self, batch, stage: str) -> Tensor:
        x, lengths, y = _unpack(batch)
        logits = self.net(x, lengths).float()
        if stage in self.acc:
            self.acc[stage].update(logits.detach(), y)
            self.log(f"{stage}/acc", self.acc[stage], prog_bar=stage == "val")
        return F.cross_entropy(logits, y)


class RegressionTask(LLTMTask):
    """Trains :class:`~lltm_train.models.SequenceRegressor` on (x, y) batches, y (B, output_size).

    Logs ``{train,val,test}/loss`` (mean squared error in the data's units) and ``{val,test}/mae``; with a
    data module that has a ``scale`` (units per standardised unit, e.g. CO2 ppm) also ``{val,test}/mae_units``.
    """

    def __init__(self, input_size: int, output_size: int, hidden_size: int = 128, num_layers: int = 1, dropout: float = 0.0,
                 bidirectional: bool = False, backend: str = "auto", **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"], logger=False)  # callables do not load with weights_only
        self.net = SequenceRegressor(input_size, output_size, hidden_size=hidden_size, num_layers=num_layers,
                                     dropout=dropout, bidirectional=bidirectional, backend=backend)
        self.mae = torch.nn.ModuleDict({s: MeanAbsoluteError() for s in ("val", "test")})

    def step(self, batch, stage: str) -> Tensor:
        x, lengths, y = _unpack(batch)
        pred = self.net(x, lengths).float()
        if stage in self.mae:
            self.mae[stage].update(pred.detach(), y)
            self.log(f"{stage}/mae", self.mae[stage])
            scale = getattr(getattr(self.trainer, "datamodule", None), "scale", None)
            if scale is not None and scale != 1.0:
                self.log(f"{stage}/mae_units", (pred.detach() - y).abs().mean() * scale)
        return F.mse_loss(pred, y)
