"""lltm-report: one table and plots for the runs of a sweep, failed and unfinished ones included."""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
import sys

from pathlib import Path

import pytest
import torch
import yaml

from lltm_train.config import cell_backends
from lltm_train.ops.cells import CELLS
from lltm_train.report import Run, find_runs, labels, main as report_main, plot, read_run, summarise

from helpers import ADDING, run

TINY = [*ADDING, "dataset.train_size=64", "trainer.val_check_interval=2", "callbacks.progress_bar.refresh_rate=0",
        "trainer.max_steps=4"]


def test_a_sweep_report_ranks_the_runs_and_lists_the_failed_and_unfinished_ones(tmp_path):
    sweep = run(tmp_path, "-m", *TINY, "model.hidden_size=4,12,-1", "hydra.sweep.dir=multi")
    assert sweep.returncode == 1  # the third job fails (hidden_size=-1)
    killed = run(tmp_path, *TINY, "model.hidden_size=6", "hydra.run.dir=multi/3_killed",
                 "+callbacks.kill._target_=helpers.SigkillAt", "+callbacks.kill.step=3")
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
    # the plots name each job by its number and what differs (the killed run's callback too), not by its folder
    named = labels([read_run(p) for p in find_runs(tmp_path / "multi")])
    assert {p.name: text for p, text in named.items()} == {
        "0_model.hidden_size=4": "0: hidden_size=4", "1_model.hidden_size=12": "1: hidden_size=12",
        "2_model.hidden_size=-1": "2: hidden_size=-1",
        "3_killed": "3: callbacks.kill._target_=helpers.SigkillAt step=3 hidden_size=6"}


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
    assert "\x1b[" not in search.stderr and "alembic" not in search.stdout  # plain logs, no plugin listing
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


def test_a_search_whose_trials_all_fail_ends_with_one_line_and_the_count(tmp_path):
    tiny = [o for o in TINY if not o.startswith("model.hidden_size=")]
    search = run(tmp_path, "hparams_search=lm_optuna", "optimized_metric=val/bpc", *tiny, "hydra.sweeper.n_trials=2",
                 "model.hidden_size=8", "hydra.sweep.dir=s")
    assert search.returncode == 2, search.stderr[-3000:]  # both trials
    lines = search.stderr.strip().splitlines()
    assert lines[-1].startswith("lltm-train: error: no trial of the search finished") and "Traceback" not in search.stderr
    assert sum("optimized_metric=val/bpc: RegressionTask logs val/loss" in line for line in lines) >= 2


def test_a_diverged_trial_is_a_failed_trial_and_the_search_goes_on(tmp_path):
    tiny = [o for o in TINY if not o.startswith("model.hidden_size=")]
    search = run(tmp_path, "hparams_search=lm_optuna", "optimized_metric=val/loss", *tiny, "hydra.sweeper.n_trials=4",
                 "model.nonfinite=skip", "model.optimizer.lr=choice(1e30,0.001)", "model.hidden_size=8", "hydra.sweep.dir=s")
    with open(tmp_path / "s" / "report.csv") as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    diverged = [name for name in rows if "lr=1e30" in name]
    assert len(rows) == 4 and diverged and len(diverged) < 4, search.stderr[-3000:]
    assert search.returncode == len(diverged)
    for name in diverged:
        assert "optimized_metric val/loss: " in rows[name]["status"] and "(the run diverged)" in rows[name]["status"]
        assert rows[name]["rank"] == ""
    assert (tmp_path / "s" / "optimization_results.yaml").is_file()  # the search ended normally


