"""The lltm-train command: bad settings fail before training with one clear line; help; sweeps.

Bad settings are checked in-process through Hydra's compose API and :func:`lltm_train.train.train`
(what the command runs); a few cases run the real command end to end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from lltm_train.cli import one_line
from lltm_train.config import ConfigError, check_config, config_dir
from lltm_train.train import train

TINY = ["dataset=adding", "dataset.seq_len=10", "dataset.train_size=32", "dataset.val_size=16", "dataset.test_size=16",
        "dataset.batch_size=8", "model.hidden_size=8", "trainer.max_steps=2", "trainer.val_check_interval=2",
        "callbacks.progress_bar.refresh_rate=0", "trainer.accelerator=cpu"]


def lltm_train(cwd, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "lltm_train", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def compose_cfg(out, *overrides):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("config", overrides=[f"paths.output_dir={out}", *overrides])


BAD = [
    (["dataset=imagenet"], "Could not find 'dataset/imagenet'; Available options in 'dataset': adding, co2, copy"),
    (["model=transformer"], "Could not find 'model/transformer'"),
    (["backend=tpu"], "unknown backend 'tpu'; choose one of auto, python, cpp, cuda, torch"),
    (["trainer.max_steps=abc"], "trainer.max_steps: expected int, got 'abc' (str)"),
    (["model.hidden_size=big"], "model.hidden_size: expected int, got 'big' (str)"),
    (["model.hidden_size=-4"], "hidden_size must be a positive integer, got -4"),
    (["model.cell=elman"], "cell must be one of 'lltm', 'lstm', 'gru', 'rnn', 'rnn_relu', 'slstm', got 'elman'"),
    (["dataset.batch_size=0"], "batch_size must be a positive integer, got 0"),
    (["trainer.precision=8-bit"], "trainer.precision: expected"),
    (["dataset=text"], "missing value for dataset.path"),
    (["dataset=text", "dataset.path=no/such/file.txt"], "no such text file: "),
    (["dataset.no_such_option=1"], "Could not override 'dataset.no_such_option'; To append"),
    (["model.cel=lstm"], "Could not override 'model.cel'; To append to your config use +model.cel=lstm; "
                         "did you mean model.cell?"),
    (["trainer.max_step=5"], "did you mean trainer.max_steps?"),
    (["+dataset.no_such_option=1"], "dataset.no_such_option: lltm_train.data.AddingDataModule takes no argument 'no_such_option'"),
    (["backend=cuda"], "backend=cuda" if torch.cuda.is_available() else "backend=cuda needs a CUDA device and none is visible"),
    (["ckpt_path=last"], "ckpt_path=last: no checkpoint in"),
    (["ckpt_path=missing.ckpt"], "ckpt_path: no such checkpoint file: "),
    (["dataset=shakespeare", "model.bidirectional=true"], "cannot be used to predict the next token"),
    (["model=char_lm"], "LanguageModelTask trains on tokens data, but AddingDataModule poses regression"),
    (["model.optimizer.lr=-1"], "Invalid learning rate: -1"),
    (["model.scheduler.warmup_fraction=2"], "warmup_fraction must be in [0, 1)"),
    (["model.dropout=nan"], "dropout must be a number in [0, 1], got nan"),
    (["model.forget_bias=1.0"], "forget_bias is for cells with a forget gate (lstm, slstm); the lltm cell has none"),
    (["model.cell=lstm", "model.forget_bias=abc"], "model.forget_bias: expected float | None, got 'abc' (str)"),
    (["model.weight_drop=1"], "weight_drop must be below 1"),
    (["model.zoneout=[1,1]"], "zoneout's probabilities must be below 1"),
    (["dataset=shakespeare", "model.sample_temperature=0"], "sample_temperature must be a positive number, got 0"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval must be positive, got 0"),
    (["trainer.precision=16-true"], "use 16-mixed or bf16-mixed"),
    (["dataset=text", "dataset.path=/dev/zero"], "dataset.path='/dev/zero' is not a regular file"),
    (["dataset=text", "dataset.path=''"], "dataset.path is empty (an unset shell variable?)"),
    (["ckpt_path=/"], "ckpt_path: no such checkpoint file: / (a folder: name a .ckpt file in it"),
    (["dataset.num_workers=-1"], "num_workers must be an integer >= 0, got -1"),
    (["trainer.val_check_interval=0.5"], "trainer.val_check_interval must be a whole number of training steps"),
    (["+trainer.limit_train_batches=0"], "trainer.limit_train_batches=0 would train nothing"),
    (["model.dropout=1.0"], "dropout must be below 1 (1 zeroes every activation before the output layer)"),
    (["model.cell=gru", "model.zoneout=[0.9,0]"], "the GRU has no cell state, only h: give zoneout one probability"),
    (["logger._target_=collections.OrderedDict"], "is not a Lightning logger"),
    (["+model.hiddensize=3"], "model.hiddensize: lltm_train.tasks.RegressionTask takes no argument 'hiddensize'"),
    (["+foo=3"], "foo: no such setting"),
    (["seed=-1"], "seed: expected an integer in [0, 2**32), got -1"),
    (["float32_matmul_precision=low"], "float32_matmul_precision: expected highest, high or medium, got 'low'"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val must be >= 0 (0 or null: no clipping), got -1"),
    (["trainer.max_steps=0"], "trainer.max_steps=0 would train nothing"),
    (["trainer.max_epochs=0"], "trainer.max_epochs=0 would train nothing"),
    (["+trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches must be a whole number of batches >= 1"),
    (["+trainer.accumulate_grad_batches=-1"], "(1: no accumulation), got -1"),
    (["optimized_metric=val/bpc"], "optimized_metric=val/bpc: RegressionTask logs val/loss, val/mae, train/loss"),
    (["optimized_metric=test/mae"], "RegressionTask logs val/loss, val/mae, train/loss, throughput/tokens_per_s_run_average "
                                    "(test/ metrics need test=true)"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_setting_fails_before_training_with_one_clear_line(tmp_path, overrides, message):
    tiny = [o for o in TINY if not (o.startswith("dataset") and any(x.startswith("dataset=") for x in overrides))]
    with pytest.raises((ConfigError, HydraException, OmegaConfBaseException)) as error:
        train(compose_cfg(tmp_path, *tiny, *overrides))
    line = one_line(error.value)
    assert message in line and "\n" not in line, line
    assert not list(tmp_path.glob("checkpoints/*.ckpt"))  # failed before any training


def test_a_bare_16_trains_as_lightning_reads_it_16_mixed(tmp_path):
    """Lightning reads trainer.precision=16 as 16-mixed (as bf16 as bf16-mixed); before, the 16-true check refused
    it with a message about a setting the user had not given."""
    train(compose_cfg(tmp_path, *TINY, "trainer.precision=16"))
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("overrides, message", [
    (["dataset=imagenet"], "Could not find 'dataset/imagenet'"),
    (["trainer.max_steps=abc"], "trainer.max_steps: expected int, got 'abc' (str)"),
    (["hydra.run.dir=/proc/nope"], "/proc/nope"),
    (["hydra.run.dir="], "hydra.run.dir is empty (an unset shell variable?)"),
    (["callbacks=null"], "callbacks=null: every run needs the callbacks group; choose one of default; drop one callback"),
    (["trainer=null"], "trainer=null: every run needs the trainer group; choose one of default"),
    (["~trainer"], "~trainer: every run needs the trainer group"),
    (["logger=null"], "logger=null: every run needs the logger group; choose one of csv, mlflow, none, tensorboard; logger=none"),
    # before, the override won silently: a sweep's lstm_cuda folder held a python run, a lstm_torch run a GRU
    (["cell_backend=lstm_cpp", "backend=python"], "cell_backend=lstm_cpp sets backend=cpp, but backend=python was given too"),
    (["cell_backend=rnn_relu_torch", "model.cell=gru"], "sets model.cell=rnn_relu, but model.cell=gru was given too"),
])
def test_the_command_prints_one_line_and_exits_2(tmp_path, overrides, message):
    result = lltm_train(tmp_path, *overrides)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("lltm-train: error: ") and message in lines[-1], result.stderr[-2000:]
    assert sum(line.startswith("lltm-train: error") for line in lines) == 1
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("outputs/*/*/checkpoints"))


def test_help_lists_the_config_groups(tmp_path):
    result = lltm_train(tmp_path, "--help")
    assert result.returncode == 0
    for group in ("dataset", "model", "experiment"):  # whatever files the groups hold
        names = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
        assert f"{group}: {', '.join(names)}" in result.stdout
    assert "backend: auto" in result.stdout and "float32_matmul_precision: high" in result.stdout


def test_each_data_set_picks_its_model_and_model_overrides_it(tmp_path):
    targets = {name: compose_cfg(tmp_path, f"dataset={name}").model._target_.rsplit(".", 1)[1]
               for name in ("shakespeare", "copy", "smnist", "japanese_vowels", "co2", "adding")}
    assert targets == {"shakespeare": "LanguageModelTask", "copy": "LanguageModelTask", "smnist": "ClassificationTask",
                       "japanese_vowels": "ClassificationTask", "co2": "RegressionTask", "adding": "RegressionTask"}
    assert compose_cfg(tmp_path, "dataset=smnist", "model=regressor").model._target_.endswith("RegressionTask")
    assert compose_cfg(tmp_path, "backend=cpp").model.backend == "cpp"


def test_no_logger_runs(tmp_path):
    result = lltm_train(tmp_path, "logger=none", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("chdir", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["in place", "hydra.job.chdir=true"])
def test_relative_paths_resolve_against_the_directory_the_command_ran_in(tmp_path, chdir):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("the quick brown fox jumps over the lazy dog. " * 80)
    common = ["dataset=text", "dataset.path=data/notes.txt", "dataset.seq_len=16", "model.hidden_size=8",
              "trainer.accelerator=cpu", "trainer.max_steps=2", "trainer.val_check_interval=2", "hydra.run.dir=runs/a",
              f"hydra.job.chdir={str(chdir).lower()}"]
    result = lltm_train(tmp_path, *common)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TextDataModule" in result.stderr and (tmp_path / "runs" / "a" / "checkpoints" / "last.ckpt").is_file()
    resumed = lltm_train(tmp_path, *common, "trainer.max_steps=4", "ckpt_path=runs/a/checkpoints/last.ckpt")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(tmp_path / "runs" / "a" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4


def test_a_resume_keeps_the_first_runs_config_record(tmp_path):
    """A resume (refused here: other model settings) records its config beside the first run's, which the
    error message points to, instead of over it."""
    first = lltm_train(tmp_path, *TINY, "hydra.run.dir=run")
    assert first.returncode == 0, first.stderr[-3000:]
    refused = lltm_train(tmp_path, *TINY, "model.hidden_size=16", "hydra.run.dir=run", "ckpt_path=last")
    assert refused.returncode == 2 and "its .hydra/config.yaml" in refused.stderr
    assert "hidden_size: 8" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    resumes = list((tmp_path / "run" / ".hydra").glob("resume_*/config.yaml"))
    assert len(resumes) == 1 and "hidden_size: 16" in resumes[0].read_text()
    # A new run aimed at the folder (ckpt_path forgotten) is refused, and it once overwrote the record with its
    # own settings: the resume the refusal advises then ran with the wrong ones.
    again = lltm_train(tmp_path, *TINY, "model.hidden_size=16", "hydra.run.dir=run")
    assert again.returncode == 2 and "holds checkpoints of an earlier run" in again.stderr
    assert "hidden_size: 8" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "model.hidden_size=16" not in (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text()
    assert len(list((tmp_path / "run" / ".hydra").glob("run_*/config.yaml"))) == 1


def test_a_run_refused_in_a_folder_that_was_there_leaves_it_as_it_was(tmp_path):
    """hydra.run.dir naming a folder that is no run (a sweep's root by mistake, any folder) with ckpt_path=last:
    refused, and Hydra's record and log and the lock file it made there are removed (they stayed, and lltm-report
    then listed the folder as a run); an empty folder stays, empty."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    for folder in ("notes", "empty"):
        refused = lltm_train(tmp_path, *TINY, f"hydra.run.dir={folder}", "ckpt_path=last")
        assert refused.returncode == 2 and "no checkpoint" in refused.stderr, refused.stderr[-2000:]
    assert [p.name for p in (tmp_path / "notes").iterdir()] == ["notes.txt"]
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_second_run_in_a_folder_a_run_is_training_in_is_refused(tmp_path):
    """Two runs given one hydra.run.dir at once (or started in the same second into the default folder) both
    wrote it, one's checkpoints lost: the first holds run/.lock while it trains, the second is refused in one
    line, and once the lock is released (however the holder ended) a run goes ahead."""
    import fcntl

    from helpers import make_cfg

    (tmp_path / "run" / ".hydra").mkdir(parents=True)
    (tmp_path / "run" / ".hydra" / "config.yaml").write_text("the: holder's record\n")
    with open(tmp_path / "run" / ".lock", "w") as held:  # as another process's run holds it
        held.write("pid 4242 on elsewhere\n")
        held.flush()
        fcntl.lockf(held, fcntl.LOCK_EX)
        refused = lltm_train(tmp_path, *TINY, "hydra.run.dir=run")
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "/run (pid 4242 on elsewhere): wait for it to end" in refused.stderr
        assert not (tmp_path / "run" / "checkpoints").exists()
        # the folder is the holder's: not removed on the refusal's account, its record untouched, none added
        assert (tmp_path / "run" / ".hydra" / "config.yaml").read_text() == "the: holder's record\n"
        assert [p.name for p in (tmp_path / "run" / ".hydra").iterdir()] == ["config.yaml"]
        # a sweep's job refused so writes no error.txt into the holder's folder; the sweep's other job runs
        (tmp_path / "sweep" / "0_seed=1").mkdir(parents=True)
        with open(tmp_path / "sweep" / "0_seed=1" / ".lock", "w") as job:
            fcntl.lockf(job, fcntl.LOCK_EX)
            swept = lltm_train(tmp_path, "-m", "seed=1,2", *TINY, "hydra.sweep.dir=sweep")
        assert swept.returncode == 1 and "error in job 0_seed=1: another run is training in" in swept.stderr
        assert not (tmp_path / "sweep" / "0_seed=1" / "error.txt").exists()
        assert (tmp_path / "sweep" / "1_seed=2" / "checkpoints" / "last.ckpt").is_file()
    metrics = train(make_cfg(tmp_path / "run", *TINY))
    assert metrics["train/loss"] > 0 and (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "run" / ".lock").read_text().startswith("pid ")
    # a run refused for a bad setting leaves no folder behind (the lock file included)
    (tmp_path / "fresh").mkdir()
    bad = lltm_train(tmp_path / "fresh", *TINY, "model.optimizer.lr=-1")
    assert bad.returncode == 2 and not list((tmp_path / "fresh").glob("outputs/*/*")), bad.stderr[-2000:]


