"""The ``lltm-train`` command (also ``python -m lltm_train``): Hydra composes ``conf/``, :func:`train` runs it.

Errors in the command line or the configuration are printed as one line (``lltm-train: error: ...``) with
exit status 2, before any training; set HYDRA_FULL_ERROR=1 for Hydra's own report with a traceback.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.errors import HydraException, InstantiationException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from .config import ConfigError, config_dir

# Errors that mean "fix the command line or the config" (or a diverged run), not a bug: one line each.
_REPORTED = (ConfigError, HydraException, OmegaConfBaseException, FloatingPointError)
_one_line_errors = True  # False when the user asked for Hydra's full reports (HYDRA_FULL_ERROR)
_job_started = False


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def _run(cfg: DictConfig) -> float | None:
    from .train import train

    global _job_started
    _job_started = True
    try:
        metrics = train(cfg)
    except _REPORTED as exc:  # reported here: Hydra would add its own line about the failed job
        if not _one_line_errors:
            raise
        _remove_if_empty(Path(cfg.paths.output_dir))
        _fail(exc)
    return metrics.get("val/loss")  # what a sweeper would minimise


def _remove_if_empty(run_dir: Path) -> None:
    """Removes the run directory Hydra made for a job that failed before writing anything of its own."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {".hydra", "train.log"}:
        shutil.rmtree(run_dir, ignore_errors=True)


def _fail(exc: BaseException) -> None:
    message = one_line(exc)
    if not isinstance(exc, (ConfigError, HydraException, OmegaConfBaseException)):
        message = f"{type(exc).__name__}: {message}"
    print(f"lltm-train: error: {message}", file=sys.stderr)
    sys.exit(2)


def one_line(exc: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages folded into one line."""
    while isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        exc = exc.__cause__
    parts: list[str] = []
    for raw in str(exc).splitlines():
        line = raw.strip()
        if line.startswith(("Config search path", "Set the environment variable")):
            break
        if not line:
            continue
        if raw[:1].isspace() and parts:  # an indented list under a heading, e.g. the available options
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
        else:
            parts.append(line)
    return "; ".join(parts)


def main() -> None:
    # With HYDRA_FULL_ERROR set, Hydra raises its composition errors instead of printing them, so they can
    # be reported here in one line; a user who sets it gets Hydra's full report instead.
    global _one_line_errors
    if "HYDRA_FULL_ERROR" in os.environ:
        _one_line_errors = False
        _run()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _run()
    except _REPORTED as exc:
        _fail(exc)
    except Exception as exc:  # noqa: BLE001
        if _job_started:  # a failure during training: a bug or the machine; keep the traceback
            raise
        _fail(exc)  # Hydra could not even start the job: the command line or the run directory is wrong
