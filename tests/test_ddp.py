"""Data-parallel training (DDP), here on the CPU with the gloo backend and 2 processes: the same training as
one process with the same global batch, exact validation metrics over splits that do not divide evenly,
checkpoints that resume on another number of processes, and sweeps whose jobs each run DDP."""

from __future__ import annotations

import signal

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import make_cfg, run
from lltm_train.train import build

# 37 validation samples: 19 and 18 for the two processes, in batches of 8, 8, 3 and 8, 8, 2 (a sampler that
# pads would count one sample twice). No dropout: the two layouts then compute the same thing.
COMMON = ["dataset=adding", "dataset.seq_len=10", "dataset.train_size=400", "dataset.val_size=37", "dataset.test_size=16",
          "model.hidden_size=8", "model.dropout=0", "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0",
          "trainer.accelerator=cpu", "trainer.val_check_interval=6", "callbacks.progress_bar.refresh_rate=0"]
DDP = ["trainer.devices=2", "trainer.strategy=ddp", "dataset.batch_size=8"]  # 2 x 8: a global batch of 16


def scalars(run_dir, tag):
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_ddp_trains_as_one_process_with_the_global_batch_and_validates_every_sample_once(tmp_path):
    single = run(tmp_path, *COMMON, "trainer.max_steps=12", "dataset.batch_size=16", "hydra.run.dir=single")
    assert single.returncode == 0, single.stderr[-3000:]
    # A sweep of two DDP jobs: each job's processes run that job alone, in its folder (no stray outputs/).
    sweep = run(tmp_path, "-m", *COMMON, "trainer.max_steps=12", *DDP, "seed=1234,7", "hydra.sweep.dir=multi")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multi", "single"]
    jobs = sorted(p.name for p in (tmp_path / "multi").iterdir() if p.is_dir())
    assert jobs == ["0_seed=1234", "1_seed=7"]
    ddp = tmp_path / "multi" / "0_seed=1234"
    assert (tmp_path / "multi" / "1_seed=7" / "checkpoints" / "last.ckpt").is_file()

    one, two = scalars(tmp_path / "single", "train/loss"), scalars(ddp, "train/loss")
    assert [s for s, _ in two] == list(range(12))
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(torch.tensor(scalars(ddp, "val/loss")), torch.tensor(scalars(tmp_path / "single", "val/loss")),
                               rtol=1e-4, atol=1e-6)
    # The global rate, and the per-device one beside it.
    for (_, total), (_, each) in zip(scalars(ddp, "throughput/tokens_per_s"), scalars(ddp, "throughput/tokens_per_s_per_device")):
        assert abs(total - 2 * each) <= 1e-3 * total

    # Its final validation equals one process's evaluation of its final checkpoint.
    ckpt = ddp / "checkpoints" / "last.ckpt"
    built = build(make_cfg(tmp_path / "eval", *COMMON, "dataset.batch_size=8"))
    [evaluated] = built.trainer.validate(built.task, datamodule=built.datamodule, ckpt_path=str(ckpt), verbose=False)
    assert abs(evaluated["val/loss"] - scalars(ddp, "val/loss")[-1][1]) <= 1e-6 * evaluated["val/loss"] + 1e-7

    # The DDP checkpoint resumes on one process with the same global batch: on from step 12, after the samples
    # already trained (the run's own settings, trainer.devices=2 among them, apply again unless given: a global
    # batch of 2 x 16 is refused, as other data settings are).
    args = [*COMMON, "trainer.max_steps=18", "dataset.batch_size=16", "hydra.run.dir='0_seed=1234'", "ckpt_path=last"]
    refused = run(tmp_path / "multi", *args)
    assert refused.returncode == 2 and "(global batch (dataset.batch_size x processes)=16 there, 32 here)" in refused.stderr
    resumed = run(tmp_path / "multi", *args, "trainer.devices=1", "trainer.strategy=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "starts again" not in resumed.stderr
    assert torch.load(ckpt, weights_only=False)["global_step"] == 18
    assert [s for s, _ in scalars(ddp, "train/loss")] == list(range(18))


@pytest.mark.slow  # (28 s on 2 cores: the fast suite has the sweep resume without DDP, tests/test_cli.py)
def test_a_resumed_sweep_of_ddp_jobs_starts_the_job_that_never_started(tmp_path):
    """-m ... ckpt_path=last where a job has no checkpoint yet: it starts afresh in both of its processes (the
    second, re-run by Lightning as a single run, once refused "no checkpoint" and took the whole sweep down)."""
    first = run(tmp_path, "-m", *COMMON, "trainer.max_steps=6", "dataset.batch_size=16", "seed=1,2", "hydra.sweep.dir=s")
    assert first.returncode == 0, first.stderr[-3000:]
    import shutil

    shutil.rmtree(tmp_path / "s" / "1_seed=2")  # killed while job 0 ran
    resumed = run(tmp_path, "-m", *COMMON, "trainer.max_steps=12", *DDP, "seed=1,2", "hydra.sweep.dir=s", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in ("0_seed=1", "1_seed=2"):
        assert torch.load(tmp_path / "s" / job / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 12


@pytest.mark.slow
def test_ddp_with_gradient_accumulation_trains_as_one_process_with_the_same_samples_per_step(tmp_path):
    """2 processes x 8 samples x 2 accumulated batches against 1 process x 16 x 2: the same 32 samples a step."""
    accumulate = [*COMMON, "trainer.max_steps=6", "+trainer.accumulate_grad_batches=2"]
    single = run(tmp_path, *accumulate, "dataset.batch_size=16", "hydra.run.dir=single")
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = run(tmp_path, *accumulate, *DDP, "hydra.run.dir=ddp")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one, two = scalars(tmp_path / "single", "train/loss"), scalars(tmp_path / "ddp", "train/loss")
    assert len(two) >= 6
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one), rtol=1e-4, atol=1e-6)


def test_ddp_is_lltm_trains_strategy_with_a_static_graph_unless_gradients_accumulate(tmp_path):
    from lltm_train.strategies import DDPStrategy

    for extra, static in ((["trainer.devices=2"], True), (["trainer.strategy=ddp", "+trainer.accumulate_grad_batches=2"], False)):
        trainer = build(make_cfg(tmp_path, "dataset=adding", *extra)).trainer
        assert isinstance(trainer.strategy, DDPStrategy) and trainer.strategy._ddp_kwargs["static_graph"] is static
    assert not isinstance(build(make_cfg(tmp_path, "dataset=adding")).trainer.strategy, DDPStrategy)


@pytest.mark.slow
def test_a_stateful_ddp_run_checkpoints_every_processs_carried_state_and_resumes_it(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("".join(chr(97 + (i * i + 3 * i) % 26) + ("." if i % 9 == 0 else " ") for i in range(6000)))
    stateful = ["dataset=text", f"dataset.path={text}", "dataset.seq_len=16", "dataset.batch_size=4", "dataset.stateful=true",
                "model.hidden_size=8", "model.embedding_dim=4", "model.sample_length=0", "trainer.accelerator=cpu",
                "trainer.num_sanity_val_steps=0", "trainer.val_check_interval=5", "callbacks.progress_bar.refresh_rate=0",
                "trainer.devices=2", "hydra.run.dir=run"]
    first = run(tmp_path, *stateful, "trainer.max_steps=10")
    assert first.returncode == 0, first.stderr[-3000:]
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["lltm_train"]
    assert saved["carried_world_size"] == 2
    assert all(t.shape[1] == 2 * 4 for t in saved["carried_state"])  # both processes' 4 rows
    assert not torch.equal(*saved["carried_state"][0].chunk(2, 1))  # different streams, different states
    resumed = run(tmp_path, *stateful, "trainer.max_steps=15", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "zero state" not in resumed.stderr
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 15



@pytest.mark.parametrize("signum, rank, status", [pytest.param(signal.SIGTERM, 0, 143, marks=pytest.mark.slow),
                                                  (signal.SIGTERM, 1, 143),
                                                  pytest.param(signal.SIGINT, None, 130, marks=pytest.mark.slow)],
                         ids=["SIGTERM to process 0", "SIGTERM to process 1", "SIGINT to both"])
def test_a_signal_to_any_ddp_process_stops_all_at_one_step_with_one_checkpoint(tmp_path, signum, rank, status):
    """The processes agree at the next logging step (every 4th here), save together there and exit: no
    process is left waiting for the other."""
    rank_override = [f"+callbacks.signal_at.rank={rank}"] if rank is not None else []
    result = run(tmp_path, *COMMON, *DDP, "trainer.max_steps=400", "trainer.val_check_interval=200",
                 "trainer.log_every_n_steps=4", "hydra.run.dir=run", "+callbacks.signal_at._target_=helpers.SignalAt",
                 "+callbacks.signal_at.step=5", f"+callbacks.signal_at.signum={int(signum)}", *rank_override)
    assert result.returncode == status, result.stderr[-3000:]
    assert f"stopped by {signal.Signals(signum).name}" in result.stderr
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8


@pytest.mark.parametrize("settings, message", [
    (["trainer.devices=2", "trainer.strategy=ddp_spawn"], "stale copy"),
    (["trainer.num_nodes=2"], "no cluster environment"),
    (["trainer.devices=2", "dataset.val_size=1"], "val split has 1 sample"),
], ids=["spawn", "nodes without a cluster", "split smaller than the processes"])
def test_multi_process_settings_that_would_hang_or_lose_state_are_refused_before_training(tmp_path, settings, message):
    from lltm_train.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        build(make_cfg(tmp_path, "dataset=adding", "dataset.train_size=64", "dataset.test_size=16", *settings))


def test_ddp_in_a_local_submitit_job_is_refused(tmp_path, monkeypatch):
    from lltm_train.config import ConfigError

    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "1")
    monkeypatch.setenv("SUBMITIT_LOCAL_NTASKS", "1")
    with pytest.raises(ConfigError, match="hydra/launcher=local runs one process a job"):
        build(make_cfg(tmp_path, "dataset=adding", "trainer.devices=2"))
