"""The optimiser and its learning-rate schedule, as Lightning's ``configure_optimizers`` returns them."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


def default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW(lr=3e-3): the optimiser of a task given none (the configs give one: conf/model/optim/)."""
    return torch.optim.AdamW(params, lr=3e-3)


def configure_optimizers(optimizer_factory: Callable, scheduler_factory: Callable | None,
                         params: Iterable[nn.Parameter], total_steps: Callable[[], float]):
    """The optimiser over ``params``, with its scheduler stepped every optimiser step when there is one.

    Args:
        optimizer_factory: takes the parameters, returns the optimiser.
        scheduler_factory: takes (optimizer, total_steps), returns the scheduler; None: a constant rate.
        total_steps: returns the run's current number of optimiser steps (it may change during the run:
            :func:`lltm_train.tasks.budget.planned_steps`).
    """
    optimizer = optimizer_factory(params)
    if scheduler_factory is None:
        return optimizer
    scheduler = scheduler_factory(optimizer, total_steps=total_steps)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
