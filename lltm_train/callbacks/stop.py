"""Stopping a run early without losing it: on SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C), and on a
non-finite loss or gradient."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..config import hydra_value
from ..run_files import CHECKPOINT_SUFFIX, LAST
from ..tasks.guard import NonFiniteError

EXIT_CODES = {"SIGTERM": 128 + signal.SIGTERM, "SIGINT": 128 + signal.SIGINT}  # 143, 130: what shells report


class StopCheckpoint(Callback):
    """Saves ``<dirpath>/<filename>.ckpt`` when training stops early, so that ``ckpt_path=last`` resumes there.

    - SIGTERM or SIGINT: the training step under way finishes, the state after it is saved, one line says
      where, and the process exits with status 143 or 130 (a second signal stops at once). A signal during
      a validation lets the validation finish (its figures are logged, and its checkpoints written) and
      saves the state after it: the resumed run goes on with the next step, as the uninterrupted run would.
      Lightning alone stops after the step too, but saves nothing, drops a validation under way and exits
      with status 0, which a scheduler reads as success; SIGINT would interrupt the step wherever it was.
    - A non-finite loss or gradient (``model.nonfinite=stop``): the state is saved when its weights are still
      finite (the guarded steps were never applied), and the error names the checkpoint.

    Args:
        dirpath: the run's checkpoint folder. filename: the checkpoint's name without ``.ckpt``.
    """

    def __init__(self, dirpath: str, filename: str = LAST) -> None:
        self.path = Path(dirpath) / f"{filename}{CHECKPOINT_SUFFIX}"
        self.received: str | None = None  # the signal this process received
        self.stop_with: str | None = None  # the signal training stops for (under DDP, what the processes agreed)
        self.saved: Path | None = None
        self._previous: dict[int, object] = {}
        self._world_size = 1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # the second signal: the default action, now
            signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)
            signal.raise_signal(signum)
            return
        # Lightning's own SIGTERM notifier is not called: it would cut a validation short (and under DDP run
        # a collective in this handler); this callback stops the run itself.
        self.received = signal.Signals(signum).name

    @property
    def _distributed(self) -> bool:
        return self._world_size > 1

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._world_size = trainer.world_size

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if self.stop_with is None:
            self.stop_with = self._agree(trainer, pl_module) if self._distributed else self.received
        if self.stop_with is not None and self.saved is None:
            self._save(trainer, pl_module)  # the state after this step; the stop comes once its logs are written

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a validation inside fit, finished: a signal received before or during it stops the run here, with
        # the state Lightning's own checkpoints at the end of a validation hold (the step done, validated)
        if trainer.state.fn != "fit" or trainer.sanity_checking or self.saved is not None:
            return
        if self.stop_with is None:
            self.stop_with = self._agree(trainer, pl_module, every_step=True) if self._distributed else self.received
        if self.stop_with is not None:
            self._save(trainer, pl_module)

    def _agree(self, trainer: L.Trainer, pl_module: L.LightningModule, every_step: bool = False) -> str | None:
        """Under DDP every process must stop at the same step and save there together (saving is
        collective), although a signal may reach one process only, or each at another step. At each logging
        step, and at the end of each validation (places all processes reach), they share what they
        received: any signal stops them all."""
        if not every_step and trainer.global_step % max(1, trainer.log_every_n_steps):
            return None
        code = torch.tensor(float({None: 0, "SIGTERM": 1, "SIGINT": 2}[self.received]), device=pl_module.device)
        return (None, "SIGTERM", "SIGINT")[int(trainer.strategy.reduce(code, reduce_op="max"))]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        # SIGINT stops here too (Lightning alone stops on SIGTERM only); one process stops at once
        if self.stop_with is not None or (self.received is not None and not self._distributed):
            raise SIGTERMException()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        stop = self.stop_with or self.received
        if isinstance(exception, SIGTERMException) and stop is not None:
            if self.saved is None and not self._distributed:
                self._save(trainer, pl_module)
            where = f"the state after step {trainer.global_step} is in {self.saved}" if self.saved else "nothing was saved"
            _say(f"lltm-train: stopped by {stop}; {where}; resume with {run_dir_override(self.path.parent.parent)} "
                 "ckpt_path=last")
            exception.code = EXIT_CODES[stop]  # the exit status a scheduler reads
        elif isinstance(exception, NonFiniteError) and self.saved is None:
            self._save(trainer, pl_module)
            if self.saved is not None:
                exception.args = (f"{exception}; the last good state (step {trainer.global_step}) is in {self.saved}",)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _save(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if all(torch.isfinite(p).all() for p in pl_module.parameters()):
            trainer.save_checkpoint(self.path)
            self.saved = self.path


def run_dir_override(run_dir: Path) -> str:
    """``hydra.run.dir=<run_dir>`` as a shell argument: quoted for Hydra (and the quotes for the shell) when
    the path has characters Hydra's override grammar reads, such as the ``=`` of a sweep job's folder."""
    value = hydra_value(str(run_dir))
    return f"hydra.run.dir={value}" if value == str(run_dir) else f"\"hydra.run.dir={value}\""


@rank_zero_only
def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