@pytest.mark.slow  # three commands (about 30 s on 2 cores)
def test_a_trial_resumes_as_one_run_and_a_search_run_again_leaves_the_old_trials_alone(tmp_path):
    tiny = [o for o in TINY if not o.startswith("model.hidden_size=")]
    first = run(tmp_path, "hparams_search=lm_optuna", "optimized_metric=val/loss", *tiny, "hydra.sweeper.n_trials=1",
                "model.hidden_size=8", "hydra.sweep.dir=s")
    assert first.returncode == 0, first.stderr[-3000:]
    trial = next(p for p in (tmp_path / "s").iterdir() if p.is_dir())
    again = run(tmp_path, "hparams_search=lm_optuna", "optimized_metric=val/loss", *tiny, "hydra.sweeper.n_trials=1",
                "model.hidden_size=8", "hydra.sweep.dir=s")
    assert again.returncode == 1 and "holds checkpoints of an earlier run" in again.stderr, again.stderr[-3000:]
    assert not (trial / "error.txt").exists()  # the earlier trial is not marked failed by the refused one
    resumed = run(tmp_path, f"hydra.run.dir={trial}", "ckpt_path=last", "trainer.max_steps=6")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (tmp_path / "multirun").exists()  # no new search
    assert torch.load(trial / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6


def test_a_resumed_run_is_judged_by_its_latest_resume_that_trained(tmp_path):
    """A run killed at step 724 of 5,000 and resumed with trainer.max_steps=1000 finished: the report read the first
    run's record alone and called it "unfinished at step 1000 of 5000". A resume refused before training (its
    record written after the last checkpoint) changes nothing."""
    import os

    folder = tmp_path / "a"
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "metrics.csv").write_text("step,train/loss\n" + "".join(f"{s},1.0\n" for s in (499, 999)))
    records = {".hydra": 5000, ".hydra/resume_2026-12-07_10-00-00": 1000, ".hydra/resume_2026-12-07_11-00-00": 9000}
    for when, (sub, steps) in enumerate(records.items()):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "config.yaml").write_text(yaml.safe_dump({"trainer": {"max_steps": steps}}))
        given = [f"trainer.max_steps={steps}", *(["ckpt_path=last"] if when else [])]
        (folder / sub / "overrides.yaml").write_text(yaml.safe_dump(given))
        os.utime(folder / sub / "config.yaml", (1000 + 100 * when,) * 2)
        if when == 1:  # the resume that trained wrote the last checkpoint; the one after it was refused
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
            os.utime(folder / "checkpoints" / "last.ckpt", (1150,) * 2)
    read = read_run(folder)
    assert read.status == "finished" and read.overrides == {"trainer.max_steps": "1000"}
    os.utime(folder / "checkpoints" / "last.ckpt", (900,) * 2)  # no resume trained: the first run's record
    read = read_run(folder)
    assert read.status == "unfinished at step 1000 of 5000 (running, or stopped)"  # (no lock file: cannot tell)
    assert read.overrides == {"trainer.max_steps": "5000"}
    # the run folder's lock tells the two apart: held by a process (a run training there), or not
    (folder / ".lock").touch()
    assert read_run(folder).status == "unfinished at step 1000 of 5000 (stopped)"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.lockf(f, fcntl.LOCK_EX); print(1, flush=True); time.sleep(60)",
                               str(folder / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "1"
        assert read_run(folder).status == "unfinished at step 1000 of 5000 (running)"
    finally:
        holder.kill()
        holder.wait()


def test_the_report_ranks_accuracies_highest_first_and_diverged_runs_last(tmp_path):
    runs = [Run(tmp_path / name, curves={"val/acc": [(1, 0.0, 0.2), (2, 1.0, value)]})
            for name, value in (("a", 0.5), ("b", float("nan")), ("c", 0.9), ("d", 0.7))]
    rows = summarise(runs, "val/acc")
    assert [Path(r["run"]).name for r in rows] == ["c", "d", "a", "b"]
    assert [r["rank"] for r in rows] == [1, 2, 3, None]
    assert rows[-1]["status"] == "diverged (val/acc = nan)" and rows[-1]["best"] == 0.2
    assert [r["rank"] for r in summarise(runs, "val/loss")] == [None] * 4  # no run logged it


def test_runs_with_equal_values_share_a_rank_and_the_next_rank_skips(tmp_path):
    runs = [Run(tmp_path / name, curves={"val/loss": [(1, 0.0, value)]})
            for name, value in (("a", 2.5), ("b", 1.25), ("c", 1.25), ("d", 3.0), ("e", 2.5))]
    rows = summarise(runs, "val/loss")
    assert [(Path(r["run"]).name, r["rank"]) for r in rows] == [("b", 1), ("c", 1), ("a", 3), ("e", 3), ("d", 5)]
    # equal as the table shows them (4 significant digits): 2.766 and 2.766 read the same, so they share a rank
    # (before, digits the table hides ranked them 1 and 2)
    runs = [Run(tmp_path / name, curves={"val/loss": [(1, 0.0, value)]})
            for name, value in (("x", 2.76601), ("y", 2.76604), ("z", 2.767))]
    rows = summarise(runs, "val/loss")
    assert [(Path(r["run"]).name, r["rank"]) for r in rows] == [("x", 1), ("y", 1), ("z", 3)]


def _finished_run(tmp_path_factory, name: str, run_dir: str, overrides: list[str]) -> Path:
    folder = tmp_path_factory.mktemp(name)
    result = run(folder, *overrides, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    """A folder holding one finished tiny run (hydra.run.dir=r), made once for the tests that copy it."""
    return _finished_run(tmp_path_factory, "one_run", "r", TINY)


# A character model (the copy task: a LanguageModelTask, like the default job) validated every second epoch
# of 8 steps for 3 epochs: a validation after step 16, then one after the last step, 24 (the run's last step
# validates inside fit although its epoch is not a validation epoch), and the test.
LM = ["dataset=copy", "dataset.delay=4", "dataset.length=3", "dataset.train_size=64", "dataset.val_size=16",
      "dataset.test_size=16", "dataset.batch_size=8", "model.hidden_size=8", "model.embedding_dim=4",
      "model.sample_length=0", "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0",
      "trainer.accelerator=cpu", "callbacks.progress_bar.refresh_rate=0", "trainer.val_check_interval=null",
      "trainer.check_val_every_n_epoch=2", "trainer.max_epochs=3", "trainer.max_steps=-1", "test=true"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A folder holding one finished tiny character model run (hydra.run.dir=lm), made once (about 10 s)."""
    return _finished_run(tmp_path_factory, "lm_run", "lm", LM)


def _copy(run_dir: Path, to: Path, optimized_metric: str | None = None) -> Path:
    shutil.copytree(run_dir, to)
    if optimized_metric:  # as the run's config recorded it (runs before conf/metric recorded val/loss for every task)
        config = to / ".hydra" / "config.yaml"
        text = re.sub(r"(?m)^optimized_metric: .*$", f"optimized_metric: {optimized_metric}", config.read_text())
        config.write_text(text)
    return to


def _report_rows(folder: Path, *args: str) -> tuple[list[dict], str]:
    """lltm-report FOLDER ARGS in this process: report.csv's rows and report.md."""
    report_main([str(folder), *args])
    with open(folder / "report.csv") as f:
        return list(csv.DictReader(f)), (folder / "report.md").read_text()


def test_an_empty_metric_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        report_main([str(tmp_path), "--metric", " "])  # (it said "no run logged ;")
    assert exit_.value.code == 2 and "--metric: a metric's name (val/loss" in capsys.readouterr().err


def test_without_flags_the_report_ranks_by_the_runs_optimized_metric(tmp_path, lm_run, one_run, capsys):
    """A language model's runs are ranked by bits per character without --metric (it was val/loss): the
    optimized_metric their configs record, also for runs recorded with the former default val/loss (the same
    order: val/bpc is val/loss / ln 2); --metric still wins; a regression run by its own, val/loss."""
    lm = _copy(lm_run / "lm", tmp_path / "lm" / "2026-12-01_10-00-00")
    _copy(lm_run / "lm", tmp_path / "lm" / "2026-12-01_11-00-00", optimized_metric="val/loss")
    bpc = [v for _, _, v in read_run(lm).curve("val/bpc")]
    rows, md = _report_rows(tmp_path / "lm")
    assert "Ranked by the final val/bpc (lower is better" in md and "| final val/bpc |" in md
    assert [float(r["final"]) for r in rows] == pytest.approx([bpc[-1]] * 2) and [r["rank"] for r in rows] == ["1", "1"]
    rows, md = _report_rows(tmp_path / "lm", "--metric", "val/loss")
    assert "Ranked by the final val/loss" in md
    assert float(rows[0]["final"]) == pytest.approx(bpc[-1] * math.log(2), rel=1e-5)
    _copy(one_run / "r", tmp_path / "adding" / "r")
    assert "Ranked by the final val/loss" in _report_rows(tmp_path / "adding")[1]
    # a run that chose val/loss on its command line keeps it
    chosen = _copy(lm_run / "lm", tmp_path / "chosen" / "lm", optimized_metric="val/loss")
    (chosen / ".hydra" / "overrides.yaml").write_text("- optimized_metric=val/loss\n")
    assert "Ranked by the final val/loss" in _report_rows(tmp_path / "chosen")[1]
    assert "note:" not in capsys.readouterr().err


def test_runs_with_different_optimized_metrics_are_ranked_by_the_most_common_with_one_line(tmp_path, lm_run, one_run,
                                                                                           capsys):
    for name in ("0_a", "1_b"):
        _copy(lm_run / "lm", tmp_path / name)
    _copy(one_run / "r", tmp_path / "2_regression")
    rows, md = _report_rows(tmp_path)
    note = ("the runs optimise different metrics: val/bpc (2 runs), val/loss (1 run); ranked by val/bpc, the most "
            "common (--metric picks another)")
    assert [line for line in capsys.readouterr().err.splitlines() if "note:" in line] == [f"lltm-report: note: {note}"]
    assert "The r" + note[5:] + "." in md
    # a tie (two copies of one run); the regression run has no val/bpc
    assert [(r["run"], r["rank"]) for r in rows] == [("0_a", "1"), ("1_b", "1"), ("2_regression", "")]
    report_main([str(tmp_path), "--metric", "val/loss"])
    assert "note:" not in capsys.readouterr().err


def test_best_step_and_the_plots_count_optimiser_steps_as_the_checkpoints_do(tmp_path, one_run, lm_run, monkeypatch):
    """Lightning logs a validation during training after step N at step N - 1, but the test and a validation
    after training at N: the report counted both ways in one column (here 15 and 24). It counts the optimiser
    steps taken, trainer.global_step, as the best checkpoint's name and last.ckpt's global_step do."""
    from matplotlib.figure import Figure

    regression, lm = read_run(one_run / "r"), read_run(lm_run / "lm")
    # the loggers' steps
    assert [s for s, _, _ in regression.curve("val/loss")] == [1, 3]
    assert [s for s, _, _ in lm.curve("val/bpc")] == [15, 23]  # both inside fit (the test: at 24)
    (best,) = (one_run / "r" / "checkpoints").glob("best-step*.ckpt")  # ModelCheckpoint's val/loss, during training
    (row,) = summarise([regression], "val/loss")
    assert row["best_step"] == int(best.stem.removeprefix("best-step")) and row["best_step"] in (2, 4)
    assert [s for s, _ in regression.steps("val/loss")] == [2, 4]
    steps = torch.load(lm_run / "lm" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert steps == 24
    assert [s for s, _ in lm.steps("val/bpc")] == [16, steps] and lm.steps("test/bpc")[0][0] == steps
    (row,) = summarise([lm], "test/bpc")
    assert row["best_step"] == steps
    (row,) = summarise([lm], "val/bpc")
    assert row["best_step"] == min(lm.steps("val/bpc"), key=lambda p: p[1])[0]
    # ModelCheckpoint saw the last step's validation too (val/loss orders the steps as val/bpc does)
    (best,) = (lm_run / "lm" / "checkpoints").glob("best-step*.ckpt")
    assert int(best.stem.removeprefix("best-step")) == row["best_step"]
    assert lm.last_step() == steps and lm.status == "finished"
    plotted = {}
    savefig = Figure.savefig

    def recording_savefig(fig, name, *args, **kwargs):
        plotted[Path(name).name] = [list(line.get_xdata()) for ax in fig.axes for line in ax.get_lines()]
        return savefig(fig, name, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    plot([regression], "val/loss", tmp_path)
    plot([lm], "val/bpc", tmp_path)
    assert plotted["metric_vs_step.png"] == [[16, 24]]
    assert plotted["train_loss.png"] == [list(range(1, 25))]


def test_the_plots_name_the_runs_by_what_differs_else_by_their_folders(tmp_path, one_run, lm_run, monkeypatch):
    """Legends showed run folders (timestamps): they name the settings that differ between the runs plotted,
    as the "changed" column has them; runs alike in those also get their folder; none differ: the folders."""
    from matplotlib.figure import Figure

    regression = _copy(one_run / "r", tmp_path / "2026-12-01_09-00-00")
    first = _copy(lm_run / "lm", tmp_path / "2026-12-01_10-00-00")
    second = _copy(lm_run / "lm", tmp_path / "2026-12-01_11-00-00")
    runs = [read_run(p) for p in (regression, first, second)]
    named = labels(runs)
    # keys shortened, the settings a run left at their defaults left out
    assert named[regression] == "dataset=adding seq_len=10 max_steps=4 val_check_interval=2"
    (row,) = [r for r in summarise(runs, "val/loss") if Path(r["run"]) == regression]
    assert row["changed"].startswith("dataset=adding dataset.delay=- dataset.length=- dataset.seq_len=10 ")  # the column
    for path in (first, second):  # alike: with their folders
        assert named[path].startswith("dataset=copy delay=4 length=3 ") and named[path].endswith(f"… ({path.name})")
    assert len(set(named.values())) == 3 and all(len(text) <= 72 for text in named.values())
    assert labels(runs[1:]) == {first: first.name, second: second.name}  # nothing differs
    legends = {}
    savefig = Figure.savefig

    def recording_savefig(fig, name, *args, **kwargs):
        legends[Path(name).name] = [t.get_text() for ax in fig.axes if ax.get_legend()
                                    for t in ax.get_legend().get_texts()]
        return savefig(fig, name, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    plot(runs, "val/loss", tmp_path)
    assert legends["metric_vs_step.png"] == [named[p] for p in (regression, first, second)]
    assert not any(text.startswith("2026-") for text in legends["metric_vs_step.png"])


@pytest.mark.parametrize("args, message", [
    (["--metric", "val/nonsense"], "no run logged val/nonsense; the runs logged"),
    (["--out", "/proc/forbidden"], "cannot write the report into /proc/forbidden"),
])
def test_report_arguments_that_cannot_work_are_one_line_errors(tmp_path, one_run, args, message):
    shutil.copytree(one_run, tmp_path, dirs_exist_ok=True)
    (tmp_path / "optimization_results.yaml").write_text("best_params: null\n")  # damaged: ignored
    result = subprocess.run([sys.executable, "-m", "lltm_train.report", str(tmp_path), *args], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert subprocess.run([sys.executable, "-m", "lltm_train.report", str(tmp_path)], capture_output=True,
                          timeout=300).returncode == 0


def test_a_runs_own_logger_folder_reports_that_run(tmp_path, one_run):
    """DIR given as a run's tensorboard/ folder: the report is that run's (it was a traceback)."""
    shutil.copytree(one_run, tmp_path, dirs_exist_ok=True)
    result = subprocess.run([sys.executable, "-m", "lltm_train.report", str(tmp_path / "r" / "tensorboard")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    with open(tmp_path / "r" / "report.csv") as f:
        assert [row["run"] for row in csv.DictReader(f)] == ["."]


def test_the_tokens_per_s_plot_shows_the_tables_figure_the_runs_tokens_over_its_seconds(tmp_path, one_run,
                                                                                        monkeypatch):
    """tokens_per_s.png plotted the mean of the logged windows' rates (+18% over the table's figure on a run whose
    first window was slow): it plots the table's figure, the run's tokens over its seconds, for a finished run
    (its logged run average) and for a killed one (none logged: its windows of unequal lengths and rates)."""
    from matplotlib.figure import Figure

    from lltm_train.report import plot, read_run

    finished = read_run(one_run / "r")  # one window a step (log_every_n_steps=1): each window's seconds is its step_ms
    rates, step_ms = ([v for _, _, v in finished.curve(f"throughput/{tag}")] for tag in ("tokens_per_s", "step_ms"))
    assert len(rates) == len(step_ms) == 4
    finished_tokens_per_s = sum(r * ms for r, ms in zip(rates, step_ms)) / sum(step_ms)
    # killed at step 10, logging every 4 steps (then every 2): windows (steps, tokens, seconds), the first slow
    windows = [(range(0, 4), 400, 2.0), (range(4, 8), 400, 0.25), (range(8, 10), 200, 0.125)]
    killed = Run(tmp_path / "killed", curves={
        "throughput/tokens_per_s": [(w[-1], 0.0, n / t) for w, n, t in windows],
        "throughput/step_ms": [(w[-1], 0.0, 1000 * t / len(w)) for w, n, t in windows],
        "val/loss": [(9, 0.0, 1.0)]})
    killed_tokens_per_s = sum(n for _, n, _ in windows) / sum(t for _, _, t in windows)
    assert sum(n / t for _, n, t in windows) / len(windows) > 2 * killed_tokens_per_s  # what the mean would say
    plotted = {}
    savefig = Figure.savefig

    def recording_savefig(fig, name, *args, **kwargs):
        plotted[Path(name).name] = [bar.get_width() for ax in fig.axes for bar in ax.patches]
        return savefig(fig, name, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    runs = [finished, killed]
    rows = {Path(row["run"]).name: row["tokens_per_s"] for row in summarise(runs, "val/loss")}
    plot(runs, "val/loss", tmp_path)
    assert plotted["tokens_per_s.png"] == pytest.approx([rows["r"], rows["killed"]], rel=1e-6)  # the table's figures
    assert rows["r"] == pytest.approx(finished_tokens_per_s, rel=1e-5)
    assert rows["killed"] == pytest.approx(killed_tokens_per_s, rel=1e-6)


def test_a_damaged_run_config_is_one_line_naming_the_run_and_the_other_runs_are_reported(tmp_path, one_run):
    """A .hydra/config.yaml cut short, overwritten with bytes or a list, or not YAML: it was a traceback."""
    text = (one_run / "r" / ".hydra" / "config.yaml").read_text()
    damaged = {
        "cut": (text[: text.index("\nmodel:\n  o") + len("\nmodel:\n  o")].encode(), "model is 'o', not a mapping"),
        "bytes": (bytes(range(128, 256)), "not text (byte 0x80 at offset 0 is not UTF-8)"),
        "list": (b"- a\n- b\n", "holds a list, not a mapping"),
        "unclosed": (text.replace("\nmodel:\n", "\nmodel: [\n", 1).encode(), "not valid YAML (line "),
    }
    for name in ["fine", *damaged]:
        shutil.copytree(one_run / "r", tmp_path / name)
    for name, (content, _) in damaged.items():
        (tmp_path / name / ".hydra" / "config.yaml").write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "lltm_train.report", str(tmp_path)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("lltm-report: warning: ")]
    assert len(warnings) == len(damaged), result.stderr
    for (name, (_, problem)), line in zip(sorted(damaged.items()), warnings):  # the runs in the order of their folders
        assert line.startswith(f"lltm-report: warning: run {name}: .hydra/config.yaml: {problem}"), line
    with open(tmp_path / "report.csv") as f:
        rows = {row["run"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"fine", *damaged} and all(row["status"] == "finished" and row["final"] for row in rows.values())
    assert rows["fine"]["cell"] == "lltm" and rows["fine"]["backend"] == "cpp"
    assert "Damaged: run list: .hydra/config.yaml: holds a list" in (tmp_path / "report.md").read_text()


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
    pairs = {(c, b) for c, spec in CELLS.items() for b in cell_backends(spec) if b in (*backends, "torch")}
    assert sorted(r["run"].split("_", 1)[1] for r in rows) == sorted(f"cell_backend={c}_{b}" for c, b in pairs)
    assert all(r["status"] == "finished" for r in rows)
    assert {(r["cell"], r["backend"]) for r in rows} == {(c, "torch.nn" if b == "torch" else b) for c, b in pairs}


def test_a_long_failure_is_cut_at_a_word_and_a_short_run_has_a_wall_time(tmp_path):
    from lltm_train.report import read_run

    failed = tmp_path / "0_failed"
    (failed / ".hydra").mkdir(parents=True)
    message = "ValueError: " + " ".join(f"word{i}" for i in range(40))
    (failed / "error.txt").write_text(message + "\n\nTraceback ...")
    status = read_run(failed).status
    assert status.startswith("failed: ValueError: word0") and status.endswith("…") and len(status) <= 110
    assert status[:-1].rstrip().split()[-1] in message.split()  # a whole word before the ellipsis
    # a run that logged one point (it stopped at once, as a diverged one does): timed from its logger's start
    short = tmp_path / "1_short"
    result = run(tmp_path, *TINY, "trainer.max_steps=1", f"hydra.run.dir={short}")
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = summarise([read_run(short)], "train/loss")
    assert row["wall_s"] is not None and row["wall_s"] > 0
