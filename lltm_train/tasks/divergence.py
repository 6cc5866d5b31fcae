"""Divergence (``model.divergence``): a run whose losses stay finite but whose model is lost, judged from the
losses that the logging steps and the validations read anyway (no synchronisation of its own)."""

from __future__ import annotations

import logging
import math

from lightning.pytorch.utilities import rank_zero_only

from .. import checks

DIVERGENCE_FACTOR = 1.5  # "well above": how far above its reference a loss must be to count as divergence
MIN_LOGGED = 5  # logged training losses an interval needs before they can say the run diverged
_warn = rank_zero_only(logging.getLogger("lltm_train").warning)


class DivergedError(FloatingPointError):
    """Training stopped on divergence (``divergence="stop"``; see :class:`DivergenceWatch`)."""


class DivergenceWatch:
    """The two rules of divergence, and what a diverged run does.

    A run has diverged when every training loss logged since the last validation (at least
    :data:`MIN_LOGGED`) is more than :data:`DIVERGENCE_FACTOR` times the best mean of an earlier validation
    interval's logged losses (a mean: one lucky batch sets no bar); or when the validation loss is more than
    that factor times the trivial predictor's (``baseline_loss``) after it had been below it, or times a
    uniform guess's over the classes (``uniform_loss``, ln C).

    Args:
        owner: the task's class name, for the error of a bad ``policy``.
        policy: ``"warn"`` (one warning, training goes on) or ``"stop"`` (:class:`DivergedError`).
    """

    def __init__(self, owner: str, policy: str) -> None:
        self.policy = checks.one_of(owner, "divergence", policy, ("warn", "stop"))
        self.diverged: str | None = None  # why the run counts as diverged (None: it does not)
        self.best_train_loss = math.inf  # the lowest mean of the logged training losses of a validation interval
        self.logged: list[float] = []  # the training losses logged since the last validation
        self.beat_baseline = False  # has a validation loss been below baseline_loss yet

    def note(self, train_loss: float) -> None:
        """A logged training loss (the mean over every process's batch); non-finite ones are left to the guard."""
        if math.isfinite(train_loss):
            self.logged.append(train_loss)

    def check(self, step: int, val_loss: float | None, baseline_loss: float | None,
              uniform_loss: float | None) -> str | None:
        """At the end of a validation during training (``val_loss``: its loss over every process, None when it
        saw no batch): applies both rules and starts the next interval. Returns the run's divergence message
        (also kept in :attr:`diverged`) the first time a rule holds, else None."""
        reason = None
        if len(self.logged) >= MIN_LOGGED and min(self.logged) > DIVERGENCE_FACTOR * self.best_train_loss:
            reason = (f"every training loss logged since the last validation was above {DIVERGENCE_FACTOR}x the best "
                      f"mean of an earlier interval ({self.best_train_loss:.4g})")
        if self.logged:
            self.best_train_loss = min(self.best_train_loss, sum(self.logged) / len(self.logged))
        if baseline_loss is not None and val_loss is not None and math.isfinite(val_loss):
            if val_loss < baseline_loss:
                self.beat_baseline = True
            elif self.beat_baseline and val_loss > DIVERGENCE_FACTOR * baseline_loss:
                reason = reason or (f"val/loss {val_loss:.4g} is above {DIVERGENCE_FACTOR}x the trivial predictor's "
                                    f"({baseline_loss:.4g}), which it had beaten")
        if uniform_loss is not None and val_loss is not None and val_loss > DIVERGENCE_FACTOR * uniform_loss:
            reason = reason or (f"val/loss {val_loss:.4g} is above {DIVERGENCE_FACTOR}x a uniform guess's "
                                f"({uniform_loss:.4g})")
        self.logged = []
        if reason is None or self.diverged is not None:
            return None
        self.diverged = f"the run diverged by step {step}: {reason}"
        return self.diverged

    def respond(self, best_checkpoint: str = "") -> None:
        """What the run does once it has diverged: ``"stop"`` raises :class:`DivergedError`, naming the best
        checkpoint so far (``best_checkpoint``, "" when there is none); ``"warn"`` says so in one line."""
        if self.policy == "stop":
            kept = f"; the best checkpoint before it is {best_checkpoint}" if best_checkpoint else ""
            raise DivergedError(f"{self.diverged}; stopped (model.divergence=stop){kept}. Lower model.optimizer.lr")
        _warn(f"lltm-train: warning: {self.diverged}; going on (model.divergence=warn). Lower model.optimizer.lr, "
              "or set model.divergence=stop to end such runs")
