"""What the LightningModules share: optimiser and schedule, loss logging, clipping with the gradient norm,
a guard against non-finite gradients, and a lean step (no host synchronisation on steps that log nothing)."""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor, nn
from torchmetrics import MeanMetric

from .. import validation as v
from ..data.base import Batch
from .budget import TrainingClock, budget_note, planned_steps, spent_budget
from .captured import CapturedStep, why_not_captured


class NonFiniteError(FloatingPointError):
    """Training stopped on a non-finite loss or gradient (``nonfinite="stop"``)."""


class DivergedError(FloatingPointError):
    """Training stopped on divergence (``divergence="stop"``; see :class:`LLTMTask`)."""


DIVERGENCE_FACTOR = 1.5  # "well above": how far above its reference a loss must be to count as divergence
_warn = rank_zero_only(logging.getLogger("lltm_train").warning)
_info = rank_zero_only(logging.getLogger("lltm_train").info)


class LLTMTask(L.LightningModule, ABC):
    """Base LightningModule: subclasses build ``self.net`` and implement :meth:`step`.

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
            with no synchronisation; with others, at the cost of one synchronisation a step.
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
            far when there is one (the validation that finds the divergence saves none).
        cuda_graph: ``"auto"`` (default), True or False. On a GPU the whole training step (forward, loss,
            backward, clipping, the non-finite guard and the optimiser step) runs as one CUDA graph per batch
            shape (:mod:`lltm_train.tasks.captured`): ``"auto"`` does so when the run allows it (one GPU, a
            fused Adam/AdamW, 32-true or bf16-mixed, no gradient accumulation, no state carried between
            batches) and says in one line why not otherwise; True says so as a warning; False never captures.

    ``kinds`` names the :class:`~lltm_train.data.TaskSpec` kinds a task trains on.
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
        self.final_validation = False  # train()'s validation after a run that stopped between validations
        self.nonfinite = v.one_of(type(self).__name__, "nonfinite", nonfinite, ("stop", "skip"))
        self.divergence = v.one_of(type(self).__name__, "divergence", divergence, ("warn", "stop"))
        self.diverged: str | None = None  # why the run counts as diverged (None: it does not)
        self._best_train_loss = math.inf  # the lowest mean of the logged training losses of a validation interval
        self._logged: list[float] = []  # the training losses logged since the last validation
        self._beat_baseline = False  # has a validation loss been below baseline_loss yet
        self._skipped: Tensor | None = None  # on the device: steps whose gradients were not all finite
        self._skipped_reported = 0  # ... as of the last logging step
        self._skipped_before = 0  # ... in the run this one resumed
        self._check_skipped = False
        self.optimizer_factory = optimizer or (lambda params: torch.optim.AdamW(params, lr=3e-3))
        self.scheduler_factory = scheduler
        self.compile_net = compile
        self.baseline_loss = baseline_loss
        self.last_validated_step = -1
        self.trained_steps = 0  # the optimiser steps of a checkpoint loaded outside training (lltm_train.inference)
        self.loss_metrics = nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})
        self.net: nn.Module

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

    def logged_metrics(self, spec) -> list[str]:
        """The names of the ``val/`` and ``test/`` metrics this task logs on a data set (its TaskSpec)."""
        return list(self.metric_names)

    def num_parameters(self) -> int:
        """Trainable parameters of the network (logged to TensorBoard's hparams)."""
        return sum(p.numel() for p in self.net.parameters() if p.requires_grad)

    def _logs_this_step(self) -> bool:
        """Whether Lightning writes this training step's logs (and the first step, for the progress bar)."""
        trainer = self.trainer
        return (self.global_step == 0 or bool(trainer.fast_dev_run)
                or (self.global_step + 1) % max(1, trainer.log_every_n_steps) == 0
                or self.global_step + 1 == trainer.max_steps)  # the last step: the run's final training loss

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor | None:
        if self._captured is not None:  # the whole step, optimiser included: Lightning skips its backward
            loss, norm = self._captured.run(batch)
            self._check_skipped = self._logs_this_step()
            if self._check_skipped:  # clones: the next replay overwrites the graph's buffers
                self.log("train/grad_norm", norm.clone(), on_step=True, on_epoch=False)
                self._log_train_loss(loss.clone(), batch)
            return loss
        loss = self.step(batch, "train")
        if self._logs_this_step():
            self._log_train_loss(loss, batch)
        return loss

    def _log_train_loss(self, loss: Tensor, batch: Batch) -> None:
        # Looked at on logging steps only, which read the loss anyway: a check on every step would stall the
        # GPU queue each time. A diverged run stays diverged (its weights are no longer finite), so the
        # check at the next logging step still catches it.
        if not torch.isfinite(loss) and self.nonfinite == "stop":
            clip = getattr(self.trainer, "gradient_clip_val", None)
            hint = (f"lower model.optimizer.lr or trainer.gradient_clip_val (now {clip:g})" if clip
                    else "lower model.optimizer.lr or set trainer.gradient_clip_val (clipping is off)")
            raise NonFiniteError(f"the training loss became {loss.item()} by step {self.global_step}; {hint}")
        # The mean over every process's batch (the global batch's loss under DDP: one collective per logging
        # step; every process judges the same mean). Logged from the host: the progress bar converts its
        # values at every step, and a device tensor would make each of those steps wait for the GPU.
        mean = loss.detach().float()
        if self.trainer.world_size > 1:
            mean = self.trainer.strategy.reduce(mean, reduce_op="mean")
        mean = mean.cpu()
        self.log("train/loss", mean, prog_bar=True, batch_size=batch.x.shape[0])
        self._watch_train_loss(float(mean))

    def _watch_train_loss(self, value: float) -> None:
        if math.isfinite(value):
            self._logged.append(value)

    def _check_divergence(self) -> None:
        """At the end of a validation during training: the two rules of the ``divergence`` argument."""
        reason = None
        if len(self._logged) >= 5 and min(self._logged) > DIVERGENCE_FACTOR * self._best_train_loss:
            reason = (f"every training loss logged since the last validation was above {DIVERGENCE_FACTOR}x the best "
                      f"mean of an earlier interval ({self._best_train_loss:.4g})")
        if self._logged:
            self._best_train_loss = min(self._best_train_loss, sum(self._logged) / len(self._logged))
        val = self.loss_metrics["val"].compute() if self.loss_metrics["val"].update_called else None  # every process's
        if self.baseline_loss is not None and val is not None and math.isfinite(float(val)):
            if float(val) < self.baseline_loss:
                self._beat_baseline = True
            elif self._beat_baseline and float(val) > DIVERGENCE_FACTOR * self.baseline_loss:
                reason = reason or (f"val/loss {float(val):.4g} is above {DIVERGENCE_FACTOR}x the trivial predictor's "
                                    f"({self.baseline_loss:.4g}), which it had beaten")
        if self.uniform_loss is not None and val is not None and float(val) > DIVERGENCE_FACTOR * self.uniform_loss:
            reason = reason or (f"val/loss {float(val):.4g} is above {DIVERGENCE_FACTOR}x a uniform guess's "
                                f"({self.uniform_loss:.4g})")
        self._logged = []
        if reason is None or self.diverged is not None:
            return
        self.diverged = f"the run diverged by step {self.global_step}: {reason}"
        self.log("train/diverged", 1.0, on_step=False, on_epoch=True, rank_zero_only=True)
        if self.divergence == "stop":
            best = getattr(self.trainer.checkpoint_callback, "best_model_path", "")
            kept = f"; the best checkpoint before it is {best}" if best else ""
            raise DivergedError(f"{self.diverged}; stopped (model.divergence=stop){kept}. Lower model.optimizer.lr")
        _warn(f"lltm-train: warning: {self.diverged}; going on (model.divergence=warn). Lower model.optimizer.lr, "
              "or set model.divergence=stop to end such runs")

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

    def on_fit_start(self) -> None:
        spent = spent_budget(self.trainer)  # the Timer's state is restored; Lightning then skips the training
        if spent:
            _warn(spent)

    def on_train_start(self) -> None:
        self._restore_resumed_state()
        self.clock.start(self.global_step)
        self._budget_said = False
        optimizer = self.trainer.optimizers[0] if self.trainer.optimizers else None
        reason = None if self.cuda_graph is False else (
            why_not_captured(self.trainer, self, optimizer) if optimizer is not None else "no optimiser")
        self._captured = None
        if self.cuda_graph and reason is None:
            if self._skipped is None:  # the count of skipped steps, which a captured step adds to in place
                self._skipped = torch.zeros((), dtype=torch.long, device=self.device)
            self._captured = CapturedStep(self._whole_step, optimizer, state=lambda: [self._skipped, *self.buffers()])
        # The loop's switch that Lightning's own StochasticWeightAveraging uses: no zero_grad, no backward
        self.trainer.fit_loop._skip_backward = self._captured is not None
        if reason is not None and self.cuda_graph is True:
            _warn(f"lltm-train: warning: model.cuda_graph=true, but the training step is not captured: {reason}; "
                  "training eagerly")
        elif reason is not None and self.trainer.strategy.root_device.type == "cuda":
            _info(f"lltm-train: the training step runs eagerly, not as a CUDA graph: {reason}")

    def on_train_end(self) -> None:
        self.clock.stop()
        if self._skipped is not None:  # steps after the last logging step
            self._report_skipped()
        self.graph_replays = self._captured.replays if self._captured is not None else 0
        self._captured = None  # its graphs' memory

    def _whole_step(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """One training step done here rather than by Lightning (see ``cuda_graph``): loss, backward,
        clipping and the non-finite guard, the optimiser step. Returns (loss, gradient norm)."""
        optimizer = self._captured.optimizer
        loss = self.step(batch, "train")
        with torch.autocast(loss.device.type, enabled=False):
            loss.backward()
            norm = self._clip(optimizer, self.trainer.gradient_clip_val, self.trainer.gradient_clip_algorithm)
            optimizer.step()
        return loss.detach(), norm

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        if self._captured is None:
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        optimizer_closure()  # training_step, which took the optimiser's step itself

    def _clip(self, optimizer, gradient_clip_val, gradient_clip_algorithm) -> Tensor:
        """Clips the gradients (norm or value) and guards against non-finite ones; returns the norm before
        clipping. No host synchronisation with a fused optimiser."""
        params = [p for p in self.parameters() if p.grad is not None]
        clip = gradient_clip_val is not None and gradient_clip_val > 0  # 0 or None: off (a negative bound is refused)
        if clip and (gradient_clip_algorithm or "norm") == "norm":
            norm = torch.nn.utils.clip_grad_norm_(params, gradient_clip_val, foreach=True)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
            if clip:
                torch.nn.utils.clip_grad_value_(params, gradient_clip_val, foreach=True)
        self._skip_if_not_finite(optimizer, norm)
        return norm

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # One pass over the gradients gives the norm to clip by, to log (before clipping) and to guard with.
        logs = self._logs_this_step()
        norm = self._clip(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self._check_skipped = logs
        if logs:
            self.log("train/grad_norm", norm, on_step=True, on_epoch=False)

    def _skip_if_not_finite(self, optimizer, norm: Tensor) -> None:
        """Keeps a step whose gradient norm is not finite from reaching the weights."""
        bad = ~torch.isfinite(norm.detach())
        if self._skipped is None:
            self._skipped = torch.zeros((), dtype=torch.long, device=norm.device)
        self._skipped.add_(bad)  # in place: a captured step adds to the same tensor at each replay
        if getattr(optimizer, "defaults", {}).get("fused"):
            # The fused kernels read found_inf (as GradScaler sets it) and leave parameters and state alone.
            optimizer.found_inf = bad.float()
        elif bool(bad):  # one synchronisation: parameters without a gradient are not updated
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if not getattr(self, "_budget_said", True) and self.clock.this_run(self.global_step)[0] >= 20:
            self._budget_said = True  # once, when the pace of 20 steps is known
            note = budget_note(self.trainer, self.clock)
            if note:
                _info(note)
        if self._check_skipped and self._skipped is not None:
            # a logging step: this synchronisation is shared with the logs
            self.log("train/skipped_steps", float(self._report_skipped()), on_step=True, on_epoch=False)

    def on_validation_epoch_start(self) -> None:
        if self.trainer.state.fn == "fit" and self._skipped is not None:  # no validation of weights a stop would refuse
            self._report_skipped()

    def _report_skipped(self) -> int:
        """Steps skipped so far (a host synchronisation); raises NonFiniteError for new ones under "stop"."""
        skipped = self._skipped_before + int(self._skipped)
        if skipped > self._skipped_reported and self.nonfinite == "stop":
            raise NonFiniteError(
                f"{skipped - self._skipped_reported} step(s) before step {self.global_step} had non-finite gradients "
                "and were not applied; lower model.optimizer.lr, or set model.nonfinite=skip to go on past them")
        self._skipped_reported = skipped
        return skipped

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # No checkpoint may hold weights that a resume could not train from.
        if not all(torch.isfinite(p).all() for p in self.parameters()):
            raise NonFiniteError("the weights are no longer finite; not saving them in a checkpoint (resume from an "
                                 "earlier one with ckpt_path=<file>)")
        # What a resumed run needs to draw the same dropout masks and go on counting: the random states
        # (the data order has its own seeds, see lltm_train.data.resumable).
        checkpoint["lltm_train"] = {
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
            "skipped_steps": self._skipped_before + (int(self._skipped) if self._skipped is not None else 0),
            "task": f"{type(self).__module__}.{type(self).__qualname__}",  # which class loads it (lltm_train.inference)
            "train_seconds": self.clock.seconds(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._resumed_state = checkpoint.get("lltm_train")  # applied when training starts: see on_train_start
        self._skipped_before = self._skipped_reported = int((self._resumed_state or {}).get("skipped_steps", 0))
        self.clock.offset = float((self._resumed_state or {}).get("train_seconds", 0.0))

    def _restore_resumed_state(self) -> None:
        state = getattr(self, "_resumed_state", None)
        if state is None:
            return
        self._resumed_state = None
        # After Lightning made its loaders and ran any sanity check, just before the first resumed step.
        torch.set_rng_state(state["rng_cpu"])
        if state["rng_cuda"] and torch.cuda.is_available() and len(state["rng_cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        # A run extended past its old end (a larger max_steps) goes on with the learning rate of its new
        # schedule at this step: the restored optimiser holds the old schedule's last value (0 at its end).
        for config in self.trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
                for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
                    group["lr"] = base * factor(scheduler.last_epoch)

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
        scheduler = self.scheduler_factory(optimizer, total_steps=lambda: planned_steps(self.trainer, self.clock))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
