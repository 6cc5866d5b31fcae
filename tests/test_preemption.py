"""A run survives being stopped: SIGTERM and SIGINT save the state of the step under way and exit 143 / 130;
a non-finite gradient never reaches the weights or a checkpoint."""

from __future__ import annotations

import os
import signal
import struct
import zipfile

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import CUDA_READY, CUDA_SKIP_REASON
from helpers import ADDING, make_cfg, run
from lltm_train.tasks.base import NonFiniteError
from lltm_train.train import build, train


class SignalDuringValidation(L.Callback):
    """Sends the process a signal during the validation after a given step (at its second batch)."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.global_step == self.step and batch_idx == 1 and trainer.ckpt_path is None and not trainer.sanity_checking:
            os.kill(os.getpid(), self.signum)


class InfGradientAt(L.Callback):
    """Makes one gradient element infinite at a given step, the loss staying finite."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step == self.step:
            next(p for p in pl_module.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")


class InfInputAt(L.Callback):
    """Makes one input element infinite at a given step, so that the step's loss and gradients are not
    finite (the way in for a step that runs as a CUDA graph, which calls no backward hooks)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            batch.x.view(-1)[0] = float("inf")


# The GPU versions of the fault-tolerance tests: the cuda backend, the training step captured as a CUDA graph
GPU = pytest.param(["trainer.accelerator=gpu", "backend=cuda", "model.cuda_graph=true"], id="gpu-graph",
                   marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)])
CPU = pytest.param([], id="cpu")


def on(device: list[str], settings: list[str]) -> list[str]:
    """``settings`` (which name the CPU) moved to the device of a GPU/CPU parameter."""
    return [o for o in settings if not (device and o == "trainer.accelerator=cpu")] + device


def inf_at(device: list[str], step: int) -> list[str]:
    kind = "InfInputAt" if device else "InfGradientAt"
    return [f"+callbacks.inf._target_=test_preemption.{kind}", f"+callbacks.inf.step={step}"]


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_step_under_way_and_exits_non_zero(tmp_path, signum, status):
    common = [*ADDING, "trainer.max_steps=12", "trainer.val_check_interval=10", "hydra.run.dir=run"]
    result = run(tmp_path, *common, "+callbacks.signal_at._target_=helpers.SignalAt", "+callbacks.signal_at.step=6",
                 f"+callbacks.signal_at.signum={int(signum)}")
    assert result.returncode == status, result.stderr[-3000:]
    name = signal.Signals(signum).name
    line = next(line for line in result.stderr.splitlines() if line.startswith("lltm-train: stopped"))
    assert f"stopped by {name}; the state after step 7 is in" in line and "ckpt_path=last" in line
    assert line in (tmp_path / "run" / "train.log").read_text()  # the run's log keeps it too (it was printed only)
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 7
    resumed = run(tmp_path, *common, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 12
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(12))  # no gap, no repeat


@pytest.mark.parametrize("device", [CPU, GPU])
def test_a_non_finite_gradient_is_never_applied_and_stops_with_the_last_good_state(tmp_path, device):
    overrides = [*on(device, ADDING), "trainer.max_steps=10", "trainer.val_check_interval=10", "trainer.log_every_n_steps=5",
                 *inf_at(device, 3)]
    with pytest.raises(NonFiniteError, match=r"1 step\(s\) before step 5 had non-finite gradients .* last good state "
                                             r"\(step 5\) is in .*last.ckpt"):
        train(make_cfg(tmp_path, *overrides))
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 5
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    steps = [s["step"] for s in checkpoint["optimizer_states"][0]["state"].values()]
    assert all(float(s) == 4 for s in steps)  # AdamW took 4 steps of 5: the infinite one was not applied


@pytest.mark.parametrize("device", [CPU, GPU])
def test_skip_goes_on_past_non_finite_gradients_and_counts_them(tmp_path, device):
    overrides = [*on(device, ADDING), "trainer.max_steps=8", "trainer.val_check_interval=8", "model.nonfinite=skip",
                 *inf_at(device, 3)]
    metrics = train(make_cfg(tmp_path, *overrides))
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/skipped_steps")][-1] == (7, 1.0)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


def test_a_non_finite_gradient_after_the_last_logging_step_still_stops_the_run(tmp_path):
    # no logging step at all (log_every_n_steps=25 > max_steps): the check runs before validation instead
    overrides = [*ADDING, "trainer.max_steps=6", "trainer.val_check_interval=6", "trainer.log_every_n_steps=25",
                 "+callbacks.inf._target_=test_preemption.InfGradientAt", "+callbacks.inf.step=3"]
    with pytest.raises(NonFiniteError, match=r"1 step\(s\) before step 6 had non-finite gradients"):
        train(make_cfg(tmp_path, *overrides))


def test_a_diverged_language_model_under_skip_finishes_without_a_sample(tmp_path, capsys):
    metrics = train(make_cfg(tmp_path, "dataset=shakespeare", "dataset.seq_len=16", "dataset.batch_size=4",
                             "model.hidden_size=8", "model.embedding_dim=4", "trainer.max_steps=4",
                             "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "model.optimizer.lr=1e30",
                             "model.nonfinite=skip", "trainer.accelerator=cpu"))
    assert not torch.isfinite(torch.tensor(metrics["val/loss"]))
    assert "no sample at step 4: val/loss is" in capsys.readouterr().out


def test_weights_that_are_not_finite_are_never_saved(tmp_path):
    cfg = make_cfg(tmp_path, *ADDING, "trainer.max_steps=2", "trainer.val_check_interval=2")
    built = build(cfg)
    built.trainer.fit(built.task, datamodule=built.datamodule)
    with torch.no_grad():
        next(built.task.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match="not saving them in a checkpoint"):
        built.trainer.save_checkpoint(tmp_path / "bad.ckpt")
    assert not (tmp_path / "bad.ckpt").exists()


# 640 samples in batches of 16: 40 batches an epoch; checkpoints every 10 steps; dropout draws random numbers.
EXACT = ["dataset=adding", "dataset.seq_len=10", "dataset.train_size=640", "dataset.val_size=16", "dataset.test_size=16",
         "dataset.batch_size=16", "model.hidden_size=8", "model.num_layers=2", "model.dropout=0.25",
         "trainer.log_every_n_steps=1", "trainer.max_steps=60", "trainer.val_check_interval=10",
         "trainer.deterministic=true", "trainer.accelerator=cpu", "hydra.run.dir=run"]


# A language model reading its text as streams, carrying its state from batch to batch (truncated BPTT).
STREAMS = ["dataset=text", "dataset.seq_len=16", "dataset.batch_size=4", "dataset.stateful=true", "model.hidden_size=8",
           "model.embedding_dim=4", "model.num_layers=2", "model.dropout=0.25", "model.sample_length=0",
           *EXACT[EXACT.index("trainer.log_every_n_steps=1"):]]


# The recurrent regularisers' masks (zoneout's factors, weight drop's DropConnect) come from the default generator.
REGULARISED = ["model.cell=lstm", "model.zoneout=[0.5,0.05]", "model.weight_drop=0.3"]


@pytest.mark.parametrize("settings, killed_at, resumed_from",
                         [(EXACT, 23, 20), pytest.param(EXACT, 43, 40, marks=pytest.mark.slow),
                          pytest.param(STREAMS, 23, 20, marks=pytest.mark.slow), pytest.param([*EXACT, "model.cell=gru"], 23, 20, marks=pytest.mark.slow),
                          pytest.param([*EXACT, "model.cell=lstm"], 23, 20, marks=pytest.mark.slow),
                          pytest.param(on(GPU.values[0], EXACT), 23, 20, marks=GPU.marks),
                          pytest.param(on(GPU.values[0], EXACT), 21, 20, marks=GPU.marks),
                          pytest.param([*EXACT, *REGULARISED], 23, 20, marks=pytest.mark.slow),
                          pytest.param(on(GPU.values[0], [*EXACT, *REGULARISED]), 23, 20, marks=GPU.marks)],
                         ids=["mid-epoch", "at an epoch's end", "carried state, mid-epoch", "gru, mid-epoch",
                              "lstm, mid-epoch", "gpu-graph, mid-epoch", "gpu-graph, killed in the warm-up",
                              "lstm with zoneout and weight drop", "gpu-graph, lstm with zoneout and weight drop"])
def test_a_killed_run_resumes_exactly_where_its_checkpoint_was(tmp_path, settings, killed_at, resumed_from):
    """Resumed with ckpt_path=last, a run killed with SIGKILL trains on the batches and draws the dropout masks
    the uninterrupted run did (and carries the state it carried): the same loss at every step and the same
    final weights, bit for bit (CPU, trainer.deterministic=true); TensorBoard has one point a step."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    text = tmp_path / "text.txt"
    text.write_text("".join(chr(97 + (i * i + 3 * i) % 26) + ("." if i % 9 == 0 else " ") for i in range(12000)))
    settings = [*settings, f"dataset.path={text}"] if settings is STREAMS else settings
    whole = run(tmp_path / "a", *settings)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = run(tmp_path / "b", *settings, "+callbacks.kill._target_=helpers.SigkillAt", f"+callbacks.kill.step={killed_at}")
    assert killed.returncode == -signal.SIGKILL
    last = tmp_path / "b" / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == resumed_from
    resumed = run(tmp_path / "b", *settings, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    def losses(directory, tag="train/loss"):
        acc = EventAccumulator(str(directory / "run" / "tensorboard"))
        acc.Reload()  # as TensorBoard shows it: the resumed writer purged what the killed run logged after its checkpoint
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    assert [s for s, _ in losses(tmp_path / "b")] == list(range(60))  # no gap, no repeat
    assert losses(tmp_path / "b") == losses(tmp_path / "a")
    # every validation reads the same batches (the stateful streams' from the first window, whatever the
    # sanity check read before), so the resumed run's curve is the uninterrupted run's
    assert len(losses(tmp_path / "a", "val/loss")) == 6 and losses(tmp_path / "b", "val/loss") == losses(tmp_path / "a", "val/loss")
    weights = [torch.load(d / "run" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for d in (tmp_path / "a", tmp_path / "b")]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_checkpoint_write_cut_short_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    from lltm_train.checkpoint_io import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)
    real_save = torch.save

    def save_half_then_die(obj, f, *args, **kwargs):  # as a kill or a full disk would, part-way through the file
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", save_half_then_die)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 2}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]  # no partial file left behind
    assert torch.load(path, weights_only=True)["global_step"] == 1
    trainer = build(make_cfg(tmp_path / "run", *ADDING)).trainer
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)  # what every run writes with


def test_a_read_only_checkpoint_folder_is_one_error_keeping_the_previous_checkpoint(tmp_path, monkeypatch):
    """A disk remounted read-only (after I/O errors): opening the temporary file and removing it both fail with
    EROFS; the error is the one-line CheckpointWriteError (the cli prints it), not the removal's."""
    import errno
    import pathlib

    from lltm_train import checkpoint_io
    from lltm_train.checkpoint_io import AtomicCheckpointIO, CheckpointWriteError

    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(checkpoint_io, "open", read_only, raising=False)
    monkeypatch.setattr(pathlib.Path, "unlink", read_only)
    with pytest.raises(CheckpointWriteError) as error:
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 2}, path)
    assert error.value.errno == errno.EROFS and "\n" not in str(error.value)
    assert f"cannot write the checkpoint {path}: Read-only file system; the previous last.ckpt is intact" in str(error.value)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["global_step"] == 1


