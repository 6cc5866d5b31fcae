"""What the LightningModules share: optimiser and schedule, loss logging, clipping with the gradient norm,
a divergence check, and a lean step (no host synchronisation on steps that log nothing)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import lightning as L
import torch
from torch import Tensor, nn

from ..data.base import Batch


class LLTMTask(L.LightningModule, ABC):
    """Base LightningModule: subclasses build ``self.net`` and implement :meth:`step`.

    Args:
        optimizer: a partial optimiser taking the parameters (Hydra ``_partial_: true``), default AdamW(lr=3e-3).
        scheduler: a partial LR scheduler taking (optimizer, total_steps), where total_steps() returns the
            run's current number of optimiser steps (see :func:`~lltm_train.tasks.schedule.warmup_cosine`);
            stepped every optimiser step.
        compile: compile the network with ``torch.compile`` (``nn.Module.compile``; state dict keys unchanged).
        baseline_loss: validation loss of a trivial predictor, logged as ``val/baseline_loss``.

    ``kinds`` names the :class:`~lltm_train.data.TaskSpec` kinds a task trains on.
    """

    kinds: tuple[str, ...] = ()

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

    @abstractmethod
    def step(self, batch: Batch, stage: str) -> Tensor:
        """Computes the loss of a batch, updates the stage's metrics, returns the loss."""

    def num_parameters(self) -> int:
        """Trainable parameters of the network (logged to TensorBoard's hparams)."""
        return sum(p.numel() for p in self.net.parameters() if p.requires_grad)

    def _logs_this_step(self) -> bool:
        """Whether Lightning writes this training step's logs (and the first step, for the progress bar)."""
        trainer = self.trainer
        return (self.global_step == 0 or bool(trainer.fast_dev_run)
                or (self.global_step + 1) % max(1, trainer.log_every_n_steps) == 0)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = self.step(batch, "train")
        # Looked at on logging steps only, which read the loss anyway: a check on every step would stall the
        # GPU queue each time. A diverged run stays diverged (its weights are no longer finite), so the
        # check at the next logging step still catches it.
        if self._logs_this_step():
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"the training loss became {loss.item()} by step {self.global_step}; lower model.optimizer.lr or "
                    "set trainer.gradient_clip_val (the last checkpoint is kept; resume with ckpt_path=last)"
                )
            self.log("train/loss", loss, prog_bar=True, batch_size=batch.x.shape[0])
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.log("val/loss", self.step(batch, "val"), prog_bar=True, batch_size=batch.x.shape[0])

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self.log("test/loss", self.step(batch, "test"), batch_size=batch.x.shape[0])

    def on_validation_epoch_end(self) -> None:
        if self.baseline_loss is not None:
            self.log("val/baseline_loss", self.baseline_loss)
        if not self.trainer.sanity_checking:
            self.last_validated_step = self.global_step

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # One pass over the gradients gives the norm to clip by and the norm to log (before clipping).
        params = [p for p in self.net.parameters() if p.grad is not None]
        logs = self._logs_this_step()
        if gradient_clip_val is not None and gradient_clip_val > 0 and (gradient_clip_algorithm or "norm") == "norm":
            norm = torch.nn.utils.clip_grad_norm_(params, gradient_clip_val, foreach=True)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True) if logs else None
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if logs:
            self.log("train/grad_norm", norm, on_step=True, on_epoch=False)

    @staticmethod
    def count(batch: Batch) -> tuple[int, int]:
        """(sequences, time steps) in a batch; padded steps are not counted."""
        if batch.lengths is not None:
            return batch.x.shape[0], int(batch.lengths.sum())  # lengths are on the CPU
        return batch.x.shape[0], batch.x.shape[0] * batch.x.shape[1]

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer, total_steps=lambda: self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
