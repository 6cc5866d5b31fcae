"""CPU training keeps freed host memory in the process (lltm_train.host_memory): a tensor freed and allocated
again every step reuses resident pages instead of faulting fresh ones in."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the malloc settings are glibc's")

# Minor page faults over ten allocations of a 64 MiB tensor, each freed before the next: above glibc's
# largest dynamic mmap threshold (32 MiB), so by default each is fresh mmap pages (16,384 faults each).
# Then the training set-up of a CPU run (_prepare), and the same count again. A fresh process each time:
# the settings are the process's.
PROBE = """
import resource, sys, torch
def faults():
    torch.ones(16 << 20)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        torch.ones(16 << 20)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start
before = faults()
from hydra import compose, initialize_config_dir
from lltm_train.config import config_dir
from lltm_train.train import _prepare
with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
    cfg = compose("config", overrides=[f"paths.output_dir={sys.argv[1]}", "dataset=adding", "dataset.train_size=32",
                                       "model.hidden_size=8", "trainer.accelerator=cpu"])
_prepare(cfg)
print("FAULTS", before, faults())
"""


def faults_before_and_after_set_up(tmp_path, **env):
    result = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-2000:]
    return [int(v) for v in result.stdout.split("FAULTS")[1].split()]


def test_a_cpu_run_reuses_the_pages_of_freed_tensors(tmp_path):
    before, after = faults_before_and_after_set_up(tmp_path)
    assert before >= 10 * 16384 * 0.9  # fresh pages every time, as the premise says
    assert after <= 16384 + 64  # at most one tensor's pages over ten allocations (a tenth of before)


@pytest.mark.parametrize("off", ["0", "false", "off"])
def test_the_setting_can_be_turned_off(tmp_path, off):
    before, after = faults_before_and_after_set_up(tmp_path, LLTM_KEEP_FREED_MEMORY=off)
    assert before >= 10 * 16384 * 0.9 and after >= 10 * 16384 * 0.9
