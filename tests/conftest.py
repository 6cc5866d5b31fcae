"""Shared fixtures: which devices and backends the op tests run on, and reproducible random inputs."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

import lltm_train

CUDA_READY = torch.cuda.is_available() and "cuda" in lltm_train.available_backends()
CUDA_SKIP_REASON = "needs a CUDA device and the extension's CUDA kernels (run on the GPU machine: scripts/test.sh -m cuda)"

# (device, compiled backend) pairs; the python backend is the oracle they are compared with.
DEVICE_BACKENDS = [
    pytest.param(("cpu", "cpp"), id="cpp"),
    pytest.param(
        ("cuda", "cuda"),
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)],
    ),
]

# Fresh random inputs on every run, reproducible from the seed in the report header:
# LLTM_TEST_SEED=<seed> pytest ... replays them. Each test's seed also depends on its own name, so a
# test sees the same inputs whichever other tests run before it.
SESSION_SEED = int(os.environ.get("LLTM_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def pytest_report_header(config) -> str:
    return f"LLTM_TEST_SEED={SESSION_SEED} (set it to replay this run's random inputs)"


@pytest.fixture(params=DEVICE_BACKENDS)
def device_backend(request) -> tuple[str, str]:
    return request.param


@pytest.fixture(autouse=True)
def _seeded_and_isolated(request):
    """Seeds each test, and restores the float32 matmul precision that a training run sets process-wide."""
    torch.manual_seed(zlib.crc32(f"{SESSION_SEED}:{request.node.nodeid}".encode()))
    precision = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(precision)


@pytest.fixture
def full_float32():
    """Full float32 matrix products (no TF32) for the duration of a test."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(previous)
