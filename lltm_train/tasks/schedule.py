"""Learning-rate schedules that follow the Trainer's current step budget (so a resumed run may extend it).
Each cell's default peak learning rate is its spec's (:func:`lltm_train.ops.cells.default_lr`)."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(optimizer: Optimizer, total_steps: Callable[[], float], warmup_fraction: float = 0.05,
                  final_fraction: float = 0.0) -> LambdaLR:
    """Linear warm-up over ``warmup_fraction`` of the steps, then a cosine decay to ``final_fraction`` of the lr.

    ``total_steps`` is asked at every step (e.g. the Trainer's ``estimated_stepping_batches``), and the
    factor is a closure, which LambdaLR leaves out of its state dict: a run resumed with a larger
    ``trainer.max_steps`` stretches the decay instead of failing as a schedule with a stored length would.
    With no finite step budget the lr stays at its peak after the warm-up.
    """
    if not 0 <= warmup_fraction < 1 or not 0 <= final_fraction <= 1:
        raise ValueError(f"warmup_cosine: warmup_fraction must be in [0, 1) and final_fraction in [0, 1], got "
                         f"{warmup_fraction} and {final_fraction}")

    def factor(step: int) -> float:
        total = total_steps()
        if not math.isfinite(total):
            return 1.0
        warmup = max(1, int(warmup_fraction * total))
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
