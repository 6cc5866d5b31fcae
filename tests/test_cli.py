"""The lltm-train command as a user runs it: help, one-line errors before training, sweeps."""

from __future__ import annotations

import subprocess
import sys

import pytest

TINY = ["dataset=adding", "dataset.seq_len=10", "dataset.train_size=32", "dataset.val_size=16", "dataset.batch_size=8",
        "model.hidden_size=8"]


def lltm_train(cwd, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "lltm_train", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_help_lists_the_config_groups(tmp_path):
    result = lltm_train(tmp_path, "--help")
    assert result.returncode == 0
    for line in ("backend: auto, cpp, cuda, python", "dataset: adding, co2, copy, japanese_vowels, shakespeare, smnist, text",
                 "experiment: "):
        assert line in result.stdout


BAD = [
    (["dataset=imagenet"], "Could not find 'dataset/imagenet'; Available options in 'dataset': adding, co2, copy"),
    (["backend=tpu"], "Could not find 'backend/tpu'"),
    (["trainer.max_steps=abc"], "trainer.max_steps: expected int, got 'abc' (str)"),
    (["model.hidden_size=big"], "model.hidden_size: expected int, got 'big' (str)"),
    (["model.hidden_size=-4"], "hidden_size must be a positive integer, got -4"),
    (["dataset.batch_size=0"], "batch_size must be a positive integer, got 0"),
    (["trainer.precision=8-bit"], "trainer.precision: expected"),
    (["dataset=text"], "missing value for dataset.path"),
    (["dataset=text", "dataset.path=no/such/file.txt"], "no such text file: "),
    (["dataset.no_such_option=1"], "Could not override 'dataset.no_such_option'"),
    (["+dataset.no_such_option=1"], "dataset.no_such_option: lltm_train.data.ShakespeareDataModule takes no argument 'no_such_option'"),
    (["backend=cuda"], "backend=cuda needs a CUDA device, but the trainer runs on cpu"),
    (["ckpt_path=last"], "ckpt_path=last: no checkpoint in"),
    (["ckpt_path=missing.ckpt"], "ckpt_path: no such checkpoint file: "),
    (["model.bidirectional=true"], "cannot be used to predict the next token"),
    (["model.optimizer.lr=-1"], "Invalid learning rate: -1"),
    (["model.scheduler.warmup_fraction=2"], "warmup_fraction must be in [0, 1)"),
    (["model.dropout=nan"], "dropout must be a number in [0, 1], got nan"),
    (["model.sample_temperature=0"], "sample_temperature must be a positive number, got 0"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval must be positive, got 0"),
    (["trainer.precision=16-true"], "use 16-mixed or bf16-mixed"),
    (["logger._target_=collections.OrderedDict"], "is not a Lightning logger"),
    (["+model.hiddensize=3"], "model.hiddensize: no such setting"),
    (["+foo=3"], "foo: no such setting"),
    (["seed=-1"], "seed: expected an integer in [0, 2**32), got -1"),
    (["hydra.run.dir=/proc/nope"], "/proc/nope"),
    (["callbacks=null"], "Config group override must be a string or a list"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_override_fails_with_one_clear_line(tmp_path, overrides, message):
    result = lltm_train(tmp_path, *overrides)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("lltm-train: error: ") and message in lines[-1], result.stderr[-2000:]
    assert sum(line.startswith("lltm-train: error") for line in lines) == 1
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("outputs/*/*/checkpoints"))  # failed before any training


def test_no_logger_runs(tmp_path):
    result = lltm_train(tmp_path, "logger=none", "trainer.max_steps=2", "trainer.val_check_interval=2", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]


def test_relative_text_path_resolves_against_the_working_directory(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("the quick brown fox jumps over the lazy dog. " * 80)
    result = lltm_train(tmp_path, "dataset=text", "dataset.path=data/notes.txt", "dataset.seq_len=16", "+trainer.fast_dev_run=1",
                        "model.hidden_size=8")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TextDataModule" in result.stderr


def test_multirun_sweep_over_backends(tmp_path):
    result = lltm_train(tmp_path, "-m", "backend=python,cpp", "+trainer.fast_dev_run=2", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.name for p in tmp_path.glob("multirun/*/*") if p.is_dir())
    assert len(jobs) == 2 and jobs[0].startswith("0_") and "backend=python" in jobs[0] and "backend=cpp" in jobs[1]
    for job in (p for p in tmp_path.glob("multirun/*/*") if p.is_dir()):
        assert (job / ".hydra" / "config.yaml").is_file() and (job / "train.log").is_file()


def test_experiment_recipes_compose(tmp_path):
    from hydra import compose, initialize_config_dir

    from lltm_train.config import check_config, config_dir

    names = sorted(p.stem for p in (config_dir() / "experiment").glob("*.yaml"))
    assert {"shakespeare_long", "smnist_rows", "psmnist", "japanese_vowels", "adding", "copy", "co2"} <= set(names)
    for name in names:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose("config", overrides=[f"experiment={name}", f"paths.output_dir={tmp_path}"])
        check_config(cfg)
