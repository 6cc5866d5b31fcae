"""lltm-report: one table and plots for the runs of a sweep, failed and unfinished ones included."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import yaml

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


def test_an_optuna_search_minimises_the_returned_metric_and_goes_on_past_a_failed_trial(tmp_path):
    # The recipe's search space, with the hidden size narrowed to a tiny model or an impossible one (-1)
    tiny = [o for o in TINY if not o.startswith("model.hidden_size=")]
    search = run(tmp_path, "hparams_search=lm_optuna", "optimized_metric=val/loss", *tiny, "hydra.sweeper.n_trials=4",
                 "model.hidden_size=choice(6,-1)", "hydra.sweep.dir=search")
    with open(tmp_path / "search" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    failed = [r for r in rows if r["status"].startswith("failed")]
    finished = [r for r in rows if r["status"] == "finished"]
    assert len(rows) == 4 and len(failed) + len(finished) == 4 and finished, search.stderr[-3000:]
    assert search.returncode == len(failed)  # the number of failed jobs, as for any sweep
    assert all("hidden_size must be a positive integer, got -1" in r["status"] for r in failed)
    for r in rows:  # every trial got a value from each range of the search space
        setting = dict(kv.split("=", 1) for kv in r["changed"].split())
        assert 0.0005 <= float(setting["model.optimizer.lr"]) <= 0.02
        assert 0.0 <= float(setting["model.dropout"]) <= 0.3
        assert 0.0001 <= float(setting["model.optimizer.weight_decay"]) <= 0.1
    assert [r["rank"] for r in rows] == [str(i + 1) for i in range(len(finished))] + [""] * len(failed)
    result = yaml.safe_load((tmp_path / "search" / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(float(rows[0]["final"]), rel=1e-6)  # what the best job returned
    assert result["best_params"]["model.hidden_size"] == 6
    assert "Optuna's best trial: model.optimizer.lr=" in (tmp_path / "search" / "report.md").read_text()


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
