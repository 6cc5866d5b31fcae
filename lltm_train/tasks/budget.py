"""Training time: the seconds a run has trained (counted across resumes), and the number of steps that the
learning-rate schedule spans when ``trainer.max_time`` (Lightning's time budget) limits the run."""

from __future__ import annotations

import math
import time

from lightning.pytorch.callbacks import Timer

# The schedule's length before the pace is known (a new run's first two steps, with a time budget and no step
# limit): long enough that those steps are in the warm-up (a fraction of it), or at the start of the decay (a
# warm-up of warmup_steps, the config's default with a time budget). A resumed run knows its pace already.
PROVISIONAL_STEPS = 1_000_000.0


class TrainingClock:
    """Seconds of training (from the start of ``fit``'s training, validations included, as Lightning's
    ``max_time`` counts them), plus the seconds of the runs this one resumed (:attr:`offset`, restored from
    the checkpoint); and the pace of training, the runs this one resumed included (:attr:`carried_pace`,
    restored from the checkpoint too)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.carried_pace: tuple[int, float] = (0, 0.0)  # pace()'s (steps, seconds) when the checkpoint was saved
        self._started: float | None = None
        self._start_step = 0
        self._paced: tuple[int, float] | None = None  # (step, time) when the run's first step had ended
        self._stopped: float | None = None  # when training ended

    def start(self, step: int) -> None:
        self._started, self._start_step, self._paced, self._stopped = time.perf_counter(), step, None, None

    def stop(self) -> None:
        """Training ended: the clock stands still (a validation after it is not training time)."""
        if self._started is not None and self._stopped is None:
            self._stopped = time.perf_counter()

    def _now(self) -> float:
        return self._stopped if self._stopped is not None else time.perf_counter()

    def seconds(self) -> float:
        return self.offset + (self._now() - self._started if self._started is not None else 0.0)

    def this_run(self, step: int) -> tuple[int, float]:
        """(steps, seconds) trained since this run started."""
        if self._started is None:
            return 0, 0.0
        return step - self._start_step, self._now() - self._started

    def pace(self, step: int) -> tuple[int, float]:
        """(steps, seconds) since this run's first step ended: the pace of training, without the first step's
        one-time set-up (a CUDA graph's capture, compilation, cuDNN's autotuning), which can take more than
        a short budget's thousands of steps; plus :attr:`carried_pace`, the runs this one resumed (so that a
        resumed run knows its pace from its first step). (0, 0.0) in a new run until a step after the first
        has ended."""
        steps, seconds = self.carried_pace
        if self._started is None or step <= self._start_step:
            return steps, seconds
        if self._paced is None:
            self._paced = (step, self._now())
            return steps, seconds
        return steps + step - self._paced[0], seconds + self._now() - self._paced[1]


def timer_of(trainer) -> Timer | None:
    """The run's Lightning Timer (``trainer.max_time``; it has a budget when ``time_remaining`` is not None)."""
    return next((c for c in trainer.callbacks if isinstance(c, Timer)), None)


def planned_steps(trainer, clock: TrainingClock) -> float:
    """The optimiser steps the run will take, for the learning-rate schedule (``total_steps``): Lightning's
    estimate from ``max_steps`` and ``max_epochs`` (inf when neither bounds it); with ``max_time``, no more
    than the steps the time left allows at this run's pace so far, re-estimated at every step, so that a run
    that stops on time ends its schedule as it stops."""
    steps = float(trainer.estimated_stepping_batches)
    timer = timer_of(trainer)
    remaining = timer.time_remaining("train") if timer is not None else None
    if remaining is None:
        return steps
    done, spent = clock.pace(trainer.global_step)
    if done < 1 or spent <= 0:
        return min(steps, PROVISIONAL_STEPS)
    return min(steps, trainer.global_step + max(0.0, remaining) * done / spent)


def unfinished_schedule(trainer, clock: TrainingClock) -> str | None:
    """One line when a run ended before the end of its learning-rate schedule (stopped by a callback, for
    instance), else None."""
    timer = timer_of(trainer)
    if timer is not None and (timer.time_remaining("train") or 0.0) <= 0:
        return None  # it ended on time: the schedule ended with it
    total = planned_steps(trainer, clock)
    step = trainer.global_step
    if not math.isfinite(total) or step >= 0.98 * total:
        return None
    return (f"lltm-train: training stopped at step {step}, {step / total:.0%} of the {total:,.0f} steps its learning-rate "
            "schedule spans: the learning rate had not decayed to its end")


def budget_note(trainer, clock: TrainingClock) -> str | None:
    """With a time budget that bounds the run more than its steps do: how many steps it allows at this pace,
    which the schedule spans (said once, after some steps)."""
    timer = timer_of(trainer)
    if timer is None or timer.time_remaining("train") is None:
        return None
    total = planned_steps(trainer, clock)
    if total >= float(trainer.estimated_stepping_batches):
        return None
    budget = timer.time_elapsed("train") + max(0.0, timer.time_remaining("train"))
    return (f"lltm-train: at this pace the time budget (trainer.max_time, {budget:,.0f} s) allows about {total:,.0f} "
            "steps: the learning-rate schedule spans them")


def spent_budget(trainer) -> str | None:
    """A resumed run whose time budget the earlier runs used up already."""
    timer = timer_of(trainer)
    if timer is None or (timer.time_remaining("train") or 0.0) > 0:
        return None
    return (f"lltm-train: warning: the time budget (trainer.max_time) was spent before this run started "
            f"({timer.time_elapsed('train'):,.1f} s trained); raise trainer.max_time to train on")


PACE_STEPS = 20  # steps of a run after which its pace is known well enough to say what its time budget allows


class BudgetNotice:
    """Says :func:`budget_note`'s line once a run, when the pace of :data:`PACE_STEPS` steps is known."""

    def __init__(self) -> None:
        self.said = True  # nothing to say outside training

    def start(self) -> None:
        """Training starts: the line is due (if the budget bounds the run) after PACE_STEPS steps."""
        self.said = False

    def after_step(self, trainer, clock: TrainingClock) -> str | None:
        """The line, the first time it is due (None otherwise, and when the budget does not bound the run)."""
        if self.said or clock.this_run(trainer.global_step)[0] < PACE_STEPS:
            return None
        self.said = True
        return budget_note(trainer, clock)
