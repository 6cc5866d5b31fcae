"""What a run shows on the console: a progress bar that counts the run (steps against max_steps, or seconds
against max_time, resumed runs from their checkpoint), messages on their own lines, no upstream tips or
deprecation noise, the CSV logger's file named, and OpenMP's spin default set before torch loads."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Timer
from tqdm import tqdm

from lltm_train.callbacks import RunProgressBar
from lltm_train.console import ConsoleHandler
from lltm_train.data import Batch, Problem, SequenceDataModule
from lltm_train.tasks import ClassificationTask


class Fixed(SequenceDataModule):
    """12 sequences of 5 steps of 2 features, batches of 3: 4 batches an epoch."""

    def __init__(self) -> None:
        super().__init__(batch_size=3)
        self.problem = Problem("classification", 2, 3)

    def build(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.train_set = self.val_set = self.test_set = [(torch.randn(5, 2, generator=g), torch.tensor(i % 3))
                                                         for i in range(12)]

    def collate(self, samples) -> Batch:
        x, y = zip(*samples)
        return Batch(torch.stack(x), torch.full((len(x),), 5), torch.stack(y))


class BarRecorder(L.Callback):
    """The training bar's position after each batch (the bar draws first: it is earlier in the list)."""

    def __init__(self, bar: RunProgressBar) -> None:
        self.bar, self.seen = bar, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen.append(self.bar.train_progress_bar.n)


def fit(tmp_path, ckpt_path=None, callbacks=(), **kwargs):
    torch.manual_seed(0)
    bar = RunProgressBar(refresh_rate=1)
    recorder = BarRecorder(bar)
    task = ClassificationTask(2, 3, hidden_size=4, num_layers=1, dropout=0.0, bidirectional=False, cell="lltm",
                              backend="cpp")
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, limit_val_batches=0,
                        enable_model_summary=False, callbacks=[bar, recorder, *callbacks], default_root_dir=tmp_path,
                        **kwargs)
    trainer.fit(task, datamodule=Fixed(), ckpt_path=ckpt_path)
    return trainer, bar.train_progress_bar, recorder.seen


def test_the_bar_counts_the_runs_steps_across_epochs(tmp_path):
    trainer, bar, seen = fit(tmp_path, max_steps=10)  # epochs of 4 steps: 2.5 of them
    assert trainer.global_step == 10
    assert (bar.total, bar.unit, bar.desc) == (10, "step", "epoch 2: ")
    assert seen == list(range(1, 11))  # no reset at the epochs' ends (4, 8)


def test_under_gradient_accumulation_the_bar_counts_optimiser_steps(tmp_path):
    trainer, bar, seen = fit(tmp_path, max_epochs=3, accumulate_grad_batches=2)  # 2 steps an epoch
    assert (trainer.global_step, bar.total) == (6, 6)
    assert seen == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]  # a step after every second batch


def test_a_resumed_run_starts_the_bar_at_its_checkpoints_step(tmp_path):
    first, _, _ = fit(tmp_path, max_steps=4)
    first.save_checkpoint(tmp_path / "step4.ckpt")
    trainer, bar, seen = fit(tmp_path, ckpt_path=tmp_path / "step4.ckpt", max_steps=9)
    assert (bar.initial, bar.total, seen) == (4, 9, [5, 6, 7, 8, 9])  # tqdm's pace counts this run's steps only


def test_with_a_time_budget_the_bar_counts_seconds_and_shows_the_step(tmp_path):
    trainer, bar, seen = fit(tmp_path, max_time={"seconds": 2}, max_epochs=10_000)
    assert bar.unit == "s" and abs(bar.total - 2.0) < 0.1
    assert 1.9 <= seen[-1] <= 2.5 and seen == sorted(seen)
    assert bar.postfix.startswith(f"step={trainer.global_step}")
    assert re.search(r"\d+/2 s \[0 s left, step=\d+", str(bar))
    assert any(isinstance(c, Timer) for c in trainer.callbacks)


