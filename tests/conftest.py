"""Shared fixtures: which devices and backends the op tests run on."""

from __future__ import annotations

import os

import pytest
import torch

import lltm_train

CUDA_READY = torch.cuda.is_available() and "cuda" in lltm_train.available_backends()
CUDA_SKIP_REASON = (
    "needs a CUDA device and the extension's CUDA kernels (run on the GPU machine: pytest -m cuda)"
)

# (device, compiled backend) pairs; the python backend is the oracle they are compared with.
DEVICE_BACKENDS = [
    pytest.param(("cpu", "cpp"), id="cpp"),
    pytest.param(
        ("cuda", "cuda"),
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)],
    ),
]


@pytest.fixture(params=DEVICE_BACKENDS)
def device_backend(request) -> tuple[str, str]:
    return request.param


@pytest.fixture(autouse=True)
def _fresh_seed() -> None:
    """Fresh random inputs on every run; a failure's captured output shows the seed to replay it with."""
    seed = int(os.environ.get("LLTM_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    torch.manual_seed(seed)
    print(f"LLTM_TEST_SEED={seed}")
