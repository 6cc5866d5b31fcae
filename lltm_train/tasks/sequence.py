"""Per-sequence targets: classification (accuracy) and regression / forecasting (MSE)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanAbsoluteError
from torchmetrics.classification import MulticlassAccuracy

from ..data.base import Batch
from ..models import SequenceClassifier, SequenceRegressor
from .base import RecurrentTask, plain_zoneout


class ClassificationTask(RecurrentTask):
    """Trains :class:`~lltm_train.models.SequenceClassifier` on (x, y) or (x, lengths, y) batches.

    Args:
        input_size: features per step; output_size: classes (both from the data set).
        hidden_size, num_layers, dropout, bidirectional, cell, backend, forget_bias, weight_drop, zoneout, num_heads:
            the network's (forget_bias, weight_drop, zoneout, num_heads: :func:`~lltm_train.models.recurrent_layer`); their defaults live
            in ``conf/model/classifier.yaml``.
        **kwargs: :class:`~lltm_train.tasks.RecurrentTask`'s.

    Logs ``{train,val,test}/loss`` (cross-entropy, nats) and ``{val,test}/acc``.
    """

    kinds = ("classification",)
    metric_names = ("loss", "acc")

    def __init__(self, input_size: int, output_size: int, *, hidden_size: int, num_layers: int, dropout: float,
                 bidirectional: bool, cell: str, backend: str, forget_bias: float | None = None,
                 weight_drop: float = 0.0, zoneout: float | Sequence[float] = 0.0, num_heads: int = 1,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.uniform_loss = math.log(output_size)
        zoneout = plain_zoneout(zoneout)  # a Hydra list would not load with weights_only
        self.save_hyperparameters(ignore=["optimizer", "scheduler"], logger=False)  # callables do not load with weights_only
        self.net = SequenceClassifier(input_size, output_size, hidden_size, num_layers=num_layers, dropout=dropout,
                                      bidirectional=bidirectional, cell=cell, backend=backend, forget_bias=forget_bias,
                                      weight_drop=weight_drop, zoneout=zoneout, num_heads=num_heads)
        self.acc = torch.nn.ModuleDict({s: MulticlassAccuracy(output_size, average="micro") for s in ("val", "test")})

    def step(self, batch: Batch, stage: str) -> Tensor:
        logits = self.net(batch.x, batch.lengths).float()
        if stage in self.acc:
            self.acc[stage].update(logits.detach(), batch.y)
            self.log(f"{stage}/acc", self.acc[stage], prog_bar=stage == "val")
        return F.cross_entropy(logits, batch.y)


class RegressionTask(RecurrentTask):
    """Trains :class:`~lltm_train.models.SequenceRegressor` on (x, y) batches, y (B, output_size).

    Args: as :class:`ClassificationTask` (output_size: targets per sequence; defaults in
    ``conf/model/regressor.yaml``).

    Logs ``{train,val,test}/loss`` (mean squared error in the data's units) and ``{val,test}/mae``; when the
    data set's Problem has a ``scale`` other than 1 (units per standardised unit, e.g. CO2 ppm) also
    ``{val,test}/mae_units``.
    """

    kinds = ("regression",)
    metric_names = ("loss", "mae", "mae_units")

    def __init__(self, input_size: int, output_size: int, *, hidden_size: int, num_layers: int, dropout: float,
                 bidirectional: bool, cell: str, backend: str, forget_bias: float | None = None,
                 weight_drop: float = 0.0, zoneout: float | Sequence[float] = 0.0, num_heads: int = 1,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        zoneout = plain_zoneout(zoneout)  # a Hydra list would not load with weights_only
        self.save_hyperparameters(ignore=["optimizer", "scheduler"], logger=False)  # callables do not load with weights_only
        self.net = SequenceRegressor(input_size, output_size, hidden_size, num_layers=num_layers, dropout=dropout,
                                     bidirectional=bidirectional, cell=cell, backend=backend, forget_bias=forget_bias,
                                     weight_drop=weight_drop, zoneout=zoneout, num_heads=num_heads)
        self.mae = torch.nn.ModuleDict({s: MeanAbsoluteError() for s in ("val", "test")})
        self.mae_units = torch.nn.ModuleDict({s: MeanAbsoluteError() for s in ("val", "test")})  # in the data's units

    def logged_metrics(self, problem) -> list[str]:
        # mae_units only where the data has units (a scale other than 1), as step() logs it
        return [n for n in self.metric_names if n != "mae_units" or problem.scale != 1.0]

    def step(self, batch: Batch, stage: str) -> Tensor:
        pred = self.net(batch.x, batch.lengths).float()
        if stage in self.mae:
            self.mae[stage].update(pred.detach(), batch.y)
            self.log(f"{stage}/mae", self.mae[stage])
            problem = getattr(getattr(self.trainer, "datamodule", None), "problem", None)
            if problem is not None and problem.scale != 1.0:
                self.mae_units[stage].update(pred.detach() * problem.scale, batch.y * problem.scale)
                self.log(f"{stage}/mae_units", self.mae_units[stage])
        return F.mse_loss(pred, batch.y)