class LogsThroughput(L.Callback):
    """Logs a throughput of 46,549.4 tokens/s on the bar, then 123,456.7 (as the Throughput callback would)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        pl_module.log("tok/s", 46549.4 if trainer.global_step < 3 else 123456.7, prog_bar=True, logger=False)


def test_the_bars_tokens_per_second_keep_one_format(tmp_path):
    # tqdm writes a float in whichever of "%.3g" and str() is shorter: the field jumped between 4.65e+4 and 46549.35
    shown = []

    class Recorder(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            shown.append(bar.get_metrics(trainer, pl_module)["tok/s"])

    bar = RunProgressBar(refresh_rate=1)
    task = ClassificationTask(2, 3, hidden_size=4, num_layers=1, dropout=0.0, bidirectional=False, cell="lltm",
                              backend="cpp")
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, limit_val_batches=0,
                        enable_model_summary=False, callbacks=[bar, LogsThroughput(), Recorder()],
                        default_root_dir=tmp_path, max_steps=5)
    trainer.fit(task, datamodule=Fixed())
    assert shown == ["46,549"] * 2 + ["123,457"] * 3  # steps 1 and 2, then 3 to 5
    assert "tok/s=123,457" in bar.train_progress_bar.postfix


def test_a_logged_line_gets_its_own_line_beside_a_bar_and_tips_are_dropped():
    stream = io.StringIO()
    log = logging.getLogger("test_console")
    log.propagate, handler = False, ConsoleHandler(stream)
    log.addHandler(handler)
    try:
        with tqdm(total=10, file=stream, bar_format="{n}/{total} BAR", mininterval=0) as bar:
            bar.update(3)
            log.warning("a message")
            log.warning("💡 Tip: try our cloud")
            bar.update(1)
    finally:
        log.removeHandler(handler)
    lines = re.split(r"[\r\n]", stream.getvalue())
    assert "a message" in lines  # the bar's line was cleared first, not written after
    assert not any("Tip" in line for line in lines)
    assert any(line.strip() == "4/10 BAR" for line in lines)  # the bar redrawn after the message


def test_openmps_spin_default_is_set_before_torch_loads_and_a_users_setting_wins():
    probe = ("import sys, os\n"
             "class Probe:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name == 'torch': print('at torch:', os.environ.get('GOMP_SPINCOUNT'))\n"
             "sys.meta_path.insert(0, Probe())\n"
             "import lltm_train\n")
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "at torch: 30000"
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "GOMP_SPINCOUNT": "7"}, capture_output=True,
                         text=True, check=True).stdout
    assert out.splitlines()[0] == "at torch: 7"


def test_the_command_names_the_csv_file_and_prints_no_upstream_noise(tmp_path):
    args = ["dataset=adding", "dataset.seq_len=10", "dataset.train_size=48", "dataset.val_size=16",
            "dataset.batch_size=8", "model.hidden_size=8", "trainer.max_steps=9", "trainer.val_check_interval=4",
            "trainer.accelerator=cpu", "callbacks.progress_bar.refresh_rate=1", "logger=csv", "hydra.run.dir=run"]
    done = subprocess.run([sys.executable, "-m", "lltm_train", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    csv_file = tmp_path / "run" / "csv" / "metrics.csv"
    assert csv_file.is_file()
    lines = re.split(r"[\r\n]", done.stdout + done.stderr)
    assert any(line.startswith("lltm-train: ") and line.endswith(f"; metrics in {csv_file}") for line in lines)
    assert f"  CSV metrics: {csv_file}" in lines
    assert "`Trainer.fit` stopped: `max_steps=9` reached." in lines  # its own line, not after the bar's
    assert any(re.match(r"epoch 1: 100%.*\| 9/9 \[", line) for line in lines)  # 6 batches an epoch: the run's count
    noise = [line for line in lines if "Tip:" in line or "LeafSpec" in line or "deprecated" in line]
    assert not noise


@pytest.mark.parametrize("entry", ["lltm_train.bench:main", "lltm_train.export:main", "lltm_train.report:main",
                                   "lltm_train.commands:generate_main", "lltm_train.commands:evaluate_main"])
def test_the_tools_help_is_plain_text_and_names_every_argument(entry, capsys):
    """``--help`` of each console script (pyproject.toml): the docstring without reStructuredText's markup, and a
    line of help for the checkpoint argument where there is one."""
    import importlib

    module, name = entry.split(":")
    with pytest.raises(SystemExit) as done:
        getattr(importlib.import_module(module), name)(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert "``" not in shown and ":func:" not in shown and ":class:" not in shown, shown
    if "checkpoint" in shown.split("options:")[0]:
        assert re.search(r"\n  checkpoint\s+\S", shown), shown  # a help text beside it


def test_lltm_trains_own_warnings_read_as_one_line_without_the_calls_file_and_source():
    """Routed through logging (as every run does), a warning from lltm_train's code reads "lltm-train: warning: ...";
    before, it read ".../lltm_train/train.py:205: UserWarning: ..." and the source line of the call."""
    import warnings

    from lltm_train import checkpoints
    from lltm_train.console import route_warnings

    route_warnings()
    try:
        ours = warnings.formatwarning("a damaged file", UserWarning, checkpoints.__file__, 70, "warnings.warn(...)")
        theirs = warnings.formatwarning("an upstream one", UserWarning, torch.__file__, 12, "warnings.warn(...)")
    finally:
        logging.captureWarnings(False)
    assert ours == "lltm-train: warning: a damaged file\n"
    assert theirs.startswith(f"{torch.__file__}:12: UserWarning: an upstream one")
