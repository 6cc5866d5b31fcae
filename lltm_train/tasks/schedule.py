"""Learning rates: each cell's default peak learning rate by width, and schedules that follow the Trainer's
current step budget (so a resumed run may extend it)."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

# AdamW's default peak learning rate for each cell at 256 units; it scales as 256 / hidden_size (a wider
# recurrent matrix takes smaller steps: at 512 units the GRU diverged at the LLTM's 0.008, H200, 2026-12-01).
# Measured on the default job at 256, 512 and 1024 units for every cell: BENCHMARKS.md, "Learning rates".
LR_AT_256 = {"lltm": 0.008, "lstm": 0.008, "gru": 0.006}


def default_lr(cell: str, hidden_size: int) -> float:
    """The default peak learning rate of ``cell`` at ``hidden_size`` units (``model.optimizer.lr`` when it is
    not set): ``LR_AT_256[cell] * 256 / hidden_size``, rounded to 3 significant digits.

    Raises:
        ValueError: an unknown cell or a hidden size below 1.
    """
    if cell not in LR_AT_256:
        raise ValueError(f"no default learning rate for cell {cell!r}; set model.optimizer.lr")
    if not isinstance(hidden_size, int) or hidden_size < 1:
        raise ValueError(f"model.hidden_size must be a positive integer, got {hidden_size!r}")
    return float(f"{LR_AT_256[cell] * 256 / hidden_size:.3g}")


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
