"""Stopping a run early without losing it: on SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C), and on a
non-finite loss or gradient."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
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

    - SIGTERM or SIGINT: the training step under way finishes (under gradient accumulation, all of its
      batches; between steps or in the sanity check, the next step), the state after it is saved, one line
      says where, and the process exits with status 143 or 130 (a second signal stops at once). A signal
      during a validation lets the validation finish (its figures are logged, and its checkpoints written)
      and saves the state after it: the resumed run goes on with the next step, as the uninterrupted run
      would. Lightning alone stops after the step too, but saves nothing, drops a validation under way and
      exits with status 0, which a scheduler reads as success; SIGINT would interrupt the step wherever it was.
    - Within :func:`signals_handled` (lltm_train.train's whole run), also after training: a signal during
      the validation after the last step (in fit or after it) or during the test lets it finish (its figures
      are logged), and the run stops then, before the test if that is still to come (the resume, with
      nothing left to train, runs it).
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
        self._whole_run = False  # within signals_handled: the handlers stay from fit to the end of the test
        self._mid_step = False  # the last training batch was not a step's last (gradient accumulation)
        self._world_size = 1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._remember()  # before Lightning's own handler: what teardown puts back

    def _remember(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous.setdefault(signum, signal.getsignal(signum))

    def _install(self) -> None:
        # at the start of each stage: in place of the handler Lightning sets for it, after the setup hooks
        if threading.current_thread() is threading.main_thread():  # signal handlers are set from there only
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, self._handle)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install()  # the sanity check comes before on_train_start

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install()
        self._mid_step = False

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
        # A batch before a step's last (gradient accumulation): its gradient is not in the weights yet and a
        # checkpoint would lose it; the step's last batch saves.
        self._mid_step = trainer.fit_loop._should_accumulate()
        if self._mid_step:
            return
        if self.stop_with is None:
            self.stop_with = self._agree(trainer) if self._distributed else self.received
        if self.stop_with is not None and self.saved is None:
            self._save(trainer, pl_module)  # the state after this step; the stop comes once its logs are written

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a validation inside fit, finished: a signal received before or during it stops the run here, with
        # the state Lightning's own checkpoints at the end of a validation hold (the step done, validated)
        if trainer.state.fn != "fit" or trainer.sanity_checking or self.saved is not None or self._mid_step:
            return
        if self.stop_with is None:
            self.stop_with = self._agree(trainer, every_step=True) if self._distributed else self.received
        if self.stop_with is not None:
            self._save(trainer, pl_module)

    def _agree(self, trainer: L.Trainer, every_step: bool = False) -> str | None:
        """Under DDP every process must stop at the same step and save there together (saving is
        collective), although a signal may reach one process only, or each at another step. At each logging
        step, at the end of each validation, and after training (places all processes reach), they share
        what they received: any signal stops them all."""
        if not every_step and trainer.global_step % max(1, trainer.log_every_n_steps):
            return None
        code = torch.tensor(float({None: 0, "SIGTERM": 1, "SIGINT": 2}[self.received]),
                            device=trainer.strategy.root_device)
        return (None, "SIGTERM", "SIGINT")[int(trainer.strategy.reduce(code, reduce_op="max"))]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        # The stop, once a step's end saved the state (SIGINT too: Lightning alone stops on SIGTERM only). A
        # signal not yet seen there (received before training, or since) lets this step run: its batch is
        # handed out, and a checkpoint now would count it as trained.
        if self.stop_with is not None:
            raise SIGTERMException()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._whole_run:
            self._install()  # trainer.validate after fit (in fit, already there)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._whole_run:
            self._install()
            if self._stop_requested(trainer):  # received after training, or during the validation after it
                raise SIGTERMException()

    def _stop_requested(self, trainer: L.Trainer) -> str | None:
        """Outside training's steps, at a place every process reaches: the signal the run stops for, if any."""
        if self.stop_with is None:
            self.stop_with = self._agree(trainer, every_step=True) if self._distributed else self.received
        return self.stop_with

    @contextmanager
    def whole_run(self, trainer: L.Trainer) -> Iterator[None]:
        """Handles SIGTERM and SIGINT from the start of fit to the end of the test, between them too. A signal
        that did not stop training stops the run at the test's start or, when no test is to come, at the end."""
        self._remember()
        self._install()
        self._whole_run = True
        try:
            yield
            stop = self._stop_requested(trainer)
            if stop is not None:
                _say(self._stopped_line(stop, trainer.global_step, self._after_training()))
                raise SIGTERMException(EXIT_CODES[stop])
        finally:
            self._whole_run = False
            self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        stop = self.stop_with or self.received
        if isinstance(exception, SIGTERMException) and stop is not None:
            if trainer.state.fn == "fit" and self.saved is None and not self._distributed:
                self._save(trainer, pl_module)
            saved = self.saved if trainer.state.fn == "fit" else self._after_training()  # else: the test's start
            _say(self._stopped_line(stop, trainer.global_step, saved))
            exception.code = EXIT_CODES[stop]  # the exit status a scheduler reads
        elif isinstance(exception, NonFiniteError) and self.saved is None:
            self._save(trainer, pl_module)
            if self.saved is not None:
                exception.args = (f"{exception}; the last good state (step {trainer.global_step}) is in {self.saved}",)

    def _after_training(self) -> Path | None:
        """The checkpoint of the state training ended with: saved here, or at the end of fit (lltm_train.train)."""
        return self.saved or (self.path if self.path.is_file() else None)

    def _stopped_line(self, stop: str, step: int, saved: Path | None) -> str:
        where = f"the state after step {step} is in {saved}" if saved else "nothing was saved"
        return (f"lltm-train: stopped by {stop}; {where}; resume with {run_dir_override(self.path.parent.parent)} "
                "ckpt_path=last")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self._whole_run:  # else the handlers stay until the next stage (whole_run puts them back)
            self._restore()

    def _save(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if all(torch.isfinite(p).all() for p in pl_module.parameters()):
            trainer.save_checkpoint(self.path)
            self.saved = self.path


def signals_handled(trainer: L.Trainer):
    """A context for a whole run (fit, then any validation or test): the Trainer's :class:`StopCheckpoint`
    handles SIGTERM and SIGINT throughout (:meth:`StopCheckpoint.whole_run`); nothing without one."""
    stop = next((c for c in trainer.callbacks if isinstance(c, StopCheckpoint)), None)
    return stop.whole_run(trainer) if stop is not None else nullcontext()


def run_dir_override(run_dir: Path) -> str:
    """``hydra.run.dir=<run_dir>`` as a shell argument: quoted for Hydra (and the quotes for the shell) when
    the path has characters Hydra's override grammar reads, such as the ``=`` of a sweep job's folder."""
    value = hydra_value(str(run_dir))
    return f"hydra.run.dir={value}" if value == str(run_dir) else f"\"hydra.run.dir={value}\""


@rank_zero_only
def _say(line: str) -> None:
    """Through the run's logger: on a line of its own beside the progress bar, and in the run's train.log (with no
    handler set up, as in a bare Python session, logging's last resort prints a warning to stderr)."""
    logging.getLogger("lltm_train").warning(line)
