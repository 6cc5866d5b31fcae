"""Learning-rate schedules that follow the Trainer's current step budget (so a resumed run may extend it).
Each cell's default peak learning rate is its spec's (:func:`lltm_train.ops.cells.default_lr`)."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(optimizer: Optimizer, total_steps: Callable[[], float], warmup_fraction: float = 0.05,
                  final_fraction: float = 0.0, warmup_steps: int | None = None) -> LambdaLR:
    """Linear warm-up over ``warmup_fraction`` of the steps (or over ``warmup_steps`` steps), then a cosine
    decay to ``final_fraction`` of the lr.

    ``total_steps`` is asked at every step (e.g. the Trainer's ``estimated_stepping_batches``), and the
    factor is a closure, which LambdaLR leaves out of its state dict: a run resumed with a larger
    ``trainer.max_steps`` stretches the decay instead of failing as a schedule with a stored length would.
    With no finite step budget the lr stays at its peak after the warm-up.

    ``warmup_steps`` (None: ``warmup_fraction`` of the steps) fixes the warm-up's length whatever
    ``total_steps`` says. With a time budget (``trainer.max_time``) the steps are an estimate from the pace
    so far (:func:`lltm_train.tasks.budget.planned_steps`), unknown at the first steps: a fraction of it
    would make the first steps' learning rates depend on their timing (conf/model/optim/adamw_cosine.yaml
    sets it then).
    """
    if not 0 <= warmup_fraction < 1 or not 0 <= final_fraction <= 1:
        raise ValueError(f"warmup_cosine: warmup_fraction must be in [0, 1) and final_fraction in [0, 1], got "
                         f"{warmup_fraction} and {final_fraction}")
    if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
                                     or warmup_steps < 0):
        raise ValueError(f"warmup_cosine: warmup_steps must be a whole number >= 0 (or null), got {warmup_steps!r}")

    def factor(step: int) -> float:
        total = total_steps()
        if warmup_steps is None and not math.isfinite(total):
            return 1.0
        warmup = max(1, warmup_steps if warmup_steps is not None else int(warmup_fraction * total))
        if step < warmup:
            return (step + 1) / warmup
        if not math.isfinite(total):
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
