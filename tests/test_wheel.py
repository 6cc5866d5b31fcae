"""The binary wheel (scripts/wheel.sh) installs into a fresh virtual environment with no compiler and gives
working cpp ops and lltm-train (slow: it compiles the extension once and installs the dependencies)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_installs_and_trains_without_a_compiler(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run([str(ROOT / "scripts" / "wheel.sh"), "-w", str(dist)], capture_output=True, text=True,
                           timeout=1800)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("lltm_train-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    torch_spec = f"torch=={torch.__version__.split('+')[0]}"  # the CPU build from this machine's index
    subprocess.run([*pip, torch_spec], check=True, timeout=900)
    subprocess.run([*pip, str(wheel)], check=True, timeout=1800)
    # no compiler: a just-in-time build would fail, so the ops must come from the wheel's library
    env = {**os.environ, "CC": "/bin/false", "CXX": "/bin/false", "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    env.pop("PYTHONPATH", None)
    check = subprocess.run([py, "-c", "import lltm_train, lltm_train._C; from lltm_train.ops import _extension as e; "
                            "assert e.load() and 'cpp' in lltm_train.available_backends(), e.load_error(); "
                            "print(lltm_train.__file__)"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr[-3000:]
    assert str(venv) in check.stdout  # the installed package, not this checkout
    # a synthetic data set: the text and image data sets come from packages of their own (requirements-data.txt)
    trained = subprocess.run([str(venv / "bin" / "lltm-train"), "dataset=adding", "dataset.train_size=64",
                              "dataset.batch_size=8", "backend=cpp", "trainer.max_steps=3", "trainer.val_check_interval=3",
                              "trainer.limit_val_batches=1", "model.hidden_size=16", "trainer.accelerator=cpu",
                              "hydra.run.dir=run", "callbacks.progress_bar.refresh_rate=0"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "backend cpp on cpu" in trained.stderr and "lltm-train: done." in trained.stderr
