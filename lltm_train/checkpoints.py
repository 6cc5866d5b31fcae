"""Which checkpoint a run resumes from, and whether it fits the model, optimiser and data of this run."""

from __future__ import annotations

import logging
import os
import warnings
import zipfile
from pathlib import Path

import torch
from hydra.utils import to_absolute_path

from .config import ConfigError
from .data import SequenceDataModule
from .run_files import CHECKPOINT_SUFFIX, CHECKPOINTS
from .tasks import RecurrentTask

log = logging.getLogger("lltm_train")


def slurm_requeued() -> bool:
    """Whether this process runs a SLURM job that was requeued (after preemption, or by submitit near the
    job's time limit): SLURM counts the restarts in ``SLURM_RESTART_COUNT``."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0
    except ValueError:
        return False


def resolve_checkpoint(ckpt_path: str | None, checkpoint_dir: Path, requeued: bool = False,
                       sweep_job: bool = False) -> str | None:
    """The checkpoint to resume from (``ckpt_path``: None, ``"last"`` or a file); refuses to start afresh
    over an earlier run's checkpoints, except that a ``requeued`` job (see :func:`slurm_requeued`) goes on
    from the newest readable one, as ``ckpt_path=last`` would. A ``sweep_job`` with ``ckpt_path=last`` and no
    checkpoint (a killed sweep's job that never started) starts afresh, where another job of the sweep has one.

    Raises:
        ConfigError: no checkpoint where one was asked for, or checkpoints where none was.
    """
    existing = sorted(checkpoint_dir.glob(f"*{CHECKPOINT_SUFFIX}"), key=lambda p: p.stat().st_mtime)
    if ckpt_path is None and requeued and existing:
        log.info(f"lltm-train: a requeued job: resuming from the newest checkpoint in {checkpoint_dir}")
        ckpt_path = "last"
    if ckpt_path is None:
        if existing:
            raise ConfigError(f"{checkpoint_dir} holds checkpoints of an earlier run: resume it with ckpt_path=last, "
                              "or leave hydra.run.dir to its default for a new run")
        return None
    if ckpt_path == "last":
        sweep_dir = checkpoint_dir.parent.parent
        if not existing and sweep_job and any(sweep_dir.glob(f"*/{CHECKPOINTS}/*{CHECKPOINT_SUFFIX}")):
            log.info(f"lltm-train: ckpt_path=last: no checkpoint in {checkpoint_dir}: this sweep job starts afresh")
            return None
        if not existing and sweep_job:  # no job of it has one: a mistyped or forgotten hydra.sweep.dir
            raise ConfigError(f"ckpt_path=last: no job of the sweep in {sweep_dir} has a checkpoint; name the sweep to "
                              "resume with hydra.sweep.dir=<its folder, e.g. multirun/2026-11-29_16-00-00>, or run it "
                              "without ckpt_path")
        if not existing:
            raise ConfigError(f"ckpt_path=last: no checkpoint in {checkpoint_dir}; name the run to resume with "
                              "hydra.run.dir=<its directory, e.g. outputs/shakespeare/2026-11-29_16-00-00>")
        # The furthest readable one, by training step (a best-step*.ckpt may be newer on disk than last.ckpt
        # and behind it); the newest of equal steps. A damaged file is passed over, with a warning.
        damaged, readable = [], []
        for path in existing:
            try:
                readable.append((int(read_checkpoint(path).get("global_step", 0)), path))
            except ConfigError as exc:
                damaged.append(str(exc))
        if not readable:
            raise ConfigError(f"ckpt_path=last: no readable checkpoint in {checkpoint_dir}: " + "; ".join(damaged))
        step = max(s for s, _ in readable)
        path = [p for s, p in readable if s == step][-1]  # (readable is in the order of the files' times)
        for message in damaged:
            warnings.warn(f"ckpt_path=last: {message}; resuming from {path.name} (step {step}) instead", stacklevel=2)
        return str(path)
    path = Path(to_absolute_path(ckpt_path))
    if not path.is_file():
        raise ConfigError(f"ckpt_path: no such checkpoint file: {path}" + (
            " (a folder: name a .ckpt file in it, or give ckpt_path=last with hydra.run.dir=<the run's folder>)"
            if path.is_dir() else ""))
    return str(path)


def read_checkpoint(path: Path) -> dict:
    """The checkpoint's contents, tensors mapped from the file rather than read.

    Raises:
        ConfigError: one line naming the file: missing, a folder, unreadable (truncated, damaged, not written by
            torch.save) or not a Lightning checkpoint.
    """
    if not Path(path).is_file():
        raise ConfigError(f"no such checkpoint file: {path}" + (" (a folder)" if Path(path).is_dir() else ""))
    # torch.load does not check the CRC-32 that torch.save writes for each record: bytes changed inside a tensor
    # would load as other weights. zipfile checks them (one read of the file); a file that is no zip is left to
    # torch.load's own message.
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        bad = None
    if bad is not None:
        raise ConfigError(f"{path} is not a readable checkpoint (damaged: its record {bad} fails its CRC-32 check, "
                          "so its contents changed after torch.save wrote them)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - not a torch file, or pickled objects weights_only refuses
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"{path} is not a readable checkpoint (damaged, or not written by torch.save: "
                          f"{type(exc).__name__}: {reason})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise ConfigError(f"{path} is not a Lightning checkpoint (it has no state_dict)")
    return ckpt


def _heads_hint(task: RecurrentTask, ours: dict, theirs: dict) -> str:
    """"; it has model.num_heads=N" where a recurrent weight of the same rows but another width says so."""
    heads = task.hparams.get("num_heads", 1)
    for key, v in ours.items():
        t = theirs.get(key)
        if key.rsplit(".", 1)[-1].startswith("weight_hh") and t is not None and t.dim() == v.dim() == 2 \
                and t.shape[0] == v.shape[0] and 0 < t.shape[1] != v.shape[1] and (v.shape[1] * heads) % t.shape[1] == 0:
            return f"; its recurrent weights are those of model.num_heads={v.shape[1] * heads // t.shape[1]}, this model's of {heads}"
    return ""


_RESUME_HINT = "resume with the dataset and model settings of the run that wrote it (its .hydra/config.yaml)"


def check_fits(path: str, task: RecurrentTask, datamodule: SequenceDataModule) -> tuple[int, dict]:
    """Raises ConfigError unless the checkpoint holds this model's parameters (names and shapes) and cell (the
    hyperparameter: the Elman RNN's tanh and ReLU have the same shapes), this optimiser's state, and data state
    (a text's vocabulary) that this data module accepts. Returns the checkpoint's step (optimiser steps done) and
    its data settings (``{}`` where it has none), for :func:`check_data_settings` once the run's are known."""
    try:
        ckpt = read_checkpoint(Path(path))
    except ConfigError as exc:
        raise ConfigError(f"ckpt_path: {exc}") from None
    written = (ckpt.get("hyper_parameters") or {}).get("cell")
    cell = task.hparams.get("cell")
    # The cell first: it names the cause, where the parameters' names and shapes below would only list its effects
    # (and rnn and rnn_relu have the same parameters)
    if isinstance(written, str) and isinstance(cell, str) and written != cell:
        raise ConfigError(f"ckpt_path: {path} was written by another model (model.cell={written}; this run has "
                          f"model.cell={cell}); {_RESUME_HINT}")
    ours, theirs = task.state_dict(), ckpt["state_dict"]
    problems = [f"{k} is {tuple(theirs[k].shape)} there, {tuple(v.shape)} here" for k, v in ours.items()
                if k in theirs and tuple(theirs[k].shape) != tuple(v.shape)]
    problems += [f"{k} is missing there" for k in ours.keys() - theirs.keys()]
    problems += [f"{k} is not in this model" for k in theirs.keys() - ours.keys()]
    if problems:
        raise ConfigError(f"ckpt_path: {path} was written by another model ({'; '.join(sorted(problems)[:3])}"
                          f"{_heads_hint(task, ours, theirs)}); {_RESUME_HINT}")
    optimizer = task.optimizer_factory(task.parameters())
    saved = ckpt.get("optimizer_states") or [{}]
    saved_keys = set(next(iter(saved[0].get("param_groups", [])), {})) - {"params", "initial_lr"}  # the latter from the lr schedule
    our_keys = set(optimizer.param_groups[0]) - {"params", "initial_lr"}
    if saved_keys and saved_keys != our_keys:
        raise ConfigError(f"ckpt_path: {path} holds the state of another optimizer (settings {sorted(saved_keys)}); resume with "
                          f"the model.optimizer of the run that wrote it")
    restore_data_state(ckpt, datamodule)
    settings = next((state["settings"] for state in _data_states(ckpt) if isinstance(state.get("settings"), dict)), {})
    return int(ckpt.get("global_step", 0)), settings


# loader processes change no batch, and a text is checked by its contents (TextDataModule: a moved file is the same
# text); the rest (batch size, lengths, splits, permutation, seed, data set) decide which batches the resumed steps see
_DATA_SETTINGS_FREE = {"dataset.num_workers", "dataset.path"}
_UNSET = "(not set)"


def _deciding(theirs: dict, ours: dict) -> tuple[dict, dict]:
    """The settings that change a batch: a permutation's seed only where either side's data set is permuted."""
    if theirs.get("dataset.permute") is False and ours.get("dataset.permute") is False:
        return tuple({k: v for k, v in d.items() if k != "dataset.permutation_seed"} for d in (theirs, ours))
    return theirs, ours


def check_data_settings(path: str, theirs: dict, ours: dict) -> None:
    """ConfigError where a checkpoint's data settings (:attr:`SequenceDataModule.settings`, saved since
    2026-12-07: older checkpoints have none, and a warning says they are not checked) differ from this run's, a
    setting one side lacks included, but for the loader processes, a text's path and the permutation seed of an
    unpermuted data set."""
    if not theirs:
        warnings.warn(f"ckpt_path: {path} holds no data settings (written before 2026-12-07), so other ones are not "
                      "refused: resume with the dataset settings and seed of the run that wrote it", stacklevel=3)
        return
    theirs, ours = _deciding(theirs, ours)
    changed = [f"{key}={theirs.get(key, _UNSET)} there, {ours.get(key, _UNSET)} here"
               for key in sorted(ours.keys() | theirs.keys())
               if key not in _DATA_SETTINGS_FREE and theirs.get(key, _UNSET) != ours.get(key, _UNSET)]
    if changed:
        raise ConfigError(f"ckpt_path: {path} was written with other data settings ({'; '.join(changed[:3])}): "
                          f"its remaining batches would not be the ones it left; {_RESUME_HINT}")


def _data_states(ckpt: dict) -> list[dict]:
    """The data-module states in the checkpoint. Lightning files each under the writing data module's class
    name; all of them are taken, so that a checkpoint of one text cannot resume on another text whose characters
    happen to get the same ids."""
    names = set()
    todo = [SequenceDataModule]
    while todo:
        cls = todo.pop()
        names.add(cls.__qualname__)
        todo += cls.__subclasses__()
    return [state for name, state in ckpt.items() if name in names and isinstance(state, dict) and state]


def restore_data_state(ckpt: dict, datamodule: SequenceDataModule) -> None:
    """Hands the data-module states in the checkpoint to ``datamodule.load_state_dict`` (a text data set
    refuses a vocabulary other than its own there)."""
    for state in _data_states(ckpt):
        datamodule.load_state_dict(state)
