"""lltm-report: one table and plots for the runs of a sweep, failed and unfinished ones included."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from test_preemption import ADDING, run

TINY = [*ADDING, "dataset.train_size=64", "trainer.val_check_interval=2", "callbacks.progress_bar.refresh_rate=0",
        "trainer.max_steps=4"]


def test_a_sweep_report_ranks_the_runs_and_lists_the_failed_and_unfinished_ones(tmp_path):
    sweep = run(tmp_path, "-m", *TINY, "model.hidden_size=4,12,-1", "hydra.sweep.dir=multi")
    assert sweep.returncode == 1  # the third job fails (hidden_size=-1)
    killed = run(tmp_path, *TINY, "model.hidden_size=6", "hydra.run.dir=multi/3_killed",
                 "+callbacks.kill._target_=test_preemption.SigkillAt", "+callbacks.kill.step=3")
    assert killed.returncode < 0
    report = subprocess.run([sys.executable, "-m", "lltm_train.report", str(tmp_path / "multi"), "--metric", "val/loss"],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "| run | status |" in report.stdout  # the table, on the terminal too
    with open(tmp_path / "multi" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    by_run = {r["run"]: r for r in rows}
    assert set(by_run) == {"0_model.hidden_size=4", "1_model.hidden_size=12", "2_model.hidden_size=-1", "3_killed"}
    assert by_run["2_model.hidden_size=-1"]["status"].startswith("failed")
    assert by_run["3_killed"]["status"].startswith("unfinished at step")
    finished = [r for r in rows if r["status"] == "finished"]
    assert len(finished) == 2 and rows[:2] == sorted(finished, key=lambda r: float(r["final"]))  # best first
    for name in ("0_model.hidden_size=4", "1_model.hidden_size=12", "2_model.hidden_size=-1"):  # what differs
        assert name.split("_", 1)[1] in by_run[name]["changed"].split()
    assert rows[-1]["run"] == "2_model.hidden_size=-1"  # no metric: last
    assert all(r["backend"] == "cpp" and r["cell"] == "lltm" for r in finished)
    assert {int(r["parameters"]) for r in finished} == {_lltm_regressor_parameters(4), _lltm_regressor_parameters(12)}
    assert all(float(r["best"]) <= float(r["final"]) for r in finished)
    for name in ("report.md", "metric_vs_step.png", "metric_vs_time.png", "train_loss.png", "tokens_per_s.png"):
        assert (tmp_path / "multi" / name).stat().st_size > 0, name


def _lltm_regressor_parameters(hidden: int, inputs: int = 2, outputs: int = 1) -> int:
    return 3 * hidden * (inputs + hidden + 1) + hidden * outputs + outputs  # the LLTM layer and the linear head


def test_an_empty_folder_is_a_clear_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "lltm_train.report", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "no runs in" in result.stderr


@pytest.mark.slow
def test_compare_backends_sweeps_every_backend_here_and_every_cell_then_reports(tmp_path):
    import lltm_train

    result = run(tmp_path, "experiment=compare_backends", "trainer.max_steps=2", "trainer.val_check_interval=2",
                 "dataset.batch_size=4", "model.hidden_size=8", "model.embedding_dim=4", "model.sample_length=0",
                 "trainer.limit_val_batches=1", "callbacks.progress_bar.refresh_rate=0",
                 "hydra.sweep.dir=compare")
    assert result.returncode == 0, result.stderr[-3000:]
    backends = lltm_train.available_backends()  # cuda runs on the GPU machine, cpp on its CPU
    with open(tmp_path / "compare" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["run"].split("_", 1)[1] for r in rows) == sorted(
        f"backend={b}_model.cell={c}" for b in backends for c in ("lltm", "lstm", "gru"))
    assert all(r["status"] == "finished" for r in rows)
    assert {r["backend"] for r in rows if r["cell"] == "lltm"} == set(backends)
