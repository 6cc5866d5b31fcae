"""The Throughput callback: windows that end on logging steps, tokens without padding, validation excluded."""

from __future__ import annotations

import csv
import math
import time

import lightning as L
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from lltm_train.callbacks import Throughput
from lltm_train.data import Batch, Problem, SequenceDataModule
from lltm_train.tasks import ClassificationTask

BATCH = 3


class VariableLengths(SequenceDataModule):
    """Zero-padded (x, lengths, y) batches of sequences of 1 to 9 steps of 2 features."""

    def __init__(self, n: int = 60) -> None:
        super().__init__(batch_size=BATCH)
        self.n = n
        self.problem = Problem("classification", 2, 3)

    def build(self) -> None:
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(1, 10, (self.n,), generator=g).tolist()
        samples = [(torch.randn(n, 2, generator=g), torch.tensor(i % 3)) for i, n in enumerate(lengths)]
        self.train_set = self.val_set = self.test_set = samples

    def collate(self, samples) -> Batch:
        series, labels = zip(*samples)
        lengths = torch.tensor([len(s) for s in series])
        return Batch(pad_sequence(list(series), batch_first=True), lengths, torch.stack(labels))


class BatchRecorder(L.Callback):
    """What each training batch holds, counted independently of the module: (sequences, real steps, padded steps)."""

    def __init__(self) -> None:
        self.batches = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches.append((batch.x.shape[0], int(batch.lengths.sum()), batch.x.shape[0] * batch.x.shape[1]))


def fit(tmp_path, throughput, max_steps, log_every_n_steps=2, callbacks_extra=(), **kwargs):
    torch.manual_seed(0)
    task = ClassificationTask(2, 3, hidden_size=4, num_layers=1, dropout=0.0, bidirectional=False, cell="lltm", backend="cpp")
    recorder = BatchRecorder()
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="", version="")
    args = {"limit_val_batches": 0, **kwargs}
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, max_steps=max_steps, log_every_n_steps=log_every_n_steps,
                        callbacks=[throughput, recorder, *callbacks_extra], **args)
    trainer.fit(task, datamodule=VariableLengths())
    logger.save()
    rows = [r for r in csv.DictReader(open(tmp_path / "metrics.csv")) if r.get("throughput/tokens_per_s")]
    return trainer, recorder.batches, rows


def window_figures(row):
    return {k: float(row[k]) for k in ("throughput/tokens_per_s", "throughput/tokens_per_s_per_device",
                                       "throughput/samples_per_s", "throughput/step_ms")}


def test_no_average_before_the_first_window():
    assert Throughput().average_tokens_per_s is None
    assert Throughput(5).log_every_n_steps == 5


def test_windows_of_the_trainers_logging_steps(tmp_path):
    throughput = Throughput()
    trainer, batches, rows = fit(tmp_path, throughput, max_steps=6, log_every_n_steps=2)
    assert len(batches) == 6 and trainer.global_step == 6
    real = [tokens for _, tokens, _ in batches]
    assert sum(real) < sum(padded for *_, padded in batches)  # the data do have padding to leave out
    # three windows of two steps each; tokens are the real steps, not the padded ones
    assert throughput.run_tokens == sum(real)
    assert throughput.run_seconds > 0
    average = throughput.average_tokens_per_s
    assert math.isfinite(average) and average > 0
    assert average == pytest.approx(throughput.run_tokens / throughput.run_seconds)
    # one logged row per window, each window's figures consistent with its two batches
    assert len(rows) == 3
    for w, row in enumerate(rows):
        f = window_figures(row)
        window = batches[2 * w : 2 * w + 2]
        seconds = f["throughput/step_ms"] * 2 / 1000
        assert f["throughput/tokens_per_s"] > 0 and math.isfinite(f["throughput/tokens_per_s"])
        assert f["throughput/tokens_per_s_per_device"] == f["throughput/tokens_per_s"]  # one process
        assert f["throughput/tokens_per_s"] * seconds == pytest.approx(sum(t for _, t, _ in window), rel=1e-4)
        assert f["throughput/samples_per_s"] * seconds == pytest.approx(2 * BATCH, rel=1e-4)
    assert "memory/peak_cuda_mib" not in rows[0]  # CPU run
    assert throughput.last_figures == pytest.approx(window_figures(rows[-1]))
    assert "tok/s" in trainer.progress_bar_metrics  # for the progress bar, not the logger
    assert "tok/s" not in rows[0]


