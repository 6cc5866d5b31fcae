"""Fair comparisons: a time budget (trainer.max_time) that the learning-rate schedule spans,
experiment=compare_cells and lltm-report's ranking at equal seconds (CPU)."""

from __future__ import annotations

import csv
import logging
import time

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import make_cfg, run
from lltm_train.config import ConfigError, max_time_seconds
from lltm_train.report import Run, at_seconds_notes, main as report_main, pareto_front, read_run, summarise
from lltm_train.tasks.schedule import warmup_cosine
from lltm_train.train import train

SMALL = ["dataset.seq_len=16", "dataset.batch_size=4", "model.sample_length=0", "trainer.limit_val_batches=1"]


def scalars(directory, tag):
    acc = EventAccumulator(str(directory / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


class SlowFirstStep(L.Callback):
    """The first step takes a second more, as a GPU's first step does (CUDA graph capture, compilation)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 0:
            time.sleep(1.0)


@pytest.mark.parametrize("slow_first_step", [False, True], ids=["steady", "slow first step"])
def test_a_time_budget_ends_the_run_on_time_with_its_schedule_finished(tmp_path, caplog, slow_first_step):
    """trainer.max_time in seconds with no step limit: the run stops after that many seconds of training; its
    learning rate warmed up, peaked and decayed to (nearly) its end as the time ran out; time/train_seconds
    is logged at each validation; no line about an unfinished schedule. A slow first step (set-up) does not
    set the pace: on the H200 it once made the schedule reach its peak at the first step."""
    slow = ["+callbacks.slow._target_=test_budget.SlowFirstStep"] if slow_first_step else []
    # The learning rate is logged at every step, from the first: on a loaded machine (the GPU host's 14 test
    # workers) a 4 s run may take only a few dozen steps, and a warm-up of 5% of them is over by step 5.
    # A warm-up of 3 steps (a time budget's default, 50, is as long as this whole run).
    cfg = make_cfg(tmp_path, *SMALL, "trainer.max_time=4", "trainer.max_steps=-1", "trainer.val_check_interval=20",
                   "trainer.log_every_n_steps=1", "model.scheduler.warmup_steps=3", *slow)
    with caplog.at_level(logging.WARNING, logger="lltm_train"):
        train(cfg)
    lrs = [v for _, v in scalars(tmp_path, "lr-AdamW")]
    assert len(lrs) >= 10, f"only {len(lrs)} steps in 4 s: too few to see the schedule's shape"
    peak = max(lrs)
    assert lrs[0] < 0.5 * peak and lrs[-1] < 0.05 * peak and lrs.index(peak) < 0.5 * len(lrs)
    seconds = [v for _, v in scalars(tmp_path, "time/train_seconds")]
    assert seconds == sorted(seconds) and 4 <= seconds[-1] < 6
    assert not any("schedule" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("slow_first_step", [False, True], ids=["steady", "slow first step"])
def test_a_time_budget_warms_up_by_steps_whatever_the_first_steps_timing(tmp_path, slow_first_step):
    """With trainer.max_time the steps the budget allows are known only from the pace of the first steps: the
    warm-up is a number of steps (the config's default for a time budget), so the first steps' learning rates
    are the same whatever their timing (a fraction of the provisional estimate once went 0, 0, peak)."""
    slow = ["+callbacks.slow._target_=test_budget.SlowFirstStep"] if slow_first_step else []
    cfg = make_cfg(tmp_path, *SMALL, "trainer.max_time=3", "trainer.max_steps=-1", "trainer.val_check_interval=20",
                   "trainer.log_every_n_steps=1", *slow)
    warmup = OmegaConf.to_container(cfg, resolve=True)["model"]["scheduler"].get("warmup_steps")
    assert isinstance(warmup, int) and warmup > 1
    train(cfg)
    lrs = [v for _, v in scalars(tmp_path, "lr-AdamW")]
    first = min(len(lrs), warmup)
    assert first >= 3
    assert lrs[:first] == pytest.approx([cfg.model.optimizer.lr * (s + 1) / warmup for s in range(first)], rel=1e-6)


def test_a_resumed_time_budget_goes_on_at_the_pace_it_had(tmp_path):
    """A time budget's run resumed with a larger budget: its first step trains at the learning rate of the
    schedule that the checkpoint's pace gives (the steps the time left allows), not at a provisional
    schedule's until it has measured its own pace."""
    common = [*SMALL, "trainer.max_steps=-1", "trainer.val_check_interval=20", "trainer.log_every_n_steps=1",
              "trainer.num_sanity_val_steps=0", "model.scheduler.warmup_steps=2"]
    train(make_cfg(tmp_path, *common, "trainer.max_time=3"))
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    step, (paced_steps, paced_seconds) = saved["global_step"], saved["lltm_train"]["pace"]
    # the first step (its set-up) left out
    assert step >= 5 and paced_steps == step - 1 and 0 < paced_seconds < saved["lltm_train"]["train_seconds"]
    cfg = make_cfg(tmp_path, *common, "trainer.max_time=6", "ckpt_path=last")
    train(cfg)
    total = step + (6 - saved["lltm_train"]["train_seconds"]) * paced_steps / paced_seconds
    schedule = warmup_cosine(torch.optim.SGD([torch.zeros(1)], lr=1.0), total_steps=lambda: total, warmup_steps=2)
    peak, logged = cfg.model.optimizer.lr, dict(scalars(tmp_path, "lr-AdamW"))
    assert logged[step] == pytest.approx(peak * schedule.lr_lambdas[0](step), abs=0.05 * peak)
    assert logged[step] > 0.2 * peak


class StopAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def test_a_run_stopped_before_its_schedule_ends_says_so_in_one_line(tmp_path, caplog):
    cfg = make_cfg(tmp_path, *SMALL, "trainer.max_steps=100", "trainer.val_check_interval=10",
                   "+callbacks.stop._target_=test_budget.StopAt", "+callbacks.stop.step=10")
    with caplog.at_level(logging.WARNING, logger="lltm_train"):
        train(cfg)
    lines = [r.getMessage() for r in caplog.records if "schedule" in r.getMessage()]
    assert lines == ["lltm-train: training stopped at step 10, 10% of the 100 steps its learning-rate schedule spans: "
                     "the learning rate had not decayed to its end"]


def test_a_run_with_no_end_says_so(tmp_path, caplog):
    """No max_steps, max_epochs or max_time: one warning line (the run trains until it is stopped; here by a
    callback after 3 steps). A time budget alone is an end: no line."""
    stop = ["+callbacks.stop._target_=test_budget.StopAt", "+callbacks.stop.step=3", "trainer.max_steps=-1"]
    with caplog.at_level(logging.WARNING, logger="lltm_train"):
        train(make_cfg(tmp_path / "a", *SMALL, *stop, "trainer.max_epochs=-1"))
    assert [r.getMessage() for r in caplog.records if "no trainer.max_steps" in r.getMessage()] == [
        "lltm-train: warning: no trainer.max_steps, trainer.max_epochs or trainer.max_time: this run trains until it "
        "is stopped (Ctrl-C or SIGTERM saves a checkpoint), at its peak learning rate"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lltm_train"):
        train(make_cfg(tmp_path / "b", *SMALL, *stop, "trainer.max_epochs=-1", "trainer.max_time=60"))
    assert not any("no trainer.max_steps" in r.getMessage() for r in caplog.records)


def test_a_resumed_time_budget_counts_the_seconds_already_trained(tmp_path):
    """A run of 3 s resumed with a budget of 5 s trains about 2 s more: its clock goes on from 3 s."""
    common = [*SMALL, "trainer.max_steps=-1", "trainer.val_check_interval=20", "hydra.run.dir=run"]
    first = run(tmp_path, "trainer.accelerator=cpu", *common, "trainer.max_time=3")
    assert first.returncode == 0, first.stderr[-2000:]
    steps_first = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    resumed = run(tmp_path, "trainer.accelerator=cpu", *common, "trainer.max_time=5", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    seconds = scalars(tmp_path / "run", "time/train_seconds")
    after = [v for s, v in seconds if s >= steps_first]
    assert after and min(after) >= 3 and 5 <= max(after) < 7.5


    spent = run(tmp_path, "trainer.accelerator=cpu", *common, "trainer.max_time=2", "ckpt_path=last")
    assert spent.returncode == 0, spent.stderr[-2000:]
    assert "the time budget (trainer.max_time) was spent before this run started" in spent.stderr
    assert "learning-rate schedule spans" not in spent.stderr.split("was spent")[1]  # no line about the schedule


def test_a_run_that_stops_on_time_before_its_max_steps_is_finished_with_its_last_figure_timed(tmp_path):
    """max_time ends the run between validations, before max_steps: lltm-report counts it finished (ranked)
    and the final validation's figure has its time, the budget's, on lltm-report's time axis."""
    result = run(tmp_path, "trainer.accelerator=cpu", *SMALL, "trainer.max_steps=100000", "trainer.max_time=3",
                 "trainer.val_check_interval=100000", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-2000:]
    report = read_run(tmp_path / "run")
    assert report.status == "finished"
    (last_val, *_), seconds = report.curves["val/loss"][-1], dict((s, v) for s, v in scalars(tmp_path / "run",
                                                                                            "time/train_seconds"))
    assert last_val in seconds and 3 <= seconds[last_val] < 4.5  # the clock stopped when training did
    assert summarise([report], "val/loss", at_seconds=100)[0]["at_seconds"] == report.curves["val/loss"][-1][2]


@pytest.mark.parametrize("value, message", [
    ("0", "trainer.max_time must be a positive"), ("0:0:0:0", "must be a positive"), ("inf", "must be a positive"),
    ("soon", "trainer.max_time: expected seconds"), ("true", "expected seconds"), ("[1,2]", "expected seconds"),
    ("{weeks: 1}", "expected seconds")])
def test_a_bad_time_budget_is_one_line(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        train(make_cfg(tmp_path, *SMALL, f"trainer.max_time={value}"))


@pytest.mark.parametrize("value, seconds", [("90", 90), ("2.5", 2.5), ("'00:01:00:05'", 3605), ("{minutes: 1.5}", 90),
                                            ("{hours: 1, seconds: 2}", 3602)])
def test_every_form_of_time_budget_is_understood(tmp_path, value, seconds):
    cfg = make_cfg(tmp_path, f"trainer.max_time={value}")
    assert max_time_seconds(cfg.trainer.max_time) == seconds


def _run(seconds_values: list[tuple[float, float]]) -> Run:
    r = Run(path=__import__("pathlib").Path(f"r{len(seconds_values)}_{seconds_values[0][1]}"))
    r.curves = {"time/train_seconds": [(i, float("nan"), t) for i, (t, _) in enumerate(seconds_values)],
                "val/bpc": [(i, float("nan"), v) for i, (_, v) in enumerate(seconds_values)]}
    return r


def test_ranking_at_equal_seconds_and_the_pareto_front():
    """A fast run that is better at 10 s, a slow one better at the end: --at-seconds ranks by the value each
    had by then; the Pareto front keeps the points no other point beats in both time and quality."""
    fast = _run([(5, 3.0), (10, 2.5), (20, 2.4)])
    slow = _run([(8, 3.2), (16, 2.6), (30, 2.1)])
    assert [row["run"] for row in summarise([fast, slow], "val/bpc")] == [str(slow.path), str(fast.path)]
    at10 = summarise([fast, slow], "val/bpc", at_seconds=10)
    assert [(row["run"], row["at_seconds"]) for row in at10] == [(str(fast.path), 2.5), (str(slow.path), 3.2)]
    assert slow.at_seconds("val/bpc", 7) is None
    points = [p for r in (fast, slow) for p in r.timed("val/bpc")]
    assert pareto_front(points, higher_better=False) == [(5, 3.0), (10, 2.5), (20, 2.4), (30, 2.1)]
    assert pareto_front([(1, 0.5), (2, 0.4), (3, 0.9)], higher_better=True) == [(1, 0.5), (3, 0.9)]


def test_a_ranking_at_seconds_says_which_runs_it_cannot_judge_there():
    fast = _run([(5, 3.0), (10, 2.5), (20, 2.4)])
    slow = _run([(8, 3.2), (16, 2.6), (30, 2.1)])
    early = at_seconds_notes([fast, slow], summarise([fast, slow], "val/bpc", at_seconds=1), "val/bpc", 1)
    assert early == "No run had logged val/bpc by 1 s of training (the earliest did at 5 s).\n\n"
    late = at_seconds_notes([fast, slow], summarise([fast, slow], "val/bpc", at_seconds=25), "val/bpc", 25)
    assert late == f"Trained for less than 25 s, ranked by their final val/bpc: {fast.path.name}.\n\n"


def test_compare_cells_gives_every_contender_the_same_seconds_and_ranks_them(tmp_path):
    result = run(tmp_path, "experiment=compare_cells", "cell_backend=lltm_cpp,lstm_torch", "model.hidden_size=8,16",
                 "trainer.max_time=2", "trainer.val_check_interval=10", "dataset.batch_size=4", "dataset.seq_len=16",
                 "model.embedding_dim=4", "trainer.limit_val_batches=1", "callbacks.progress_bar.refresh_rate=0",
                 "hydra.sweep.dir=cells")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "cells" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and all(r["status"] == "finished" for r in rows)
    assert {(r["cell"], r["backend"]) for r in rows} == {("lltm", "cpp"), ("lstm", "torch.nn")}
    assert all(2 <= float(r["wall_s"]) < 4 for r in rows)  # seconds of training at the last validation
    assert (tmp_path / "cells" / "metric_vs_time.png").is_file()