def test_the_run_folders_lock_is_not_held_by_forked_processes(tmp_path):
    """Data-loader workers are forked: a lock they inherited kept a killed run's folder locked until they died
    (about 5 s), and the resume right after was refused. The lock is the process's own (lockf)."""
    from lltm_train.run_lock import run_dir_lock

    script = ("import os, sys, time\nfrom lltm_train.run_lock import run_dir_lock\n"
              "with run_dir_lock(sys.argv[1]):\n"
              "    child = os.fork()\n"
              "    if child == 0:\n        time.sleep(60)\n        os._exit(0)\n"
              "    open(sys.argv[2], 'w').write(str(child))\n    os._exit(0)\n")  # dies holding the lock; its child lives on
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "run"), str(tmp_path / "child")], timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    child = int((tmp_path / "child").read_text())
    try:
        with run_dir_lock(tmp_path / "run"):
            pass
    finally:
        os.kill(child, 9)


def test_a_killed_sweep_resumes_its_jobs_and_starts_those_that_never_started(tmp_path):
    """-m ... hydra.sweep.dir=S ckpt_path=last: a job with checkpoints goes on from them, a job without (it never
    started: its folder is missing) starts afresh instead of failing with "no checkpoint"."""
    sweep = ["-m", "backend=python,cpp", *TINY, "hydra.sweep.dir=sweep"]
    first = lltm_train(tmp_path, *sweep)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(tmp_path / "sweep" / "1_backend=cpp")  # as if the sweep had been killed during job 0
    resumed = lltm_train(tmp_path, *sweep, "trainer.max_steps=4", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job, start in (("0_backend=python", 2), ("1_backend=cpp", None)):
        last = torch.load(tmp_path / "sweep" / job / "checkpoints" / "last.ckpt", weights_only=False)
        assert last["global_step"] == 4, job
        assert (start is None) == (not list((tmp_path / "sweep" / job / ".hydra").glob("resume_*"))), job
    # a mistyped sweep folder (no job of it has a checkpoint) is refused job by job, not started afresh
    typo = lltm_train(tmp_path, *[a if a != "hydra.sweep.dir=sweep" else "hydra.sweep.dir=swep" for a in sweep],
                      "ckpt_path=last")
    assert typo.returncode == 2, typo.stderr[-3000:]
    assert all(f"error in job {job}: ckpt_path=last: no job of the sweep in" in typo.stderr
               for job in ("0_backend=python", "1_backend=cpp"))
    assert not list((tmp_path / "swep").glob("*/checkpoints"))
    # a hyperparameter search is not resumable: one line before any trial
    search = lltm_train(tmp_path, "hparams_search=lm_optuna", *TINY, "hydra.sweep.dir=search", "ckpt_path=last")
    assert search.returncode == 2 and "a hyperparameter search cannot be resumed" in search.stderr, search.stderr[-3000:]
    assert not list((tmp_path / "search").glob("*/.hydra"))  # no trial's folder left behind


def test_a_sweep_goes_on_past_a_failing_job_and_names_jobs_by_the_swept_settings(tmp_path):
    """backend=cuda fails on a CPU trainer; the cpp and python jobs still run. Many fixed overrides (and a path
    with a slash) once made the job directory's name too long, or nested it."""
    (tmp_path / "data").mkdir()
    result = lltm_train(tmp_path, "-m", "backend=python,cuda,cpp", "model.hidden_size=4,8", "+trainer.fast_dev_run=2",
                        *(o for o in TINY if not o.startswith("model.hidden_size")), "hydra.sweep.dir=sweep/with/slashes")
    assert result.returncode == 2, result.stderr[-3000:]  # the exit status is the number of failed jobs
    jobs = sorted(p.name for p in (tmp_path / "sweep" / "with" / "slashes").iterdir() if p.is_dir())
    assert jobs == ["0_backend=python_model.hidden_size=4", "1_backend=python_model.hidden_size=8",
                    "2_backend=cuda_model.hidden_size=4", "3_backend=cuda_model.hidden_size=8",
                    "4_backend=cpp_model.hidden_size=4", "5_backend=cpp_model.hidden_size=8"]
    root = tmp_path / "sweep" / "with" / "slashes"
    for job in jobs:
        failed = "cuda" in job
        assert (root / job / "error.txt").is_file() == failed
        assert (root / job / ".hydra" / "config.yaml").is_file()
    assert "backend=cuda" in (root / jobs[2] / "error.txt").read_text()
    assert "lltm-train: 2 job(s) of the sweep failed" in result.stderr


def test_a_sweep_over_data_sets_takes_their_settings(tmp_path):
    result = lltm_train(tmp_path, "-m", "dataset=adding,copy", "dataset.train_size=48", "+trainer.fast_dev_run=1",
                        "model.hidden_size=8", "trainer.accelerator=cpu", "logger=none")
    assert result.returncode == 0, result.stderr[-3000:]
    configs = sorted(tmp_path.glob("multirun/*/*/.hydra/config.yaml"))
    assert len(configs) == 2 and all("train_size: 48" in c.read_text() for c in configs)


def test_experiment_recipes_compose_and_check(tmp_path):
    names = sorted(p.stem for p in (config_dir() / "experiment").glob("*.yaml"))
    assert {"shakespeare_long", "smnist_rows", "psmnist", "japanese_vowels", "adding", "copy", "co2"} <= set(names)
    for name in names:
        check_config(compose_cfg(tmp_path, f"experiment={name}"))


def test_a_resume_starts_from_the_runs_own_command_line_settings(tmp_path):
    """`hydra.run.dir=DIR ckpt_path=last`, as the README and the stop message say, with nothing else
    repeated: the run's settings (.hydra/overrides.yaml) apply, and settings given now win."""
    first = lltm_train(tmp_path, *TINY, "trainer.max_steps=4", "model.hidden_size=6", "hydra.run.dir=run")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = lltm_train(tmp_path, "hydra.run.dir=run", "ckpt_path=last", "trainer.max_steps=6")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming with the run's own settings" in resumed.stderr and "trainer.max_steps=4" not in resumed.stderr
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 6 and ckpt["hyper_parameters"]["hidden_size"] == 6


def test_a_checkpoint_file_of_a_run_brings_back_that_runs_settings(tmp_path):
    """`ckpt_path=DIR/checkpoints/last.ckpt` alone (the README's second form): the run's settings (another cell, its
    heads) apply, so the model fits the file; the resumed run writes a folder of its own."""
    first = lltm_train(tmp_path, *TINY, "trainer.max_steps=4", "model.hidden_size=6", "model.cell=lstm",
                       "model.num_heads=2", "hydra.run.dir=run")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = lltm_train(tmp_path, "ckpt_path=run/checkpoints/last.ckpt", "trainer.max_steps=6")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming with the run's own settings" in resumed.stderr and "model.num_heads=2" in resumed.stderr
    (new,) = [p for p in tmp_path.rglob("last.ckpt") if "run" not in p.parts]
    ckpt = torch.load(new, weights_only=False)
    assert ckpt["global_step"] == 6 and ckpt["hyper_parameters"]["num_heads"] == 2
    assert ckpt["hyper_parameters"]["cell"] == "lstm"
    # The new folder records the settings (it once held them only in .hydra/resume_<date>): it resumes in turn.
    folder = new.parent.parent
    assert "num_heads: 2" in (folder / ".hydra" / "config.yaml").read_text()
    again = lltm_train(tmp_path, f"hydra.run.dir={folder}", "ckpt_path=last", "trainer.max_steps=8")
    assert again.returncode == 0, again.stderr[-2000:]
    ckpt = torch.load(new, weights_only=False)
    assert ckpt["global_step"] == 8 and ckpt["hyper_parameters"]["num_heads"] == 2
    # into a folder named now: still the checkpoint's run's settings (they were the named folder's, here none)
    moved = lltm_train(tmp_path, "ckpt_path=run/checkpoints/last.ckpt", "hydra.run.dir=moved", "trainer.max_steps=6")
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert torch.load(tmp_path / "moved" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6
    other = lltm_train(tmp_path, "ckpt_path=run/checkpoints/last.ckpt", "model.num_heads=1")  # given now: it wins
    assert other.returncode == 2
    assert "its recurrent weights are those of model.num_heads=2, this model's of 1" in other.stderr


def test_job_folders_keep_the_sign_of_an_exponent_and_shorten_long_floats(tmp_path):
    result = lltm_train(tmp_path, "-m", "trainer.gradient_clip_val=1e+30,12345.12345678", "+trainer.fast_dev_run=1", *TINY,
                        "hydra.sweep.dir=s")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "s").iterdir() if p.is_dir()) == [
        "0_trainer.gradient_clip_val=1e30", "1_trainer.gradient_clip_val=1.235e04"]