class SlowFirstStep(L.Callback):
    """The first step takes 0.3 s more (as a CUDA graph's capture or torch.compile's compilation does)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 0:
            time.sleep(0.3)


def test_the_steady_pace_leaves_the_first_windows_set_up_out(tmp_path):
    throughput = Throughput()
    assert throughput.steady_tokens_per_s is None
    _, batches, rows = fit(tmp_path, throughput, max_steps=6, log_every_n_steps=2, callbacks_extra=[SlowFirstStep()])
    seconds = [float(r["throughput/step_ms"]) * 2 / 1000 for r in rows]
    tokens = [sum(t for _, t, _ in batches[i:i + 2]) for i in (0, 2, 4)]
    assert seconds[0] > 0.3 and len(rows) == 3
    assert throughput.steady_tokens_per_s == pytest.approx((tokens[1] + tokens[2]) / (seconds[1] + seconds[2]), rel=1e-3)
    assert throughput.steady_tokens_per_s > 1.5 * throughput.average_tokens_per_s  # the set-up weighs on the average


def test_an_unfinished_window_is_not_counted(tmp_path):
    throughput = Throughput()
    _, batches, rows = fit(tmp_path, throughput, max_steps=5, log_every_n_steps=2)
    assert len(batches) == 5 and len(rows) == 2
    assert throughput.run_tokens == sum(t for _, t, _ in batches[:4])  # the fifth batch ends no window


def distinct_windows(rows):
    """The figures of each window once, in order (Lightning may write a window's figures again at later steps)."""
    out = []
    for row in rows:
        f = window_figures(row)
        if not out or f != out[-1]:
            out.append(f)
    return out


def test_own_window_length(tmp_path):
    throughput = Throughput(log_every_n_steps=3)
    _, batches, rows = fit(tmp_path, throughput, max_steps=7, log_every_n_steps=1)
    assert len(batches) == 7
    assert throughput.run_tokens == sum(t for _, t, _ in batches[:6])  # windows of batches 0-2 and 3-5
    windows = distinct_windows(rows)
    assert len(windows) == 2
    for w, f in enumerate(windows):
        seconds = f["throughput/step_ms"] * 3 / 1000
        assert f["throughput/tokens_per_s"] * seconds == pytest.approx(sum(t for _, t, _ in batches[3 * w : 3 * w + 3]), rel=1e-4)
        assert f["throughput/samples_per_s"] * seconds == pytest.approx(3 * BATCH, rel=1e-4)


def test_own_window_length_writes_each_window_once(tmp_path):
    _, _, rows = fit(tmp_path, Throughput(log_every_n_steps=3), max_steps=7, log_every_n_steps=1)
    assert [int(r["step"]) for r in rows] == [2, 5]


def test_validation_time_and_the_interrupted_window_are_left_out(tmp_path):
    throughput = Throughput()
    # validation runs after the third batch, in the middle of the second window: that window restarts after it
    _, batches, rows = fit(tmp_path, throughput, max_steps=6, log_every_n_steps=2, limit_val_batches=1,
                           val_check_interval=3, num_sanity_val_steps=0)
    assert len(batches) == 6 and len(rows) == 3
    tokens = [t for _, t, _ in batches]
    assert throughput.run_tokens == tokens[0] + tokens[1] + tokens[3] + tokens[4] + tokens[5]
    f = window_figures(rows[1])  # the second window holds the fourth batch only
    assert f["throughput/tokens_per_s"] * f["throughput/step_ms"] / 1000 == pytest.approx(tokens[3], rel=1e-4)
