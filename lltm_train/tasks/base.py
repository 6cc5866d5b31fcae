"""What the LightningModules share: optimiser and schedule, loss logging, gradient norm, divergence check."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
from lightning.pytorch.utilities import grad_norm
from torch import Tensor, nn


class LLTMTask(L.LightningModule):
    """Base LightningModule: subclasses build ``self.net`` and implement :meth:`step`.

    Args:
        optimizer: a partial optimiser taking the parameters (Hydra ``_partial_: true``), default AdamW(lr=3e-3).
        scheduler: a partial LR scheduler taking (optimizer, total_steps), where total_steps() returns the
            run's current number of optimiser steps (see :func:`~lltm_train.tasks.schedule.warmup_cosine`);
            stepped every optimiser step.
        compile: compile the network with ``torch.compile`` (``nn.Module.compile``; state dict keys unchanged).
        baseline_loss: validation loss of a trivial predictor, logged as ``val/baseline_loss``.
    """

    def __init__(self, optimizer: Callable | None = None, scheduler: Callable | None = None, compile: bool = False,
                 baseline_loss: float | None = None) -> None:
        super().__init__()
        self.optimizer_factory = optimizer or (lambda params: torch.optim.AdamW(params, lr=3e-3))
        self.scheduler_factory = scheduler
        self.compile_net = compile
        self.baseline_loss = baseline_loss
        self.last_validated_step = -1
        self.net: nn.Module

    def setup(self, stage: str) -> None:
        if self.compile_net and not getattr(self, "_compiled", False):
            self.net.compile()
            self._compiled = True

    def step(self, batch, stage: str) -> Tensor:
        """Computes the loss of a batch, updates the stage's metrics, returns the loss."""
        raise NotImplementedError

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self.step(batch, "train")
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"the training loss became {loss.item()} at step {self.global_step}; lower model.optimizer.lr or set "
                "trainer.gradient_clip_val (the last checkpoint is kept; resume with ckpt_path=last)"
            )
        self.log("train/loss", loss, prog_bar=True, batch_size=self.count(batch)[0])
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        self.log("val/loss", self.step(batch, "val"), prog_bar=True, batch_size=self.count(batch)[0])

    def test_step(self, batch, batch_idx: int) -> None:
        self.log("test/loss", self.step(batch, "test"), batch_size=self.count(batch)[0])

    def on_validation_epoch_end(self) -> None:
        if self.baseline_loss is not None:
            self.log("val/baseline_loss", self.baseline_loss)
        if not self.trainer.sanity_checking:
            self.last_validated_step = self.global_step

    def on_before_optimizer_step(self, optimizer) -> None:
        # before clipping: the norm the optimiser would have seen without it
        self.log("train/grad_norm", grad_norm(self.net, norm_type=2)["grad_2.0_norm_total"])

    @staticmethod
    def count(batch) -> tuple[int, int]:
        """(sequences, time steps) in a batch; padded steps of (x, lengths, y) batches are not counted."""
        x = batch[0]
        if len(batch) == 3:
            return x.shape[0], int(batch[1].sum())
        return x.shape[0], x.shape[0] * x.shape[1]

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer, total_steps=lambda: self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
