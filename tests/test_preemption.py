"""A run survives being stopped: SIGTERM and SIGINT save the state of the step under way and exit 143 / 130;
a non-finite gradient never reaches the weights or a checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from test_training import make_cfg
from lltm_train.tasks.base import NonFiniteError
from lltm_train.train import train

TESTS = Path(__file__).parent
ADDING = ["dataset=adding", "dataset.seq_len=10", "dataset.train_size=400", "dataset.val_size=16", "dataset.test_size=16",
          "dataset.batch_size=8", "model.hidden_size=8", "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0",
          "trainer.accelerator=cpu"]


class SignalAt(L.Callback):
    """Sends the process a signal at the start of a given step, as a scheduler or a user would."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class InfGradientAt(L.Callback):
    """Makes one gradient element infinite at a given step, the loss staying finite."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step == self.step:
            next(p for p in pl_module.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")


def run(cwd, *overrides):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lltm_train", *overrides], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_step_under_way_and_exits_non_zero(tmp_path, signum, status):
    common = [*ADDING, "trainer.max_steps=12", "trainer.val_check_interval=10", "hydra.run.dir=run"]
    result = run(tmp_path, *common, "+callbacks.signal_at._target_=test_preemption.SignalAt", "+callbacks.signal_at.step=6",
                 f"+callbacks.signal_at.signum={int(signum)}")
    assert result.returncode == status, result.stderr[-3000:]
    name = signal.Signals(signum).name
    line = next(line for line in result.stderr.splitlines() if line.startswith("lltm-train: stopped"))
    assert f"stopped by {name}; the state after step 7 is in" in line and "ckpt_path=last" in line
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 7
    resumed = run(tmp_path, *common, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 12
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(12))  # no gap, no repeat


def test_a_non_finite_gradient_is_never_applied_and_stops_with_the_last_good_state(tmp_path):
    overrides = [*ADDING, "trainer.max_steps=10", "trainer.val_check_interval=10", "trainer.log_every_n_steps=5",
                 "+callbacks.inf._target_=test_preemption.InfGradientAt", "+callbacks.inf.step=3"]
    with pytest.raises(NonFiniteError, match=r"1 step\(s\) before step 5 had non-finite gradients .* last good state "
                                             r"\(step 5\) is in .*last.ckpt"):
        train(make_cfg(tmp_path, *overrides))
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 5
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    steps = [s["step"] for s in checkpoint["optimizer_states"][0]["state"].values()]
    assert all(float(s) == 4 for s in steps)  # AdamW took 4 steps of 5: the infinite one was not applied


def test_skip_goes_on_past_non_finite_gradients_and_counts_them(tmp_path):
    overrides = [*ADDING, "trainer.max_steps=8", "trainer.val_check_interval=8", "model.nonfinite=skip",
                 "+callbacks.inf._target_=test_preemption.InfGradientAt", "+callbacks.inf.step=3"]
    metrics = train(make_cfg(tmp_path, *overrides))
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/skipped_steps")][-1] == (7, 1.0)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


def test_weights_that_are_not_finite_are_never_saved(tmp_path):
    cfg = make_cfg(tmp_path, *ADDING, "trainer.max_steps=2", "trainer.val_check_interval=2")
    from lltm_train.train import _prepare

    datamodule, task, trainer, _, _ = _prepare(cfg)
    trainer.fit(task, datamodule=datamodule)
    with torch.no_grad():
        next(task.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match="not saving them in a checkpoint"):
        trainer.save_checkpoint(tmp_path / "bad.ckpt")
    assert not (tmp_path / "bad.ckpt").exists()
