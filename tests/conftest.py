"""Shared fixtures and helpers: which devices, backends and cells the op tests run on, reproducible random
inputs, and the arguments of one layer of any cell."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

import lltm_train
from lltm_train.functional import rnn_cell, rnn_layer
from lltm_train.ops.cells import CELLS, CellSpec

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

# Fresh random inputs on every run, reproducible from the seed in the report header (and after the summary
# of a run that failed): LLTM_TEST_SEED=<seed> pytest ... replays them. Each test's seed also depends on its
# own name, so a test sees the same inputs whichever other tests run before it. The seed goes into the
# environment, so that pytest-xdist's workers (started after this import) share the controller's.
SESSION_SEED = int(os.environ.setdefault("LLTM_TEST_SEED", str(int.from_bytes(os.urandom(4), "little"))))


def pytest_report_header(config) -> str:
    return f"LLTM_TEST_SEED={SESSION_SEED} (set it to replay this run's random inputs)"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if exitstatus not in (0, 5):  # the header is hidden under -q: a failure's inputs replay with this
        terminalreporter.write_line(f"LLTM_TEST_SEED={SESSION_SEED} replays this run's random inputs")


def pytest_configure(config) -> None:
    """Under pytest-xdist, each worker's CPU threads (torch's, and those of the training commands it starts)
    get an equal share of the cores: 14 workers each running 16 threads on the GPU host's 16 cores made a
    4 s training run take a few dozen steps instead of hundreds."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_runtest_logreport(report) -> None:
    """LLTM_TEST_FAILURES=<file>: each failure's test id and traceback appended to <file> as it happens, so a
    run cut short (a device call's time limit) still says what failed and why. Under pytest-xdist the
    controller receives every worker's reports and writes them."""
    path = os.environ.get("LLTM_TEST_FAILURES")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as f:
            f.write(f"FAILED {report.nodeid} ({report.when}, LLTM_TEST_SEED={SESSION_SEED})\n{report.longreprtext[-4000:]}\n\n")


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
    """Full float32 matrix products (no TF32) for the duration of a test (the autouse fixture above restores
    the precision afterwards)."""
    torch.set_float32_matmul_precision("highest")


@pytest.fixture(params=list(CELLS))
def cell(request) -> CellSpec:
    """Each cell of the op library (lltm, lstm, gru, rnn, rnn_relu, slstm)."""
    return CELLS[request.param]


def layer_args(spec: CellSpec, T: int, B: int, I: int, H: int, device="cpu", dtype=torch.float64, bias=True,
               requires_grad=True, scale=1.0) -> dict:
    """Random arguments of one layer of ``spec``: ``input`` (T, B, I), ``states`` (a tuple of (B, H)),
    ``weight_ih``, ``weight_hh`` (scaled by ``scale`` / sqrt(fan-in)) and ``biases`` (a tuple; None
    entries without bias). Drawn in float64 and cast, so every dtype sees the same values."""
    G = spec.num_gates

    def rnd(*shape, s=1.0, positive=False):
        t = torch.randn(*shape, dtype=torch.float64, device=device) * s
        t = (t.abs() + 0.5 if positive else t).to(dtype)  # (the sLSTM's normalizer n: positive, as its steps keep it)
        return t.requires_grad_(requires_grad)

    return {"input": rnd(T, B, I), "states": tuple(rnd(B, H, s=0.5, positive=name == "n") for name in spec.states),
            "weight_ih": rnd(G * H, I, s=scale * I**-0.5), "weight_hh": rnd(G * H, H, s=scale * H**-0.5),
            "biases": tuple(rnd(G * H, s=0.5) if bias else None for _ in spec.biases)}


def forward_args(spec: CellSpec, p: dict, lengths=None) -> tuple:
    """The positional arguments of ``spec``'s forward op for ``layer_args`` ``p``, up to ``lengths`` (the sLSTM's
    c, n and m packed into the op's one c state)."""
    return (p["input"], *op_states(spec, p["states"]), p["weight_ih"], p["weight_hh"], *p["biases"], lengths)


def op_states(spec: CellSpec, states: tuple) -> tuple:
    """A cell's states as its ops take them: h, and c with the sLSTM's n and m behind it (B, C H)."""
    return tuple(states) if spec.cell_blocks <= 1 else (states[0], torch.cat(states[1:], 1))


def leaves(p: dict) -> list[torch.Tensor]:
    """The tensors of ``layer_args`` in a fixed order (None biases left out)."""
    return [t for t in (p["input"], *p["states"], p["weight_ih"], p["weight_hh"], *p["biases"]) if t is not None]


def upstream_like(spec: CellSpec, T: int, B: int, H: int, device="cpu", dtype=torch.float64) -> list[torch.Tensor]:
    """Random incoming gradients: for the output (T, B, H), then each final state (B, H)."""
    return [torch.randn(T, B, H, dtype=dtype, device=device)] + \
        [torch.randn(B, H, dtype=dtype, device=device) for _ in spec.states]


def run_layer(spec: CellSpec, p: dict, backend: str, upstream, lengths=None) -> tuple:
    """(output, *final states, *gradients of leaves(p)) of one layer, the loss weighting each result by its
    upstream gradient."""
    out, state = rnn_layer(spec, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"],
                           lengths=lengths, backend=backend)
    loss = sum((r * u).sum() for r, u in zip((out, *state), upstream))
    return (out, *state, *torch.autograd.grad(loss, leaves(p)))


def run_cell(spec: CellSpec, p: dict, backend: str, upstream) -> tuple:
    """As :func:`run_layer` for one step (the input's first step) through the cell function."""
    state = rnn_cell(spec, p["input"][0], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"], backend=backend)
    loss = sum((r * u).sum() for r, u in zip(state, upstream[1:]))
    return (*state, *torch.autograd.grad(loss, leaves(p), allow_unused=True, materialize_grads=True))
