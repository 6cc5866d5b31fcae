"""What a checkpoint carries beyond Lightning's own state, under the key :data:`CHECKPOINT_KEY`, and how a
resumed run takes it back: the random states (the same dropout masks as the uninterrupted run), the count of
skipped steps, the seconds trained, the task's class, and the learning rate of the schedule in force."""

from __future__ import annotations

import torch

CHECKPOINT_KEY = "lltm_train"  # the checkpoint's entry: a dict of the keys saved_state() writes


def saved_state(task: object, skipped_steps: int, train_seconds: float) -> dict:
    """The checkpoint's :data:`CHECKPOINT_KEY` entry: ``rng_cpu`` and ``rng_cuda`` (one state per CUDA device,
    [] when CUDA was not used), ``skipped_steps``, ``task`` (the dotted path of ``task``'s class, which
    lltm_train.inference loads) and ``train_seconds``. The data order has its own seeds
    (lltm_train.data.resumable)."""
    return {
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "skipped_steps": skipped_steps,
        "task": f"{type(task).__module__}.{type(task).__qualname__}",
        "train_seconds": train_seconds,
    }


class ResumedState:
    """A checkpoint's :data:`CHECKPOINT_KEY` entry, held from loading until training starts.

    :meth:`load` takes it when Lightning restores the checkpoint; :meth:`apply` restores the random states
    and the learning rate once, after Lightning made its loaders and ran any sanity check, just before the
    first resumed step (earlier, they would draw from the restored states).
    """

    def __init__(self) -> None:
        self.pending: dict | None = None

    def load(self, checkpoint: dict) -> dict:
        """Keeps ``checkpoint``'s entry for :meth:`apply`; returns it ({} for a checkpoint without one)."""
        self.pending = checkpoint.get(CHECKPOINT_KEY)
        return self.pending or {}

    def apply(self, trainer) -> None:
        """Restores the pending state, if any, once."""
        state, self.pending = self.pending, None
        if state is None:
            return
        torch.set_rng_state(state["rng_cpu"])
        if state["rng_cuda"] and torch.cuda.is_available() and len(state["rng_cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        restore_schedule_lr(trainer)


def restore_schedule_lr(trainer) -> None:
    """Sets each optimiser group's learning rate to its schedule's value at the restored step.

    A run extended past its old end (a larger max_steps) goes on with the learning rate of its new schedule
    at this step: the restored optimiser holds the old schedule's last value (0 at its end)."""
    for config in trainer.lr_scheduler_configs:
        scheduler = config.scheduler
        if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
                group["lr"] = base * factor(scheduler.last_epoch)
