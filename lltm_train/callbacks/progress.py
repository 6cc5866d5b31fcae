"""The training progress bar: Lightning's tqdm bar, counting the whole run instead of the epoch's batches."""

from __future__ import annotations

import math

from lightning.pytorch.callbacks import Timer, TQDMProgressBar

from ..tasks.budget import timer_of

# The run's seconds against its time budget, and the seconds left (the budget's, not tqdm's estimate).
SECONDS_FORMAT = "{{l_bar}}{{bar}}| {{n:.0f}}/{{total:.0f}} s [{left} left{{postfix}}]"


class RunProgressBar(TQDMProgressBar):
    """Lightning's :class:`~lightning.pytorch.callbacks.TQDMProgressBar` whose training bar counts the run:
    its optimiser steps (``trainer.global_step``, gradient accumulation included) against the steps that
    ``max_steps`` and ``max_epochs`` allow (Lightning's ``estimated_stepping_batches``), or, with a time
    budget (``trainer.max_time``), its training seconds against the budget, the step in the postfix. The
    time left is tqdm's estimate at the run's average pace; a resumed run starts at its checkpoint's step or
    seconds and paces itself from there. Validation and test keep Lightning's bars.

    Args:
        refresh_rate: redraw every this many optimiser steps (0 disables the bar), as Lightning's.
        process_position, leave: as Lightning's.
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self._timer: Timer | None = None

    def _position(self, trainer) -> float:
        """Where the run is: training seconds with a time budget (the resumed runs' included), else steps."""
        if self._timer is not None:
            return float(self._timer.time_elapsed("train"))
        return trainer.global_step

    def _seconds_format(self) -> str:
        return SECONDS_FORMAT.format(left=f"{max(0.0, self._timer.time_remaining('train')):,.0f} s")

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        bar = self.train_progress_bar
        timer = timer_of(trainer)
        self._timer = timer if timer is not None and timer.time_remaining("train") is not None else None
        if self._timer is not None:
            total = self._timer.time_elapsed("train") + max(0.0, self._timer.time_remaining("train"))
            bar.unit, bar.bar_format = "s", self._seconds_format()
        else:
            steps = float(trainer.estimated_stepping_batches)
            total = int(steps) if math.isfinite(steps) else None
            bar.unit = "step"
        bar.reset(total=total)
        bar.initial = bar.n = bar.last_print_n = self._position(trainer)  # tqdm's pace counts from here
        bar.set_description("training")

    def on_train_epoch_start(self, trainer, *_) -> None:
        if self.train_progress_bar is not None:  # no reset: the bar spans the run
            self.train_progress_bar.set_description(f"epoch {trainer.current_epoch}")

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        if isinstance(metrics.get("tok/s"), (int, float)):  # tqdm would switch between 4.65e+04 and 46549.1
            metrics["tok/s"] = f"{metrics['tok/s']:,.0f}"
        return {"step": trainer.global_step, **metrics} if self._timer is not None else metrics

    def _draw(self, trainer, pl_module) -> None:
        bar = self.train_progress_bar
        position = self._position(trainer)
        bar.n = min(position, bar.total) if bar.total is not None else position
        if self._timer is not None:
            bar.bar_format = self._seconds_format()
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable or self.refresh_rate == 0:
            return
        step = trainer.global_step
        if step % self.refresh_rate == 0 or (bar.total is not None and self._timer is None and step >= bar.total):
            self._draw(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        bar = self.train_progress_bar
        if bar is not None and not bar.disable and self.refresh_rate:
            self._draw(trainer, pl_module)  # where the run stopped, between two redraws perhaps
        super().on_train_end(trainer, pl_module)
