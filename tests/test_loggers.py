"""The loggers users have besides TensorBoard, end to end: logger=csv (read by lltm-report) and
logger=mlflow (a local file store in the run folder, no server)."""

from __future__ import annotations

import csv
import sys

import pytest

from helpers import make_cfg, run
from lltm_train.config import ConfigError
from lltm_train.report import find_runs, main as report_main, read_run
from lltm_train.train import train

SMALL = ["dataset.seq_len=16", "dataset.batch_size=4", "model.sample_length=0", "trainer.limit_val_batches=1",
         "trainer.max_steps=20", "trainer.val_check_interval=10"]


def test_the_csv_logger_is_read_by_the_report(tmp_path, capsys):
    """logger=csv writes csv/metrics.csv and hparams.yaml; lltm-report ranks the run from them, with its
    seconds of training from time/train_seconds (CSV rows have no wall time)."""
    train(make_cfg(tmp_path / "run", *SMALL, "logger=csv"))
    assert (tmp_path / "run" / "csv" / "metrics.csv").is_file() and not (tmp_path / "run" / "tensorboard").exists()
    r = read_run(tmp_path / "run")
    assert [s for s, _, _ in r.curve("val/bpc")] == [9, 19] and r.backend == "cpp" and r.parameters
    assert len(r.timed("val/bpc")) == 2 and 0 < r.timed("val/bpc")[0][0] < r.timed("val/bpc")[1][0]
    report_main([str(tmp_path / "run"), "--metric", "val/bpc", "--at-seconds", "1000"])
    with open(tmp_path / "run" / "report.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["status"] == "finished" and float(row["at_seconds"]) == float(row["final"]) == r.curve("val/bpc")[-1][2]



def test_logger_mlflow_without_mlflow_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed: importing it fails
    with pytest.raises(ConfigError, match=r"logger=mlflow needs the mlflow package: pip install '\.\[mlflow\]'"):
        train(make_cfg(tmp_path, *SMALL, "logger=mlflow"))


def test_the_mlflow_logger_keeps_the_run_in_a_local_store(tmp_path):
    """logger=mlflow: the run's parameters and metrics in <run dir>/mlflow.db, read back with MLflow's client."""
    pytest.importorskip("mlflow", reason="logger=mlflow needs mlflow (pip install '.[mlflow]', part of the dev extra)")
    from mlflow.tracking import MlflowClient

    metrics = train(make_cfg(tmp_path, *SMALL, "logger=mlflow"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("lltm-train").experiment_id])
    assert run.data.params["backend_used"] == "cpp" and run.data.params["model/cell"] == "lltm"
    history = client.get_metric_history(run.info.run_id, "val/bpc")
    assert [m.step for m in history] == [9, 19] and history[-1].value == pytest.approx(metrics["val/bpc"])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "time/train_seconds")] == [9, 19]
    read = read_run(tmp_path)  # lltm-report reads the store with sqlite3
    assert read.backend == "cpp" and read.parameters and [s for s, _, _ in read.curve("val/bpc")] == [9, 19]
    assert [v for _, _, v in read.curve("val/bpc")] == [m.value for m in history] and read.status == "finished"


def test_a_resumed_csv_run_keeps_the_first_runs_rows(tmp_path):
    """Lightning's CSV logger would delete the earlier file: the resumed run writes its own, and the report
    reads both, the resumed run's values replacing the earlier ones from its step on."""
    common = [*SMALL, "logger=csv", "trainer.accelerator=cpu", "hydra.run.dir=run"]
    first = run(tmp_path, *common)
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run(tmp_path, *[o for o in common if not o.startswith("trainer.max_steps")], "trainer.max_steps=40",
                  "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (tmp_path / "run" / "csv" / "metrics.csv").is_file()
    assert (tmp_path / "run" / "csv" / "resumed_step20" / "metrics.csv").is_file()
    r = read_run(tmp_path / "run")
    assert [s for s, _, _ in r.curve("val/bpc")] == [9, 19, 29, 39]
    steps = [s for s, _, _ in r.curve("train/loss")]
    assert steps and steps == sorted(set(steps))  # one value a step
    # resumed from a checkpoint file into a folder of its own: only csv/resumed_step40/, which the report reads
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    moved = run(tmp_path, *[o for o in common if not o.startswith(("trainer.max_steps", "hydra.run.dir"))],
                "trainer.max_steps=60", f"ckpt_path={ckpt}", "hydra.run.dir=run2")
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert not (tmp_path / "run2" / "csv" / "metrics.csv").exists()
    assert [s for s, _, _ in read_run(tmp_path / "run2").curve("val/bpc")] == [49, 59]
    assert find_runs(tmp_path / "run2") == [tmp_path / "run2"]
