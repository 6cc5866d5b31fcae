"""Helpers that several test modules share: a composed training config, a callback that records the losses,
a training command in a fresh process, the small adding-problem run, and the callbacks that stop such a run
(given to it by name, ``+callbacks.x._target_=helpers.SignalAt``). Test modules import these from here,
never from each other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
from hydra import compose, initialize_config_dir

from lltm_train.config import config_dir

TESTS = Path(__file__).parent
TOKEN_DATA = ("shakespeare", "text", "copy")
ADDING = ["dataset=adding", "dataset.seq_len=10", "dataset.train_size=400", "dataset.val_size=16", "dataset.test_size=16",
          "dataset.batch_size=8", "model.hidden_size=8", "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0",
          "trainer.accelerator=cpu"]


def make_cfg(out, *overrides):
    """The composed config of a small CPU run (unless an override names the accelerator) writing into ``out``."""
    dataset = next((o.split("=", 1)[1] for o in overrides if o.startswith("dataset=")), "shakespeare")
    token_model = ["model.embedding_dim=8", "model.sample_length=20"] if dataset in TOKEN_DATA else []
    if not any(o.startswith("trainer.accelerator=") for o in overrides):
        overrides = ("trainer.accelerator=cpu", *overrides)  # also on a GPU machine
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("config", overrides=[f"paths.output_dir={out}", "callbacks.progress_bar.refresh_rate=0",
                                            "model.hidden_size=16", *token_model, *overrides])


def run(cwd, *overrides):
    """``python -m lltm_train OVERRIDES`` in ``cwd``, in a fresh process that can import the test modules."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lltm_train", *overrides], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


class LossRecorder(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())


class SignalAt(L.Callback):
    """Sends the process a signal at the start of a given step, as a scheduler or a user would."""

    def __init__(self, step: int, signum: int, rank: int | None = None) -> None:
        self.step, self.signum, self.rank = step, signum, rank  # rank: under DDP, only that process gets it
        self.sent = False  # once: under gradient accumulation a step starts several batches

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank) and trainer.ckpt_path is None \
                and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


class SigkillAt(L.Callback):
    """kill -9 of the process at the start of a given step: nothing after the last checkpoint survives."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # a fresh run only: a resume starts from the run's own settings, this callback included
        if trainer.global_step == self.step and trainer.ckpt_path is None:
            os.kill(os.getpid(), signal.SIGKILL)
