"""Gradient clipping and the guard against non-finite losses and gradients (``model.nonfinite``): a step whose
gradients are not all finite is not applied, and is counted on the device; the count is read (a host
synchronisation) only where the logs read values anyway."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from .. import checks


class NonFiniteError(FloatingPointError):
    """Training stopped on a non-finite loss or gradient (``nonfinite="stop"``)."""


class NonFiniteGuard:
    """Clips the gradients, keeps non-finite ones from the weights and counts the steps it skipped.

    Args:
        owner: the task's class name, for the error of a bad ``policy``.
        policy: ``"stop"`` (a skipped step, or a non-finite loss, raises :class:`NonFiniteError` when looked
            at) or ``"skip"`` (training goes on past them).

    The count lives in :attr:`skipped`, a device tensor made once and only added to in place (a captured
    CUDA graph adds to the same tensor at each replay); :attr:`before` holds the skipped steps of the runs
    this one resumed, :attr:`reported` the total as of the last look.
    """

    def __init__(self, owner: str, policy: str) -> None:
        self.policy = checks.one_of(owner, "nonfinite", policy, ("stop", "skip"))
        self.skipped: Tensor | None = None  # on the device: steps whose gradients were not all finite
        self.reported = 0  # ... as of the last logging step
        self.before = 0  # ... in the run this one resumed
        self.due = False  # this step logs: its end reports the count (the synchronisation the logs make anyway)

    def counter(self, device: torch.device) -> Tensor:
        """:attr:`skipped`, made (zero, int64 on ``device``) on first use."""
        if self.skipped is None:
            self.skipped = torch.zeros((), dtype=torch.long, device=device)
        return self.skipped

    def clip(self, parameters: Iterable[nn.Parameter], optimizer, gradient_clip_val, gradient_clip_algorithm) -> Tensor:
        """Clips the gradients (norm or value) and guards against non-finite ones; returns the norm before
        clipping (a 0-dim tensor). No host synchronisation with a fused optimiser."""
        params = [p for p in parameters if p.grad is not None]
        clip = gradient_clip_val is not None and gradient_clip_val > 0  # 0 or None: off (a negative bound is refused)
        if clip and (gradient_clip_algorithm or "norm") == "norm":
            norm = torch.nn.utils.clip_grad_norm_(params, gradient_clip_val, foreach=True)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
            if clip:
                torch.nn.utils.clip_grad_value_(params, gradient_clip_val, foreach=True)
        self.skip_if_not_finite(optimizer, norm)
        return norm

    def skip_if_not_finite(self, optimizer, norm: Tensor) -> None:
        """Keeps a step whose gradient norm is not finite from reaching the weights, and counts it."""
        bad = ~torch.isfinite(norm.detach())
        self.counter(norm.device).add_(bad)  # in place: a captured step adds to the same tensor at each replay
        if getattr(optimizer, "defaults", {}).get("fused"):
            # The fused kernels read found_inf (as GradScaler sets it) and leave parameters and state alone.
            optimizer.found_inf = bad.float()
        elif bool(bad):  # one synchronisation: parameters without a gradient are not updated
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None

    def check_loss(self, loss: Tensor, step: int, gradient_clip_val) -> None:
        """Under ``"stop"``, raises NonFiniteError for a non-finite training loss (a host synchronisation: on
        logging steps only, which read the loss anyway). The message suggests the setting to change."""
        if not torch.isfinite(loss) and self.policy == "stop":
            hint = (f"lower model.optimizer.lr or trainer.gradient_clip_val (now {gradient_clip_val:g})" if gradient_clip_val
                    else "lower model.optimizer.lr or set trainer.gradient_clip_val (clipping is off)")
            raise NonFiniteError(f"the training loss became {loss.item()} by step {step}; {hint}")

    def report(self, step: int) -> int:
        """Steps skipped so far (a host synchronisation); raises NonFiniteError for new ones under ``"stop"``."""
        skipped = self.before + int(self.skipped)
        if skipped > self.reported and self.policy == "stop":
            raise NonFiniteError(
                f"{skipped - self.reported} step(s) before step {step} had non-finite gradients "
                "and were not applied; lower model.optimizer.lr, or set model.nonfinite=skip to go on past them")
        self.reported = skipped
        return skipped

    def total(self) -> int:
        """Steps skipped so far, the resumed runs' included (a host synchronisation), for a checkpoint."""
        return self.before + (int(self.skipped) if self.skipped is not None else 0)

    def resume(self, skipped_steps: int) -> None:
        """Goes on counting from a checkpoint's ``skipped_steps`` (already reported by the run that wrote it)."""
        self.before = self.reported = skipped_steps

    @staticmethod
    def check_weights(parameters: Iterable[nn.Parameter]) -> None:
        """Raises NonFiniteError unless every weight is finite: no checkpoint may hold weights that a resume
        could not train from."""
        if not all(torch.isfinite(p).all() for p in parameters):
            raise NonFiniteError("the weights are no longer finite; not saving them in a checkpoint (resume from an "
                                 "earlier one with ckpt_path=<file>)")
