"""The run directory's names (:mod:`lltm_train.run_files`) are those the configs give Lightning and Hydra."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import lltm_train.cli  # noqa: F401 - registers the resolvers the configs use
from lltm_train import run_files
from lltm_train.callbacks import StopCheckpoint
from lltm_train.config import config_dir


def _compose(out, *overrides, hydra=False):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("config", overrides=[f"paths.output_dir={out}", *overrides], return_hydra_config=hydra)


def test_the_checkpoint_callbacks_write_where_run_files_says(tmp_path):
    callbacks = _compose(tmp_path).callbacks
    for name in ("model_checkpoint", "last_checkpoint", "stop_checkpoint"):
        assert Path(callbacks[name].dirpath) == run_files.checkpoint_dir(tmp_path)
    assert callbacks.last_checkpoint.filename == run_files.LAST
    stop = StopCheckpoint(str(run_files.checkpoint_dir(tmp_path)))
    assert stop.path == run_files.checkpoint_dir(tmp_path) / run_files.LAST_CHECKPOINT


@pytest.mark.parametrize("logger, folder", [("tensorboard", run_files.TENSORBOARD), ("csv", run_files.CSV)])
def test_the_loggers_write_where_run_files_says(tmp_path, logger, folder):
    cfg = _compose(tmp_path, f"logger={logger}").logger
    assert Path(cfg.save_dir) == tmp_path and cfg.name == folder and cfg.version == ""


def test_mlflow_stores_where_run_files_says(tmp_path):
    assert _compose(tmp_path, "logger=mlflow").logger.tracking_uri == f"sqlite:///{tmp_path / run_files.MLFLOW_DB}"


def test_hydra_records_and_logs_where_run_files_says(tmp_path):
    hydra = _compose(tmp_path, hydra=True).hydra
    assert hydra.output_subdir == run_files.HYDRA  # a new run (a resume records into .hydra/resume_<date_time>)
    handlers = OmegaConf.to_container(hydra.job_logging, resolve=False)["handlers"]
    assert handlers["file"]["filename"].endswith("/" + run_files.LOG)


def test_the_records_and_folders_of_a_run(tmp_path):
    assert run_files.config_record(tmp_path) == tmp_path / ".hydra" / "config.yaml"
    assert run_files.overrides_record(tmp_path) == tmp_path / ".hydra" / "overrides.yaml"
    assert run_files.run_dir_of(tmp_path / "checkpoints" / "last.ckpt") == tmp_path.resolve()
    assert run_files.resumed_csv_version(40) == "resumed_step40"
