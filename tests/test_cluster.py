"""Cluster sweeps through Hydra's submitit launcher (conf/hydra/launcher), and SLURM requeues."""

from __future__ import annotations

import pytest
import torch

from helpers import ADDING, run

TINY = [*ADDING, "dataset.train_size=64", "trainer.val_check_interval=2", "callbacks.progress_bar.refresh_rate=0"]


@pytest.mark.slow  # a local submitit sweep of two jobs (about 15 s on 2 cores)
def test_a_sweep_runs_its_jobs_through_submitit(tmp_path):
    """hydra/launcher=local: the jobs run as submitit's processes, each in its folder named by its settings."""
    result = run(tmp_path, "-m", "hydra/launcher=local", *TINY, "trainer.max_steps=4", "model.hidden_size=8,-1",
                 "hydra.sweep.dir=multi")
    sweep = tmp_path / "multi"
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert sorted(j.split("_", 1)[1] for j in jobs) == ["model.hidden_size=-1", "model.hidden_size=8"]
    assert any((sweep / ".submitit").iterdir())  # submitit's own records of the jobs
    good, bad = [j for j in jobs if "=8" in j], [j for j in jobs if "=-1" in j]
    assert [torch.load(sweep / j / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] for j in good] == [4]
    # the failed jobs ran in submitit's processes: still counted here, in the exit status and one line
    assert result.returncode == 1, result.stderr[-3000:]
    assert "1 job(s) of the sweep failed" in result.stderr and all((sweep / j / "error.txt").is_file() for j in bad)


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
