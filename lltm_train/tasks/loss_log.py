"""Which training steps log, and the training loss as they log it. Only logging steps read values from the
device: a read on every step would stall the GPU's queue each time."""

from __future__ import annotations

from torch import Tensor


def logs_this_step(trainer, step: int) -> bool:
    """Whether Lightning writes the logs of training step ``step`` (0-based), and the first step's (for the
    progress bar) and the last one's (the run's final training loss)."""
    return (step == 0 or bool(trainer.fast_dev_run)
            or (step + 1) % max(1, trainer.log_every_n_steps) == 0
            or step + 1 == trainer.max_steps)


def host_mean(loss: Tensor, trainer) -> Tensor:
    """``loss`` as a float32 scalar on the CPU: under DDP the mean over every process's batch (the global
    batch's loss; one collective, and every process judges the same mean).

    Logged from the host: the progress bar converts its values at every step, and a device tensor would make
    each of those steps wait for the GPU."""
    mean = loss.detach().float()
    if trainer.world_size > 1:
        mean = trainer.strategy.reduce(mean, reduce_op="mean")
    return mean.cpu()
