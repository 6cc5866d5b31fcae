"""The files and folders of a run directory (``paths.output_dir``, a sweep job's folder), named once for the
modules that write or read them: lltm_train.train, .cli, .report, .checkpoints, .inference, .commands and
the StopCheckpoint callback.

A run directory holds::

    .hydra/           Hydra's record of the job: config.yaml (the composed config) and overrides.yaml (the
                      command line's settings); a resume records its own in .hydra/resume_<date_time>/
    train.log         the job's log (Hydra's job logging)
    checkpoints/      best-step<N>.ckpt and last.ckpt, which ckpt_path=last resumes from
    tensorboard/      logger=tensorboard: the event files and hparams.yaml
    csv/              logger=csv: metrics.csv and hparams.yaml; a resume's in csv/resumed_step<N>/
    mlflow.db         logger=mlflow: MLflow's store (SQLite), its artifacts in mlartifacts/
    error.txt         why the job failed (a sweep's job): one line, then the traceback
    diverged.txt      why the run counts as diverged (model.divergence): one line
    .lock             locked (lockf) by the run training in the folder: a second run aimed at it is refused

The configs name some of these too, and must agree (tests/test_run_files.py checks them): the checkpoint
callbacks' ``dirpath`` and ``filename`` (conf/callbacks/default.yaml), the loggers' folders and MLflow's
store (conf/logger/), the log file (conf/hydra/job_logging/lltm_train.yaml).
"""

from __future__ import annotations

from pathlib import Path

HYDRA = ".hydra"  # Hydra's record of the job (hydra.output_subdir)
CONFIG = "config.yaml"  # in HYDRA: the composed config
OVERRIDES = "overrides.yaml"  # in HYDRA: the command line's settings
LOG = "train.log"
CHECKPOINTS = "checkpoints"
CHECKPOINT_SUFFIX = ".ckpt"
LAST = "last"  # the newest checkpoint, without CHECKPOINT_SUFFIX (ModelCheckpoint's and StopCheckpoint's filename)
LAST_CHECKPOINT = LAST + CHECKPOINT_SUFFIX
TENSORBOARD = "tensorboard"
CSV = "csv"
METRICS_CSV = "metrics.csv"  # in CSV, and in each CSV/resumed_step<N>
HPARAMS = "hparams.yaml"  # in TENSORBOARD or CSV: the logger's record of the run's settings
RESUMED_CSV = "resumed_step"  # in CSV: a resume's own folder, resumed_step<N> (N: the step it resumed at)
MLFLOW_DB = "mlflow.db"
ERROR = "error.txt"
DIVERGED = "diverged.txt"
LOCK = ".lock"
SWEEP_JOB = "LLTM_SWEEP_JOB"  # environment: "1" in the other processes of a sweep job's DDP run


def config_record(run_dir: str | Path) -> Path:
    """The run's composed config, ``<run_dir>/.hydra/config.yaml`` (the first run's, never a resume's)."""
    return Path(run_dir) / HYDRA / CONFIG


def overrides_record(run_dir: str | Path) -> Path:
    """The run's command-line settings, ``<run_dir>/.hydra/overrides.yaml``."""
    return Path(run_dir) / HYDRA / OVERRIDES


def checkpoint_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/checkpoints``."""
    return Path(run_dir) / CHECKPOINTS


def run_dir_of(checkpoint: str | Path) -> Path:
    """The run directory of a checkpoint in its ``checkpoints/`` folder (resolved: an absolute path)."""
    return Path(checkpoint).resolve().parent.parent


def resumed_csv_version(step: int) -> str:
    """The CSV logger's folder (its ``version``) for a run resumed at ``step``: ``resumed_step<step>``."""
    return f"{RESUMED_CSV}{step}"
