"""The LightningModule that every task builds on: a recurrent network of any cell trained on a sequence
problem. Its hooks delegate each concern to a small piece of its own:

- the optimiser and its schedule: :mod:`lltm_train.tasks.optimiser`;
- which steps log, and the training loss they log: :mod:`lltm_train.tasks.loss_log`;
- clipping, the non-finite guard and its count of skipped steps: :mod:`lltm_train.tasks.guard`;
- divergence: :mod:`lltm_train.tasks.divergence`;
- the whole step as one CUDA graph: :mod:`lltm_train.tasks.captured`;
- the seconds trained and the time budget: :mod:`lltm_train.tasks.budget`;
- what a checkpoint carries for a resume: :mod:`lltm_train.tasks.resume`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor, nn
from torchmetrics import MeanMetric

from ..data.base import Batch
from .budget import BudgetNotice, TrainingClock, planned_steps, spent_budget
from .captured import CapturedStep, capture_training
from .divergence import DIVERGENCE_FACTOR, DivergedError, DivergenceWatch
from .guard import NonFiniteError, NonFiniteGuard
from .loss_log import host_mean, logs_this_step
from .optimiser import configure_optimizers, default_optimizer
from .resume import CHECKPOINT_KEY, ResumedState, saved_state

__all__ = ["DIVERGENCE_FACTOR", "DivergedError", "LLTMTask", "NonFiniteError", "RecurrentTask"]

_warn = rank_zero_only(logging.getLogger("lltm_train").warning)
_info = rank_zero_only(logging.getLogger("lltm_train").info)


class RecurrentTask(L.LightningModule, ABC):
    """Base LightningModule: subclasses build ``self.net`` (a recurrent network of any cell) and implement
    :meth:`step`.

    Args:
        optimizer: a partial optimiser taking the parameters (Hydra ``_partial_: true``), default AdamW(lr=3e-3).
        scheduler: a partial LR scheduler taking (optimizer, total_steps), where total_steps() returns the
            run's current number of optimiser steps (see :func:`~lltm_train.tasks.schedule.warmup_cosine`;
            with ``trainer.max_time``, the steps the time left allows: :mod:`lltm_train.tasks.budget`);
            stepped every optimiser step.
        compile: compile the network with ``torch.compile`` (``nn.Module.compile``; state dict keys unchanged).
        baseline_loss: validation loss of a trivial predictor, logged as ``val/baseline_loss``.
        nonfinite: what a step whose gradients are not all finite (NaN or inf) does. Either way the step is
            not applied: the weights and the optimiser's state stay as they were. ``"stop"``: training stops
            at the next logging step with :class:`NonFiniteError` (and the last good state can be saved);
            ``"skip"``: training goes on. The count of such steps is logged as ``train/skipped_steps``.
            With a fused optimiser (``fused=True``, the default AdamW) the step is skipped on the device,
            with no synchronisation; with others, at the cost of one synchronisation a step
            (:class:`~lltm_train.tasks.guard.NonFiniteGuard`).
        divergence: what a run that diverges does (its losses stay finite but the model is lost; the
            non-finite policy does not see it). Looked at on logging steps and at each validation, from the
            losses they read anyway (the logging steps' non-finite check already waits for the loss; the
            other steps never wait). A run has diverged when every training loss logged since the last
            validation (at least five) is more than ``DIVERGENCE_FACTOR`` (1.5) times the best mean of an
            earlier validation interval's logged losses (a mean: one lucky batch sets no bar); or when the
            validation loss is more than 1.5 times ``baseline_loss`` (the trivial predictor's) after it had
            been below it, or more than 1.5 times the loss of a uniform guess over the classes
            (:attr:`uniform_loss`, ln C, for the tasks that predict classes). Either way one line says so,
            ``train/diverged`` is logged (1) and :attr:`diverged` holds the reason; ``"warn"`` goes on,
            ``"stop"`` ends training with :class:`DivergedError`, whose message names the best checkpoint so
            far when there is one (the validation that finds the divergence saves none)
            (:class:`~lltm_train.tasks.divergence.DivergenceWatch`).
        cuda_graph: ``"auto"`` (default), True or False. On a GPU the whole training step (forward, loss,
            backward, clipping, the non-finite guard and the optimiser step) runs as one CUDA graph per batch
            shape (:mod:`lltm_train.tasks.captured`): ``"auto"`` does so when the run allows it (one GPU, a
            fused Adam/AdamW, 32-true or bf16-mixed, no gradient accumulation, no state carried between
            batches) and says in one line why not otherwise; True says so as a warning; False never captures.

    ``kinds`` names the :class:`~lltm_train.data.Problem` kinds a task trains on.
    """

    kinds: tuple[str, ...] = ()
    metric_names: tuple[str, ...] = ("loss",)  # logged as val/<name> and test/<name>
    uniform_loss: float | None = None  # the loss of a uniform guess over the classes (set by the tasks with classes)

    def __init__(self, optimizer: Callable | None = None, scheduler: Callable | None = None, compile: bool = False,
                 baseline_loss: float | None = None, nonfinite: str = "stop", divergence: str = "warn",
                 cuda_graph: bool | Literal["auto"] = "auto") -> None:
        super().__init__()
        if cuda_graph not in ("auto", True, False):
            raise ValueError(f"model.cuda_graph: expected auto, true or false, got {cuda_graph!r}")
        self.cuda_graph = cuda_graph
        self._captured: CapturedStep | None = None  # set when training starts (on_train_start)
        self.graph_replays = 0  # the last fit's steps that ran as CUDA graph replays
        self.clock = TrainingClock()  # seconds of training, across resumes (logged as time/train_seconds)
        self.budget_notice = BudgetNotice()
        self.final_validation = False  # train()'s validation after a run that stopped between validations
        self.guard = NonFiniteGuard(type(self).__name__, nonfinite)
        self.divergence_watch = DivergenceWatch(type(self).__name__, divergence)
        self.resumed = ResumedState()
        self.optimizer_factory = optimizer or default_optimizer
        self.scheduler_factory = scheduler
        self.compile_net = compile
        self.baseline_loss = baseline_loss
        self.last_validated_step = -1
        self.trained_steps = 0  # the optimiser steps of a checkpoint loaded outside training (lltm_train.inference)
        self.loss_metrics = nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})
        self.net: nn.Module

    @property
    def nonfinite(self) -> str:
        """The non-finite policy, ``"stop"`` or ``"skip"``."""
        return self.guard.policy

    @property
    def divergence(self) -> str:
        """The divergence policy, ``"warn"`` or ``"stop"``."""
        return self.divergence_watch.policy

    @property
    def diverged(self) -> str | None:
        """Why the run counts as diverged (None: it does not)."""
        return self.divergence_watch.diverged

    # --- the network -------------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        if self.compile_net and not getattr(self, "_compiled", False):
            self.net.compile()
            self._compiled = True

    @abstractmethod
    def step(self, batch: Batch, stage: str) -> Tensor:
        """Computes the loss of a batch, updates the stage's metrics, returns the loss."""

    def capture_refusal(self) -> str | None:
        """Why this task's training step cannot be captured as a CUDA graph (None: it can); see ``cuda_graph``.

        torch.nn's LSTM and GRU with dropout between layers: cuDNN keeps its own dropout random-number state,
        which it re-seeds with a host synchronisation (illegal inside a capture) whenever the CUDA generator's
        state was set, as the capture's warm-up does when it restores it."""
        for module in self.net.modules():
            if isinstance(module, torch.nn.RNNBase) and module.num_layers > 1 and module.dropout > 0:
                return (f"torch.nn.{type(module).__name__}'s dropout between layers (cuDNN's own random numbers) "
                        "re-seeds with a host synchronisation")
        return None

    def logged_metrics(self, problem) -> list[str]:
        """The names of the ``val/`` and ``test/`` metrics this task logs on a data set (its Problem)."""
        return list(self.metric_names)

    def num_parameters(self) -> int:
        """Trainable parameters of the network (logged to TensorBoard's hparams)."""
        return sum(p.numel() for p in self.net.parameters() if p.requires_grad)

    @staticmethod
    def count(batch: Batch) -> tuple[int, int]:
        """(sequences, time steps) in a batch; padded steps are not counted."""
        if batch.lengths is not None:
            return batch.x.shape[0], int(batch.lengths.sum())  # lengths are on the CPU
        return batch.x.shape[0], batch.x.shape[0] * batch.x.shape[1]

    # --- steps and their logs ----------------------------------------------------------------------------------

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor | None:
        if self._captured is not None:  # the whole step, optimiser included: Lightning skips its backward
            loss, norm = self._captured.run(batch)
            self.guard.due = logs_this_step(self.trainer, self.global_step)
            if self.guard.due:  # clones: the next replay overwrites the graph's buffers
                self.log("train/grad_norm", norm.clone(), on_step=True, on_epoch=False)
                self._log_train_loss(loss.clone(), batch)
            return loss
        loss = self.step(batch, "train")
        if logs_this_step(self.trainer, self.global_step):
            self._log_train_loss(loss, batch)
        return loss

    def _log_train_loss(self, loss: Tensor, batch: Batch) -> None:
        # Looked at on logging steps only, which read the loss anyway: a check on every step would stall the
        # GPU queue each time. A diverged run stays diverged (its weights are no longer finite), so the
        # check at the next logging step still catches it.
        self.guard.check_loss(loss, self.global_step, getattr(self.trainer, "gradient_clip_val", None))
        mean = host_mean(loss, self.trainer)
        self.log("train/loss", mean, prog_bar=True, batch_size=batch.x.shape[0])
        self.divergence_watch.note(float(mean))

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._log_loss("val", self.step(batch, "val"), batch.x.shape[0])

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._log_loss("test", self.step(batch, "test"), batch.x.shape[0])

    def _log_loss(self, stage: str, loss: Tensor, batch_size: int) -> None:
        # The epoch's loss is the mean over its samples, over every DDP process's share of the split: a
        # torchmetrics mean adds up the processes' sums and counts. (Lightning's own sync_dist averages the
        # sample counts as integers, which rounds them when the processes' shares differ in size.)
        metric = self.loss_metrics[stage]
        metric.update(loss.detach(), weight=batch_size)
        self.log(f"{stage}/loss", metric, prog_bar=stage == "val")

    def on_validation_epoch_start(self) -> None:
        if self.trainer.state.fn == "fit" and self.guard.skipped is not None:  # no validation of weights a stop would refuse
            self.guard.report(self.global_step)

    def on_validation_epoch_end(self) -> None:
        if self.baseline_loss is not None:
            self.log("val/baseline_loss", self.baseline_loss, sync_dist=True)
        if not self.trainer.sanity_checking:
            self.last_validated_step = self.global_step
            during_fit = self.trainer.state.fn == "fit"  # a validation during training (not trainer.validate)
            if during_fit or self.final_validation:  # lltm-report's time axis: the run's last figure too
                self.log("time/train_seconds", self.clock.seconds(), rank_zero_only=True)
            if during_fit:
                self._check_divergence()

    def _check_divergence(self) -> None:
        """At the end of a validation during training: the ``divergence`` argument's rules and response."""
        metric = self.loss_metrics["val"]
        val = float(metric.compute()) if metric.update_called else None  # every process's
        if self.divergence_watch.check(self.global_step, val, self.baseline_loss, self.uniform_loss) is None:
            return
        self.log("train/diverged", 1.0, on_step=False, on_epoch=True, rank_zero_only=True)
        self.divergence_watch.respond(getattr(self.trainer.checkpoint_callback, "best_model_path", ""))

    # --- training: start and end, the optimiser step, clipping and the guard ----------------------------------

    def on_fit_start(self) -> None:
        spent = spent_budget(self.trainer)  # the Timer's state is restored; Lightning then skips the training
        if spent:
            _warn(spent)

    def on_train_start(self) -> None:
        self.resumed.apply(self.trainer)
        self.clock.start(self.global_step)
        self.budget_notice.start()
        self._captured = capture_training(self.trainer, self, self.cuda_graph, self._whole_step,
                                          state=lambda: [self.guard.skipped, *self.buffers()])
        if self._captured is not None:  # the count of skipped steps, which a captured step adds to in place
            self.guard.counter(self.device)

    def on_train_end(self) -> None:
        self.clock.stop()
        if self.guard.skipped is not None:  # steps after the last logging step
            self.guard.report(self.global_step)
        self.graph_replays = self._captured.replays if self._captured is not None else 0
        self._captured = None  # its graphs' memory

    def _whole_step(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """One training step done here rather than by Lightning (see ``cuda_graph``): loss, backward,
        clipping and the non-finite guard, the optimiser step. Returns (loss, gradient norm)."""
        optimizer = self._captured.optimizer
        loss = self.step(batch, "train")
        with torch.autocast(loss.device.type, enabled=False):
            loss.backward()
            norm = self.guard.clip(self.parameters(), optimizer, self.trainer.gradient_clip_val,
                                   self.trainer.gradient_clip_algorithm)
            optimizer.step()
        return loss.detach(), norm

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        if self._captured is None:
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        optimizer_closure()  # training_step, which took the optimiser's step itself

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # One pass over the gradients gives the norm to clip by, to log (before clipping) and to guard with.
        logs = logs_this_step(self.trainer, self.global_step)
        norm = self.guard.clip(self.parameters(), optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.guard.due = logs
        if logs:
            self.log("train/grad_norm", norm, on_step=True, on_epoch=False)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if _last_step(self.trainer):
            # Stopping at the last step as an early stop does makes Lightning validate now, inside fit, when the
            # run ends between validations: its ModelCheckpoint (best-step) sees it, the sample and the logs get
            # the run's step, and the training figures (train/loss) stay in the callback metrics.
            self.trainer.should_stop = True
            if self.trainer.check_val_every_n_epoch not in (None, 1):
                # Lightning validates only in every n-th epoch, and the last may not be one: then the final
                # validation would run after fit, where ModelCheckpoint no longer saves the best
                self.trainer.check_val_every_n_epoch = 1
        note = self.budget_notice.after_step(self.trainer, self.clock)
        if note:
            _info(note)
        if self.guard.due and self.guard.skipped is not None:
            # a logging step: this synchronisation is shared with the logs
            self.log("train/skipped_steps", float(self.guard.report(self.global_step)), on_step=True, on_epoch=False)

    def configure_optimizers(self):
        return configure_optimizers(self.optimizer_factory, self.scheduler_factory, self.parameters(),
                                    total_steps=lambda: planned_steps(self.trainer, self.clock))

    # --- checkpoints ------------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.guard.check_weights(self.parameters())
        checkpoint[CHECKPOINT_KEY] = saved_state(self, self.guard.total(), self.clock.seconds())
        # (steps, seconds) at the pace so far: a resumed time budget's schedule goes on from it, not from a
        # provisional length until its own pace is known
        checkpoint[CHECKPOINT_KEY]["pace"] = self.clock.pace(self.global_step)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = self.resumed.load(checkpoint)  # applied when training starts: see on_train_start
        self.guard.resume(int(state.get("skipped_steps", 0)))
        self.clock.offset = float(state.get("train_seconds", 0.0))
        steps, seconds = state.get("pace", (0, 0.0))
        self.clock.carried_pace = (int(steps), float(seconds))


def _last_step(trainer) -> bool:
    """Whether the step just taken is the run's last: ``max_steps`` reached, or the last batch of the last epoch."""
    if 0 < trainer.max_steps <= trainer.global_step:
        return True
    last_epoch = trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch + 1
    return last_epoch and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch


LLTMTask = RecurrentTask  # the former name (it trains every cell): user code that names it keeps working


def plain_zoneout(zoneout):
    """``model.zoneout`` as plain Python (a number, or a list of numbers): the hyperparameters a checkpoint keeps
    must load with ``torch.load(weights_only=True)``, which refuses OmegaConf's ListConfig."""
    if isinstance(zoneout, (str, bytes)) or not isinstance(zoneout, Sequence):
        return zoneout
    return [float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else p for p in zoneout]
