"""Learning rates: each cell's default peak learning rate by width, and schedules that follow the Trainer's
current step budget (so a resumed run may extend it)."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

# AdamW's default peak learning rate for each cell at 256 units and below; wider layers scale it by
# 256 / hidden_size (a wider recurrent matrix takes smaller steps: at 512 units the GRU diverged at the
# LLTM's 0.008, H200, 2026-12-01). Measured on the default job at 256, 512 and 1024 units for every cell:
# BENCHMARKS.md, "Learning rates".
LR_AT_256 = {"lltm": 0.008, "lstm": 0.008, "gru": 0.006}


def default_lr(cell: str, hidden_size: int) -> float:
    """The default peak learning rate of ``cell`` at ``hidden_size`` units (``model.optimizer.lr`` when it is
    not set): ``LR_AT_256[cell] * min(1, 256 / hidden_size)``, to 3 significant digits. An unknown cell or
    a size below 1 gets the LLTM's rate: the model then refuses them with its own message.
    """
    base = LR_AT_256.get(cell, LR_AT_256["lltm"])
    scale = 256 / hidden_size if isinstance(hidden_size, int) and hidden_size > 256 else 1.0
    return float(f"{base * scale:.3g}")


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