def test_a_process_started_by_a_run_keeps_one_line_errors_and_a_user_gets_the_full_report(tmp_path):
    """DDP's other processes inherit the HYDRA_FULL_ERROR=1 that lltm-train sets for itself: they took it for the
    user's and printed tracebacks (64 processes of a run with an unwritable folder did)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "LLTM_TRAIN_SET_HYDRA_FULL_ERROR")}
    command = [sys.executable, "-m", "lltm_train", *TINY, "model.hidden_size=-1", "hydra.run.dir=r"]
    started = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             env={**env, "HYDRA_FULL_ERROR": "1", "LLTM_TRAIN_SET_HYDRA_FULL_ERROR": "1"})
    assert started.returncode == 2 and "Traceback" not in started.stderr, started.stderr[-2000:]
    assert started.stderr.strip().splitlines()[-1].startswith("lltm-train: error: ") and "hidden_size" in started.stderr
    asked = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**env, "HYDRA_FULL_ERROR": "1"})
    assert asked.returncode != 0 and "Traceback" in asked.stderr


def test_an_assert_without_a_message_still_says_what_failed(tmp_path):
    result = lltm_train(tmp_path, "hparams_search=lm_optuna", "hydra.sweeper.max_failure_rate=2", *TINY)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == ("lltm-train: error: AssertionError without a message; run with "
                                                     "HYDRA_FULL_ERROR=1 for the traceback")


def test_the_search_maximises_accuracies_and_minimises_the_rest(tmp_path):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        for metric, direction in (("val/acc", "maximize"), ("val/bpc", "minimize"), ("val/loss", "minimize")):
            cfg = compose("config", overrides=["hparams_search=lm_optuna", f"optimized_metric={metric}"],
                          return_hydra_config=True)
            assert cfg.hydra.sweeper.direction == direction


def test_a_comma_list_of_paths_is_a_sweep_and_paths_may_be_any_unicode(tmp_path):
    for name in ("small.txt", "édge.txt"):
        (tmp_path / name).write_text("the quick brown fox jumps over a lazy dog. " * 40)
    tiny = ["dataset=text", "dataset.seq_len=16", "model.hidden_size=8", "model.embedding_dim=4", "model.sample_length=0",
            "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
            "callbacks.progress_bar.refresh_rate=0", "trainer.accelerator=cpu"]
    sweep = lltm_train(tmp_path, "-m", *tiny, "dataset.path=small.txt,édge.txt", "hydra.sweep.dir=sw")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    jobs = sorted(p.name for p in (tmp_path / "sw").iterdir() if p.is_dir())
    assert len(jobs) == 2 and jobs[0].startswith("0_dataset.path=small.txt")
    single = lltm_train(tmp_path, *tiny, "dataset.path=édge.txt", "hydra.run.dir=runs/café")
    assert single.returncode == 0, single.stderr[-3000:]
    assert (tmp_path / "runs" / "café" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("path", ["/data/o'brien.txt", "runs/0_lr=0.1", "café/a b.txt", "ends\\", "x\\'y"])
def test_a_path_setting_reaches_the_run_as_written(path):
    """Path settings are quoted for Hydra's grammar as given (lltm_train.cli._quote_paths), a quote in them
    included: dataset.path=.../o'brien.txt failed with Hydra's LexerNoViableAltException."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lltm_train.cli import _quote_paths

    (quoted,) = _quote_paths([f"dataset.path={path}"])
    assert OverridesParser.create().parse_override(quoted).value() == path


