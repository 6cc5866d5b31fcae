"""The pieces a task delegates to (lltm_train.tasks: guard, divergence, resume), on their own, and the former
names (LLTMTask, TaskSpec, a data module's ``task``) that user code and checkpoints may still use."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from lltm_train.data import Problem, SequenceDataModule, TaskSpec
from lltm_train.tasks import LanguageModelTask, LLTMTask, RecurrentTask
from lltm_train.tasks.divergence import DivergedError, DivergenceWatch
from lltm_train.tasks.guard import NonFiniteError, NonFiniteGuard
from lltm_train.tasks.resume import CHECKPOINT_KEY, ResumedState, saved_state

NET = {"hidden_size": 8, "num_layers": 1, "dropout": 0.0, "bidirectional": False, "cell": "lltm", "backend": "python",
       "embedding_dim": 4, "sample_length": 0, "sample_temperature": 1.0}


# --- the former names ---------------------------------------------------------------------------------------------


def test_the_former_names_are_the_new_ones():
    from lltm_train.tasks import base

    assert LLTMTask is RecurrentTask and base.LLTMTask is RecurrentTask and TaskSpec is Problem
    assert base.NonFiniteError is NonFiniteError and base.DivergedError is DivergedError


class _Module(SequenceDataModule):
    def build(self) -> None:
        self.task = Problem("tokens", 3, 3)  # a data module written for the former attribute


def test_a_data_module_setting_task_poses_its_problem():
    dm = _Module()
    dm.setup()
    assert dm.problem == Problem("tokens", 3, 3) and dm.task is dm.problem


# --- divergence ---------------------------------------------------------------------------------------------------


def _interval(watch, losses):
    for loss in losses:
        watch.note(loss)


def test_training_losses_all_well_above_the_best_interval_diverge_once():
    watch = DivergenceWatch("T", "warn")
    _interval(watch, [1.0, 2.0, 3.0])  # mean 2: the bar is 3
    assert watch.check(10, None, None, None) is None
    _interval(watch, [3.5, 4.0, 3.2, 5.0])  # four: not enough to judge
    assert watch.check(20, None, None, None) is None
    _interval(watch, [3.1, 3.2, 3.3, 3.4, 3.5, math.nan])  # five finite ones above 3 (NaN: the guard's)
    message = watch.check(30, None, None, None)
    assert message == watch.diverged and message.startswith("the run diverged by step 30: every training loss")
    _interval(watch, [9.0] * 5)
    assert watch.check(40, None, None, None) is None and watch.diverged == message  # said once


def test_a_validation_loss_well_above_a_beaten_baseline_or_a_uniform_guess_diverges():
    watch = DivergenceWatch("T", "warn")
    assert watch.check(1, 2.0, baseline_loss=1.0, uniform_loss=None) is None  # never below the baseline yet
    assert watch.check(2, 0.5, baseline_loss=1.0, uniform_loss=None) is None
    assert "is above 1.5x the trivial predictor's (1), which it had beaten" in watch.check(3, 1.6, 1.0, None)
    uniform = DivergenceWatch("T", "warn")
    assert "above 1.5x a uniform guess's (1.386)" in uniform.check(4, 2.1, None, math.log(4))


def test_a_diverged_run_stops_or_warns(caplog):
    stop = DivergenceWatch("T", "stop")
    stop.check(5, 5.0, None, 1.0)
    with pytest.raises(DivergedError, match=r"stopped \(model.divergence=stop\); the best checkpoint before it is b.ckpt"):
        stop.respond("b.ckpt")
    warn = DivergenceWatch("T", "warn")
    warn.check(5, 5.0, None, 1.0)
    with caplog.at_level(logging.WARNING, logger="lltm_train"):
        warn.respond("")
    assert "going on (model.divergence=warn)" in caplog.text
    with pytest.raises(ValueError, match="T: divergence must be one of 'warn', 'stop'"):
        DivergenceWatch("T", "ignore")


# --- the non-finite guard -----------------------------------------------------------------------------------------


def _bad_gradients(model):
    model.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    model.weight.grad[0, 0] = math.nan


@pytest.mark.parametrize("fused", [False, True])
def test_a_step_with_non_finite_gradients_is_counted_and_not_applied(fused):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    guard = NonFiniteGuard("T", "skip")
    _bad_gradients(model)
    assert math.isnan(float(guard.clip(model.parameters(), optimizer, 1.0, "norm")))
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert guard.report(7) == 1 and guard.total() == 1


def test_the_guard_stops_on_new_skipped_steps_and_goes_on_counting_after_a_resume():
    guard = NonFiniteGuard("T", "stop")
    guard.resume(2)  # skipped (and reported) by the runs this one resumed
    guard.counter(torch.device("cpu")).add_(1)
    with pytest.raises(NonFiniteError, match=r"^1 step\(s\) before step 9 had non-finite gradients"):
        guard.report(9)
    assert guard.total() == 3
    with pytest.raises(NonFiniteError, match="became nan by step 4; lower model.optimizer.lr or set"):
        guard.check_loss(torch.tensor(math.nan), 4, None)
    NonFiniteGuard("T", "skip").check_loss(torch.tensor(math.nan), 4, None)  # skip: goes on


# --- what a checkpoint carries ------------------------------------------------------------------------------------


def test_a_checkpoint_carries_the_random_states_the_count_the_seconds_and_the_class():
    task = LanguageModelTask(5, 5, **NET)
    checkpoint = {}
    task.on_save_checkpoint(checkpoint)
    saved = checkpoint[CHECKPOINT_KEY]
    assert CHECKPOINT_KEY == "lltm_train"
    assert set(saved) == {"rng_cpu", "rng_cuda", "skipped_steps", "task", "train_seconds", "pace"}
    assert saved["task"] == "lltm_train.tasks.language_model.LanguageModelTask"
    assert saved["skipped_steps"] == 0 and saved["train_seconds"] == 0.0 and saved["pace"] == (0, 0.0)
    resumed = LanguageModelTask(5, 5, **NET)
    resumed.on_load_checkpoint({CHECKPOINT_KEY: {**saved, "skipped_steps": 3, "train_seconds": 12.5, "pace": (40, 8.0)}})
    assert resumed.guard.total() == 3 and resumed.clock.seconds() == 12.5 and resumed.clock.pace(0) == (40, 8.0)


def test_a_resume_restores_the_random_state_and_the_schedule_s_rate_once():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    scheduler.last_epoch = 3
    optimizer.param_groups[0]["lr"] = 0.0  # the old schedule's last value
    trainer = SimpleNamespace(lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler)])
    torch.manual_seed(1)
    state = ResumedState()
    state.load({CHECKPOINT_KEY: saved_state(object(), 0, 0.0)})
    expected = torch.rand(3)
    state.apply(trainer)
    assert torch.equal(torch.rand(3), expected) and optimizer.param_groups[0]["lr"] == 0.25
    state.apply(trainer)  # once: nothing pending now
    assert not torch.equal(torch.rand(3), expected)
