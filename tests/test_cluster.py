"""Cluster sweeps through Hydra's submitit launcher (conf/hydra/launcher), and SLURM requeues."""

from __future__ import annotations

import torch

from test_preemption import ADDING, run

TINY = [*ADDING, "dataset.train_size=64", "trainer.val_check_interval=2", "callbacks.progress_bar.refresh_rate=0"]


def test_a_sweep_runs_its_jobs_through_submitit(tmp_path):
    """hydra/launcher=local: the jobs run as submitit's processes, each in its folder named by its settings."""
    result = run(tmp_path, "-m", "hydra/launcher=local", *TINY, "trainer.max_steps=4", "seed=1,2", "hydra.sweep.dir=multi")
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "multi"
    assert sorted(p.name for p in sweep.iterdir() if not p.name.startswith(".")) == ["0_seed=1", "1_seed=2", "multirun.yaml"]
    assert any((sweep / ".submitit").iterdir())  # submitit's own records of the jobs
    steps = [torch.load(sweep / job / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] for job in ("0_seed=1", "1_seed=2")]
    assert steps == [4, 4]


def test_a_requeued_slurm_job_resumes_from_its_last_checkpoint(tmp_path, monkeypatch):
    """SLURM requeues a preempted job with the same command (and run directory), SLURM_RESTART_COUNT > 0:
    it goes on from its newest checkpoint instead of starting again, or refusing to."""
    first = run(tmp_path, *TINY, "trainer.max_steps=4", "hydra.run.dir=job")
    assert first.returncode == 0, first.stderr[-3000:]
    again = run(tmp_path, *TINY, "trainer.max_steps=6", "hydra.run.dir=job")  # not requeued: refused, nothing lost
    assert again.returncode == 2 and "holds checkpoints of an earlier run" in again.stderr
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # run() hands the environment on
    requeued = run(tmp_path, *TINY, "trainer.max_steps=6", "hydra.run.dir=job")
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert "requeued job: resuming" in requeued.stderr
    assert torch.load(tmp_path / "job" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6