def test_a_damaged_checkpoint_is_refused_by_name_and_last_falls_back_to_the_newest_good_one(tmp_path):
    from lltm_train.config import ConfigError

    common = [*ADDING, "trainer.max_steps=4", "trainer.val_check_interval=2"]
    train(make_cfg(tmp_path, *common))
    last = tmp_path / "checkpoints" / "last.ckpt"
    best = next((tmp_path / "checkpoints").glob("best-*.ckpt"))
    os.utime(best, ns=(last.stat().st_mtime_ns - 10**9,) * 2)  # older than last.ckpt, as a periodic save is
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # cut short
    with pytest.raises(ConfigError, match=r"^ckpt_path: .*last\.ckpt is not a readable checkpoint \(damaged"):
        build(make_cfg(tmp_path, *common, f"ckpt_path={last}"))
    with pytest.warns(UserWarning, match=rf"last\.ckpt is not a readable checkpoint .*; resuming from {best.name} \(step \d+\) instead"):
        ckpt = build(make_cfg(tmp_path, *common, "ckpt_path=last")).ckpt_path
    assert ckpt == str(best)
    # bytes changed inside a tensor's record (the file's structure intact): torch.load took them as weights
    data = bytearray(best.read_bytes())
    with zipfile.ZipFile(best) as archive:
        record = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
    name_length, extra_length = struct.unpack_from("<HH", data, record.header_offset + 26)  # its local header's
    start = record.header_offset + 30 + name_length + extra_length  # the record's first byte
    data[start : start + 16] = bytes(16) if any(data[start : start + 16]) else b"\xff" * 16
    best.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"best-.*\.ckpt is not a readable checkpoint \(damaged: its record .*data/0 "
                                          "fails its CRC-32 check"):
        build(make_cfg(tmp_path, *common, f"ckpt_path={best}"))
    with pytest.raises(ConfigError, match="ckpt_path=last: no readable checkpoint in"):
        build(make_cfg(tmp_path, *common, "ckpt_path=last"))