def test_a_run_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    import os

    from lltm_train import cli

    (tmp_path / "locked").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p).endswith("locked") else real_access(p, mode))
    monkeypatch.setattr(sys, "argv", ["lltm-train", f"hydra.run.dir={tmp_path / 'locked'}"])
    # cli.main() sets these for the processes it starts: set them here first so that monkeypatch restores them
    # afterwards (a bare delenv of an absent variable records nothing, and HYDRA_FULL_ERROR=1 would then reach
    # every later test's subprocess and turn its one-line errors into tracebacks)
    for name in ("HYDRA_FULL_ERROR", cli._OWN_FULL_ERROR, cli._SWEPT_KEYS):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    assert f"lltm-train: error: cannot write the run directory {tmp_path / 'locked'} (permission denied)" in capsys.readouterr().err


def test_model_compile_without_a_cxx_compiler_is_one_line(tmp_path, monkeypatch):
    """torch.compile's Inductor builds C++: with no compiler (a wheel install on a bare machine; here CXX names
    none and Inductor's other candidate, a conda g++, is not installed by default) model.compile=true is one
    line before training starts, not Inductor's traceback at the first step."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    monkeypatch.delenv("TORCH_INDUCTOR_INSTALL_GXX", raising=False)
    result = lltm_train(tmp_path, *TINY, "model.compile=true")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("lltm-train: error: model.compile=true: torch.compile's Inductor needs a C++ compiler (")
    assert "no-such-g++" in last and last.endswith("or set model.compile=false")


def test_a_warm_up_longer_than_the_run_is_warned_of(tmp_path, caplog):
    """Before, a run whose warm-up outlasted it trained below a few percent of its learning rate without a word."""
    with caplog.at_level("WARNING", logger="lltm_train"):
        train(compose_cfg(tmp_path, *TINY, "model.scheduler.warmup_steps=100"))
    assert "warmup_steps=100 is not below trainer.max_steps=2: the whole run stays in the warm-up" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lltm_train"):
        train(compose_cfg(tmp_path / "b", *TINY, "model.scheduler.warmup_steps=1"))
    assert "warm-up" not in caplog.text
