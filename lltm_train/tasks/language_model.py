"""Per-step token prediction: character language modelling (and the copy task)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from .. import checks as v
from ..data.base import Batch
from ..models import CharLM
from .base import RecurrentTask, plain_zoneout
from .resume import CHECKPOINT_KEY


class LanguageModelTask(RecurrentTask):
    """Trains :class:`~lltm_train.models.CharLM` on (x, y) batches of token ids, each (B, T).

    Args:
        input_size: the vocabulary size (from the data set). output_size: classes per step.
        embedding_dim, hidden_size, num_layers, dropout, bidirectional, cell, backend, forget_bias, weight_drop,
            zoneout, num_heads: the network's (:class:`~lltm_train.models.CharLM`); their defaults live in ``conf/model/char_lm.yaml``.
        sample_length: characters generated after each validation (0: none); sample_temperature: their
            softmax temperature (> 0).
        stateful: carry the recurrent state from one batch to the next within a split (truncated
            backpropagation through time: detached, so gradients stop at the batch's first step), starting
            from zeros at each epoch, validation and test. For data sets whose batches are consecutive windows
            of streams (``Problem.stateful``, set from the data set). Checkpoints keep the training state.
        **kwargs: :class:`~lltm_train.tasks.RecurrentTask`'s.

    Logs ``{train,val,test}/loss`` (cross-entropy per token, nats), ``val/perplexity`` (exp of the loss),
    ``val/bpc`` (bits per token, loss / ln 2: bits per character on text) and ``val/acc`` (next-token
    accuracy). After each validation, when the data set can decode (its Problem has ``decode``), prints
    and logs (TensorBoard text ``sample``) a generated sample.
    """

    kinds = ("tokens",)
    metric_names = ("loss", "bpc", "perplexity", "acc")

    def __init__(self, input_size: int, output_size: int, *, embedding_dim: int, hidden_size: int, num_layers: int,
                 dropout: float, bidirectional: bool, cell: str, backend: str, sample_length: int,
                 sample_temperature: float, stateful: bool = False, forget_bias: float | None = None,
                 weight_drop: float = 0.0, zoneout: float | Sequence[float] = 0.0, num_heads: int = 1,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.uniform_loss = math.log(output_size)
        self.stateful = v.flag("LanguageModelTask", "stateful", stateful)
        self._carried: dict[str, object] = {}  # split -> the state after its last batch
        self.sample_length = v.non_negative_int("LanguageModelTask", "sample_length", sample_length, 100_000)
        self.sample_temperature = v.positive_finite("LanguageModelTask", "sample_temperature", sample_temperature)
        zoneout = plain_zoneout(zoneout)  # a Hydra list would not load with weights_only
        self.save_hyperparameters(ignore=["optimizer", "scheduler"], logger=False)  # callables do not load with weights_only
        self.net = CharLM(input_size, hidden_size, embedding_dim, num_layers, dropout, output_size, cell, backend,
                          bidirectional, forget_bias, weight_drop, zoneout, num_heads)
        self.metrics = torch.nn.ModuleDict(
            {s: torch.nn.ModuleDict({"nll": MeanMetric(), "acc": MulticlassAccuracy(output_size, average="micro")})
             for s in ("val", "test")}
        )

    def capture_refusal(self) -> str | None:
        if self.stateful:
            return "stateful=true carries the recurrent state from batch to batch"
        return super().capture_refusal()

    def step(self, batch: Batch, stage: str) -> Tensor:
        logits, state = self.net(batch.x.t(), self._carried.get(stage))  # time-major inside the network
        if self.stateful:
            self._carried[stage] = _detached(state)
        target = batch.y.t().reshape(-1)
        logits = logits.reshape(-1, logits.shape[-1])
        loss = F.cross_entropy(logits.float(), target)
        if stage in self.metrics:
            self.metrics[stage]["nll"].update(loss.detach(), weight=target.numel())
            self.metrics[stage]["acc"].update(logits.detach(), target)
        return loss

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if batch_idx == 0:  # an epoch's first batch (a resumed epoch goes on from its saved state)
            self._carried.pop("train", None)

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self._carried.pop("val", None)

    def on_test_epoch_start(self) -> None:
        self._carried.pop("test", None)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.stateful and "train" in self._carried:
            # Every process carries its own streams' rows; the checkpoint (written by process 0) holds all of
            # them, process r's batch rows after process r-1's. Every process saves, so the gather is safe.
            world = self.trainer.world_size
            state = _map(self._carried["train"], lambda t: torch.cat(list(self.all_gather(t)), 1) if world > 1 else t)
            checkpoint[CHECKPOINT_KEY]["carried_state"] = _detached(state, device="cpu")
            checkpoint[CHECKPOINT_KEY]["carried_world_size"] = world

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get(CHECKPOINT_KEY) or {}
        carried, world = saved.get("carried_state"), saved.get("carried_world_size", 1)
        self._carried = {}
        if not self.stateful or carried is None:
            return
        trainer = self._trainer
        rank, ours = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if world != ours:  # the streams are cut anew for another number of processes: their rows mean other text
            warnings.warn(f"the checkpoint carries the state of {world} process(es)' streams, this run has {ours}: "
                          "training goes on from a zero state", stacklevel=2)
            return
        self._carried = {"train": _map(carried, lambda t: t.chunk(world, 1)[rank])}

    def on_train_start(self) -> None:
        super().on_train_start()
        if "train" in self._carried:
            self._carried["train"] = _detached(self._carried["train"], device=self.device)

    def _log_epoch(self, stage: str) -> None:
        m = self.metrics[stage]
        nll = m["nll"].compute()  # torchmetrics sums the states of every process first: the same value on each
        self.log_dict({f"{stage}/perplexity": nll.exp(), f"{stage}/bpc": nll / math.log(2), f"{stage}/acc": m["acc"].compute()},
                      sync_dist=True)
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
        problem = getattr(getattr(self.trainer, "datamodule", None), "problem", None)
        if self.sample_length <= 0 or problem is None or problem.decode is None or not self.trainer.is_global_zero:
            return
        step = self.global_step if self.trainer.state.fn == "fit" else self.trained_steps  # lltm-evaluate: the checkpoint's
        loss = self.trainer.callback_metrics.get("val/loss")
        if loss is not None and not torch.isfinite(loss):  # a diverged model has no distribution to sample from
            self.print(f"\n--- no sample at step {step}: val/loss is {float(loss)} ---")
            return
        prompt = problem.encode("\n") or [0]
        generator = torch.Generator().manual_seed(step)
        text = problem.decode(self.net.generate(prompt, self.sample_length, self.sample_temperature, generator))
        self.print(f"\n--- sample at step {step} ---\n{text}\n---")
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("sample", f"```\n{text}\n```", step)


def _map(state, fn):
    """fn applied to each tensor of a recurrent state ((h, c) or h)."""
    return tuple(_map(t, fn) for t in state) if isinstance(state, (tuple, list)) else fn(state)


def _detached(state, device=None):
    """A recurrent state ((h, c) or h) cut from the graph, optionally moved."""
    if isinstance(state, (tuple, list)):
        return tuple(_detached(t, device) for t in state)
    return state.detach() if device is None else state.detach().to(device)