def test_the_resume_advice_quotes_a_sweep_jobs_folder_for_hydra_and_the_shell(tmp_path):
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lltm_train.callbacks.stop import run_dir_override

    for run_dir in (tmp_path / "outputs" / "adding" / "2026-11-30_10-00-00", tmp_path / "multirun" / "x" / "0_backend=cpp,lr=1e-3"):
        [arg] = shlex.split(run_dir_override(run_dir))  # what the shell hands the command
        [override] = OverridesParser.create().parse_overrides([arg])
        assert override.key_or_group == "hydra.run.dir" and override.value() == str(run_dir)


# The settings of issue 20: validations every 10 steps, a loss logged at every step.
DURING_VALIDATION = ["dataset=adding", "dataset.seq_len=20", "model.hidden_size=16", "model.scheduler=null",
                     "trainer.deterministic=true", "trainer.log_every_n_steps=1", "trainer.val_check_interval=10",
                     "trainer.num_sanity_val_steps=0", "trainer.max_steps=60", "trainer.accelerator=cpu",
                     "callbacks.progress_bar.refresh_rate=0", "hydra.run.dir=run"]


def _scalars(run_dir, tag):
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.parametrize("signum, status", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])  # SIGINT takes the same path as SIGTERM (slow: 25 s each on 2 cores)
def test_a_signal_during_a_validation_finishes_it_and_resumes_exactly(tmp_path, signum, status):
    """The validation under way finishes and is logged; the state after it is saved (step 20), and the
    resumed run logs every step once, validates where the uninterrupted run does, and ends with its weights."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole = run(tmp_path / "a", *DURING_VALIDATION)
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = run(tmp_path / "b", *DURING_VALIDATION, "+callbacks.sig._target_=test_preemption.SignalDuringValidation",
                  "+callbacks.sig.step=20", f"+callbacks.sig.signum={int(signum)}")
    assert stopped.returncode == status, stopped.stderr[-3000:]
    assert f"stopped by {signal.Signals(signum).name}; the state after step 20 is in" in stopped.stderr
    assert [s for s, _ in _scalars(tmp_path / "b" / "run", "val/loss")] == [9, 19]  # the interrupted one finished
    resumed = run(tmp_path / "b", *DURING_VALIDATION, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    assert [s for s, _ in _scalars(b, "train/loss")] == list(range(60))  # no gap, no repeat
    assert _scalars(b, "train/loss") == _scalars(a, "train/loss")
    assert _scalars(b, "val/loss") == _scalars(a, "val/loss")
    weights = [torch.load(d / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for d in (a, b)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


class SignalIn(L.Callback):
    """Sends the process a signal at the second batch of a phase outside fit's training steps: the sanity check
    ("sanity"), the validation after the last step ("final": in fit, or trainer.validate after it) or the test
    ("test"); in a fresh run only (a resume runs with the run's own callbacks)."""

    def __init__(self, phase: str, signum: int) -> None:
        self.phase, self.signum, self.fresh = phase, signum, True

    def on_fit_start(self, trainer, pl_module):
        self.fresh = trainer.ckpt_path is None

    def _at(self, phase, batch_idx):
        if phase == self.phase and batch_idx == 1 and self.fresh:
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        last = trainer.global_step == trainer.max_steps
        self._at("sanity" if trainer.sanity_checking else "final" if last else "during fit", batch_idx)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._at("test", batch_idx)


# 15 steps: validations after steps 10 and 15 (the last step, between validations); a sanity check; a test.
AFTER_FIT = [*[o for o in DURING_VALIDATION if not o.startswith(("trainer.max_steps", "trainer.num_sanity"))],
             "trainer.max_steps=15", "trainer.num_sanity_val_steps=2", "test=true"]


@pytest.fixture(scope="module")
def after_fit_whole(tmp_path_factory):
    """The uninterrupted run of AFTER_FIT (its folder)."""
    where = tmp_path_factory.mktemp("whole")
    result = run(where, *AFTER_FIT)
    assert result.returncode == 0, result.stderr[-3000:]
    return where / "run"


@pytest.mark.parametrize("phase", ["final", "test", pytest.param("sanity", marks=pytest.mark.slow)])
def test_a_signal_outside_the_training_steps_stops_the_run_and_the_resume_completes_it(tmp_path, after_fit_whole, phase):
    """SIGTERM during the validation after the last step, the test or the sanity check: the phase under way
    finishes (a validation's or test's figures are logged), the run stops with the line and status 143 (before
    the test, if that is still to come), and the resume completes the run: the same figures and weights as
    the uninterrupted run."""
    stopped = run(tmp_path, *AFTER_FIT, "+callbacks.sig._target_=test_preemption.SignalIn", f"+callbacks.sig.phase={phase}",
                  f"+callbacks.sig.signum={int(signal.SIGTERM)}")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    step = 1 if phase == "sanity" else 15  # after the sanity check, the first step runs, and the stop follows it
    assert f"stopped by SIGTERM; the state after step {step} is in" in stopped.stderr, stopped.stderr[-3000:]
    a, b = after_fit_whole, tmp_path / "run"
    if phase == "final":  # the validation finished and was logged; the test was left to the resume
        assert _scalars(b, "val/loss") == _scalars(a, "val/loss")
        assert "test/loss" not in EventAccumulator(str(b / "tensorboard")).Reload().Tags()["scalars"]
    resumed = run(tmp_path, *AFTER_FIT, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for tag in ("train/loss", "val/loss", "test/loss"):
        assert [v for _, v in _scalars(b, tag)] == [v for _, v in _scalars(a, tag)], tag
    weights = [torch.load(d / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for d in (a, b)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_signal_under_gradient_accumulation_saves_at_a_step_boundary_and_resumes_exactly(tmp_path):
    """With two batches a step, SIGTERM at a step's first batch lets the step finish (its second batch and
    the optimiser step) before saving: the resumed run has the uninterrupted run's losses and weights."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    settings = [*[o for o in DURING_VALIDATION if not o.startswith("trainer.max_steps")], "trainer.max_steps=20",
                "+trainer.accumulate_grad_batches=2"]
    whole = run(tmp_path / "a", *settings)
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = run(tmp_path / "b", *settings, "+callbacks.signal_at._target_=helpers.SignalAt", "+callbacks.signal_at.step=6",
                  f"+callbacks.signal_at.signum={int(signal.SIGTERM)}")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "stopped by SIGTERM; the state after step 7 is in" in stopped.stderr, stopped.stderr[-3000:]
    resumed = run(tmp_path / "b", *settings, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    assert _scalars(b, "train/loss") == _scalars(a, "train/loss")
    assert _scalars(b, "val/loss") == _scalars(a, "val/loss")
    weights = [torch.load(d / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for d in (a, b)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_finished_run_extended_with_more_steps_equals_the_longer_run(tmp_path):
    """A run ended by max_steps part way through an epoch, resumed with a larger max_steps: the same losses,
    validations and final weights as one run of the larger max_steps (the end-of-run checkpoint is a
    checkpoint of a step, not of a finished epoch)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    settings = [o for o in DURING_VALIDATION if not o.startswith("trainer.max_steps")]
    assert run(tmp_path / "a", *settings, "trainer.max_steps=45").returncode == 0
    assert run(tmp_path / "b", *settings, "trainer.max_steps=25").returncode == 0
    last = tmp_path / "b" / "run" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    # A resume with nothing left to do (twice): it says so and leaves the checkpoint and the curves alone.
    for _ in range(2):
        again = run(tmp_path / "b", *settings, "trainer.max_steps=25", "ckpt_path=last")
        assert again.returncode == 0 and "nothing left to train at step 25" in again.stderr, again.stderr[-3000:]
    assert last.read_bytes() == before
    extended = run(tmp_path / "b", *settings, "trainer.max_steps=45", "ckpt_path=last")
    assert extended.returncode == 0, extended.stderr[-3000:]
    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    assert [s for s, _ in _scalars(b, "train/loss")] == list(range(45))
    assert _scalars(b, "train/loss") == _scalars(a, "train/loss")
    # and b's final validation after its step 25 (logged at 24, as the one after step 10 is at 9), which a has not
    assert [s for s, _ in _scalars(b, "val/loss")] == [9, 19, 24, 29, 39, 44]
    assert [p for p in _scalars(b, "val/loss") if p[0] != 24] == _scalars(a, "val/loss")
    weights = [torch.load(d / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for d in (a, b)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_last_is_the_furthest_checkpoint_by_step_not_the_newest_file(tmp_path):
    """A best-step*.ckpt written after last.ckpt (a copy, a touch) but behind it: ckpt_path=last resumes the
    furthest step; with equal steps, the newest file."""
    from lltm_train.checkpoints import resolve_checkpoint

    directory = tmp_path / "checkpoints"
    directory.mkdir()
    torch.save({"state_dict": {}, "global_step": 25}, directory / "last.ckpt")
    torch.save({"state_dict": {}, "global_step": 20}, directory / "best-step20.ckpt")
    os.utime(directory / "last.ckpt", ns=(10**18,) * 2)
    os.utime(directory / "best-step20.ckpt", ns=(2 * 10**18,) * 2)  # newer on disk
    assert resolve_checkpoint("last", directory) == str(directory / "last.ckpt")
    torch.save({"state_dict": {}, "global_step": 25}, directory / "best-step25.ckpt")  # the newest of equal steps
    assert resolve_checkpoint("last", directory) == str(directory / "best-step25.ckpt")


def test_a_resume_from_another_runs_checkpoint_never_tests_that_runs_best(tmp_path, caplog):
    """test=true after a resume that never validated: the best checkpoint Lightning remembers is the other
    run's; the final weights of this run are tested instead, and one line says why."""
    first = [*ADDING, "trainer.max_steps=4", "trainer.val_check_interval=2"]
    train(make_cfg(tmp_path / "a", *first))
    other = tmp_path / "a" / "checkpoints" / "last.ckpt"
    with caplog.at_level("WARNING", logger="lltm_train"):
        metrics = train(make_cfg(tmp_path / "b", *ADDING, "trainer.max_steps=5", "trainer.val_check_interval=100",
                                 "trainer.limit_val_batches=0", f"ckpt_path={other}", "test=true"))
    assert "test/loss" in metrics
    assert "is not this run's" in caplog.text and "testing the final weights" in caplog.text


class FullDiskAt(L.Callback):
    """From a given step on, every checkpoint write fails part-way, as on a full disk."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            def no_space(obj, f, *args, **kwargs):
                f.write(b"PK\x03\x04 half")
                raise OSError(28, "No space left on device")
            torch.save = no_space


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path):
    overrides = [*ADDING, "trainer.max_steps=10", "trainer.val_check_interval=3", "hydra.run.dir=run"]
    result = run(tmp_path, *overrides, "+callbacks.full._target_=test_preemption.FullDiskAt", "+callbacks.full.step=4")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("lltm-train: error")]
    assert len(errors) == 1 and "No space left on device; the previous" in errors[0] and ".ckpt is intact" in errors[0]
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3
