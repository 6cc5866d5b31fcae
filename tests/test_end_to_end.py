"""The README's default job, as a user runs it (slow: about 6 minutes on 2 CPU cores; `pytest -m slow`)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@pytest.mark.slow
def test_default_job_reaches_2_3_bits_per_character_within_10_minutes(tmp_path):
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "lltm_train", "hydra.run.dir=run"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=900)
    minutes = (time.monotonic() - start) / 60
    assert result.returncode == 0, result.stderr[-3000:]
    bpc = float(re.search(r"val/bpc=([0-9.]+)", result.stderr).group(1))
    print(f"default job: {minutes:.1f} minutes, val/bpc {bpc:.3f}")
    assert bpc <= 2.3 and minutes <= 10
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    assert {"train/loss", "val/bpc", "throughput/tokens_per_s"} <= set(acc.Tags()["scalars"])
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
