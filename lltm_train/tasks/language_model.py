"""Per-step token prediction: character language modelling (and the copy task)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from ..models import CharLM
from .base import LLTMTask


class LanguageModelTask(LLTMTask):
    """Trains :class:`~lltm_train.models.CharLM` on (x, y) batches of token ids, each (B, T).

    Logs ``{train,val,test}/loss`` (cross-entropy per token, nats), ``val/perplexity`` (exp of the loss),
    ``val/bpc`` (bits per token, loss / ln 2: bits per character on text) and ``val/acc`` (next-token
    accuracy). After each validation, when the data module can decode (text data sets), prints and logs
    (TensorBoard text ``sample``) ``sample_length`` generated characters.
    """

    def __init__(self, vocab_size: int, num_classes: int | None = None, embedding_dim: int = 64, hidden_size: int = 256,
                 num_layers: int = 1, dropout: float = 0.0, backend: str = "auto", sample_length: int = 200,
                 sample_temperature: float = 0.8, **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(sample_length, bool) or not isinstance(sample_length, int) or not 0 <= sample_length <= 100_000:
            raise ValueError(f"LanguageModelTask: sample_length must be an integer in [0, 100000], got {sample_length!r}")
        if not (isinstance(sample_temperature, (int, float)) and 0 < sample_temperature < float("inf")):
            raise ValueError(f"LanguageModelTask: sample_temperature must be a positive number, got {sample_temperature!r}")
        self.save_hyperparameters(ignore=["optimizer", "scheduler"], logger=False)  # callables do not load with weights_only
        self.net = CharLM(vocab_size, embedding_dim, hidden_size, num_layers, dropout, num_classes, backend)
        classes = num_classes or vocab_size
        self.metrics = torch.nn.ModuleDict(
            {s: torch.nn.ModuleDict({"nll": MeanMetric(), "acc": MulticlassAccuracy(classes, average="micro")}) for s in ("val", "test")}
        )
        self.sample_length, self.sample_temperature = sample_length, sample_temperature

    def step(self, batch, stage: str) -> Tensor:
        x, y = batch
        logits, _ = self.net(x.t())  # time-major inside the network
        target = y.t().reshape(-1)
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
        data = getattr(self.trainer, "datamodule", None)
        if self.sample_length <= 0 or not hasattr(data, "decode"):
            return
        prompt = data.encode("\n") or [0]
        generator = torch.Generator().manual_seed(self.global_step)
        text = data.decode(self.net.generate(prompt, self.sample_length, self.sample_temperature, generator))
        self.print(f"\n--- sample at step {self.global_step} ---\n{text}\n---")
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("sample", f"```\n{text}\n```", self.global_step)
