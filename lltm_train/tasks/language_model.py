"""Per-step token prediction: character language modelling (and the copy task)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from .. import validation as v
from ..data.base import Batch
from ..models import CharLM
from .base import LLTMTask


class LanguageModelTask(LLTMTask):
    """Trains :class:`~lltm_train.models.CharLM` on (x, y) batches of token ids, each (B, T).

    Args:
        input_size: the vocabulary size (from the data set). output_size: classes per step.
        embedding_dim, hidden_size, num_layers, dropout, bidirectional, cell, backend: the network's
            (:class:`~lltm_train.models.CharLM`); their defaults live in ``conf/model/char_lm.yaml``.
        sample_length: characters generated after each validation (0: none); sample_temperature: their
            softmax temperature (> 0).
        **kwargs: :class:`LLTMTask`'s.

    Logs ``{train,val,test}/loss`` (cross-entropy per token, nats), ``val/perplexity`` (exp of the loss),
    ``val/bpc`` (bits per token, loss / ln 2: bits per character on text) and ``val/acc`` (next-token
    accuracy). After each validation, when the data set can decode (its TaskSpec has ``decode``), prints
    and logs (TensorBoard text ``sample``) a generated sample.
    """

    kinds = ("tokens",)

    def __init__(self, input_size: int, output_size: int, *, embedding_dim: int, hidden_size: int, num_layers: int,
                 dropout: float, bidirectional: bool, cell: str, backend: str, sample_length: int,
                 sample_temperature: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sample_length = v.non_negative_int("LanguageModelTask", "sample_length", sample_length, 100_000)
        self.sample_temperature = v.positive_finite("LanguageModelTask", "sample_temperature", sample_temperature)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"], logger=False)  # callables do not load with weights_only
        self.net = CharLM(input_size, hidden_size, embedding_dim, num_layers, dropout, output_size, cell, backend,
                          bidirectional)
        self.metrics = torch.nn.ModuleDict(
            {s: torch.nn.ModuleDict({"nll": MeanMetric(), "acc": MulticlassAccuracy(output_size, average="micro")})
             for s in ("val", "test")}
        )

    def step(self, batch: Batch, stage: str) -> Tensor:
        logits, _ = self.net(batch.x.t())  # time-major inside the network
        target = batch.y.t().reshape(-1)
        logits = logits.reshape(-1, logits.shape[-1])
        loss = F.cross_entropy(logits.float(), target)
        if stage in self.metrics:
            self.metrics[stage]["nll"].update(loss.detach(), weight=target.numel())
            self.metrics[stage]["acc"].update(logits.detach(), target)
        return loss

    def _log_epoch(self, stage: str) -> None:
        m = self.metrics[stage]
        nll = m["nll"].compute()
        self.log_dict({f"{stage}/perplexity": nll.exp(), f"{stage}/bpc": nll / math.log(2), f"{stage}/acc": m["acc"].compute()})
        m["nll"].reset()
        m["acc"].reset()

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self._log_epoch("val")
        if not self.trainer.sanity_checking:
            self._sample()

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def _sample(self) -> None:
        spec = getattr(getattr(self.trainer, "datamodule", None), "task", None)
        if self.sample_length <= 0 or spec is None or spec.decode is None:
            return
        prompt = spec.encode("\n") or [0]
        generator = torch.Generator().manual_seed(self.global_step)
        text = spec.decode(self.net.generate(prompt, self.sample_length, self.sample_temperature, generator))
        self.print(f"\n--- sample at step {self.global_step} ---\n{text}\n---")
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("sample", f"```\n{text}\n```", self.global_step)
