"""What every mode of ``lltm-bench`` shares: the configurations, the timer, the random weights, the contenders
of a layer (PyTorch's layer, the python backend, the fused one), the check against the python backend, the
peak memory and the machine's description.

A cell's PyTorch baseline comes from its spec (:attr:`lltm_train.ops.cells.CellSpec.baselines`): the
``torch.nn`` layer of its main baseline cell (``nn.LSTM`` for the LLTM and the LSTM, ``nn.GRU`` for the
GRU), labelled with that cell's :attr:`~lltm_train.ops.cells.CellSpec.torch_label`.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch

from ..backends import resolve_backend
from ..functional import rnn_cell, rnn_layer
from ..ops.cells import CELLS, LLTM, CellSpec
from .peers import flashrnn_contender

CONFIGS = {  # name: (T, B, input_size, hidden_size)
    "seed-cell": (1, 16, 32, 128),
    "gpu-S": (512, 32, 64, 128),
    "gpu-M": (128, 64, 256, 512),
    "gpu-L": (256, 128, 1024, 1024),
    "gpu-XL": (128, 256, 1024, 2048),
    "cpu-S": (128, 32, 64, 128),
    "cpu-M": (64, 64, 256, 512),
    "flashrnn-shape": (1024, 16, 768, 768),  # FlashRNN's own benchmark (Pöppel et al. 2024): B 16, T 1024, 768 units
}
DEFAULTS = {"cpu": ["seed-cell", "cpu-S", "cpu-M"], "cuda": ["seed-cell", "gpu-S", "gpu-M", "gpu-L"]}


def timer(device: torch.device) -> Callable[[Callable[[], None], int], float]:
    """Returns time(fn, n): seconds per call of fn, over n back-to-back calls (CUDA events on a GPU,
    ``time.perf_counter`` on a CPU)."""
    if device.type == "cuda":
        def time_cuda(fn, n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000 / n
        return time_cuda

    def time_cpu(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n
    return time_cpu


def measure(fn: Callable[[], None], device: torch.device, repeats: int, calls: int, warmup: int = 3) -> float:
    """Median seconds per call of fn over ``repeats`` timings of ``calls`` calls each, after warm-up."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    time_calls = timer(device)
    return statistics.median(time_calls(fn, calls) for _ in range(repeats))


def baseline(cell: CellSpec) -> CellSpec:
    """The cell whose ``torch.nn`` layer a cell is timed against: its main baseline (``CellSpec.baselines[0]``)."""
    if not cell.baselines:
        raise ValueError(f"the {cell.title} cell names no baseline (CellSpec.baselines) for lltm-bench to time it against")
    return CELLS[cell.baselines[0]]


def baseline_label(cell: CellSpec) -> str:
    """PyTorch's layer that a cell is compared with: its main baseline's ``torch.nn`` layer (nn.LSTM for the
    LLTM and the LSTM, nn.GRU for the GRU)."""
    return baseline(cell).torch_label


def weights(cell: CellSpec, I: int, H: int, num_heads: int = 1, **kw) -> list[torch.Tensor]:
    """weight_ih, weight_hh (the heads' blocks, (G H, H / num_heads)) and the cell's biases, random, scaled as a
    trained layer's would be."""
    G, DH = cell.num_gates, H // num_heads
    return [torch.randn(G * H, I, **kw) * I**-0.5, torch.randn(G * H, DH, **kw) * DH**-0.5,
            *(torch.randn(G * H, **kw) * 0.1 for _ in cell.biases)]


def stack(cell: CellSpec, I: int, H: int, num_heads: int, num_layers: int, bidirectional: bool, **kw) -> torch.nn.Module:
    """Our stacked layers (:func:`lltm_train.nn.recurrent_layers`, torch.nn's initialisation) for ``--num-layers``
    and ``--bidirectional``."""
    from ..nn import recurrent_layers  # noqa: PLC0415 - the modules import the bench's neighbours

    return recurrent_layers(cell, I, H, num_layers=num_layers, bidirectional=bidirectional, num_heads=num_heads).to(**kw)


def contenders(name: str, T: int, B: int, I: int, H: int, device, dtype, backend: str, cell: CellSpec = LLTM,
               num_heads: int = 1, peers: bool = False, num_layers: int = 1, bidirectional: bool = False):
    """(label, fn) pairs: PyTorch's baseline (a layer, or its one-step cell for the config ``seed-cell``), the
    python backend and ``backend``, then with ``peers`` FlashRNN's layer of the cell where it is installed and has
    the cell (:mod:`.peers`); each fn runs forward + backward once on fresh random inputs made here. With
    ``num_heads`` ours and FlashRNN's run that many heads; PyTorch's layer, which has none, the dense width. With
    ``num_layers`` > 1 or ``bidirectional``, ours are :mod:`lltm_train.nn`'s module and PyTorch's its layer with
    the same stack (no FlashRNN, which runs one layer)."""
    kw = dict(device=device, dtype=dtype)
    x = torch.randn(T, B, I, **kw, requires_grad=True)
    stacked = num_layers > 1 or bidirectional
    params = [] if stacked else [w.requires_grad_() for w in weights(cell, I, H, num_heads, **kw)]
    grad = torch.randn(T, B, H * (2 if bidirectional else 1), **kw)
    step = name == "seed-cell"
    module = stack(cell, I, H, num_heads, num_layers, bidirectional, **kw) if stacked else None

    def ours(be: str):
        if stacked:
            def run():
                module.backend = be
                out, _ = module(x)
                out.backward(grad)
        elif step:
            def run():
                state = rnn_cell(cell, x[0], None, *params, backend=be, num_heads=num_heads)
                torch.autograd.backward(state, (grad[0],) * len(state))
        else:
            def run():
                out, _ = rnn_layer(cell, x, None, *params, backend=be, num_heads=num_heads)
                out.backward(grad)
        return run

    rival = baseline(cell)
    theirs = (rival.torch_cell(I, H) if step else rival.torch_layer(I, H, num_layers=num_layers,
                                                                      bidirectional=bidirectional)).to(**kw)

    def run_theirs():
        if step:
            state = theirs(x[0])
            state = state if isinstance(state, tuple) else (state,)
            torch.autograd.backward(state, (grad[0],) * len(state))
        else:
            out, _ = theirs(x)
            out.backward(grad)

    found = [(rival.torch_label, run_theirs), ("python", ours("python")), (backend, ours(backend))]
    peer = flashrnn_contender(cell, T, B, H, num_heads, device, dtype) if peers and not (step or stacked) else None
    return found + ([peer] if peer else [])


def layout_text(row: dict) -> str:
    """", 4 heads, 3 layers, bidirectional" for a row's layout other than one head, one layer, one direction."""
    parts = [f"{row.get('num_heads', 1)} heads" if row.get("num_heads", 1) != 1 else "",
             f"{row.get('num_layers', 1)} layers" if row.get("num_layers", 1) != 1 else "",
             "bidirectional" if row.get("bidirectional") else ""]
    return "".join(f", {p}" for p in parts if p)


def check_against_python(T, B, I, H, device, dtype, backend: str, cell: CellSpec = LLTM,
                         against_float64: bool | None = None, num_heads: int = 1, num_layers: int = 1,
                         bidirectional: bool = False) -> float:
    """How far the backend's outputs and gradients are from the python backend's: the largest relative
    difference (norm), in float32 by default. In 16-bit dtypes both backends round differently, so each is
    measured against a float64 run and the backend's error is returned relative to python's (<= 1 when it is
    no worse); ``against_float64=True`` measures float32 that way too. A stack (``num_layers``,
    ``bidirectional``) is checked as :func:`stack`'s module."""
    torch.manual_seed(0)
    kw = dict(device=device, dtype=dtype)
    stacked = num_layers > 1 or bidirectional
    x = torch.randn(T, B, I, **kw)
    module = stack(cell, I, H, num_heads, num_layers, bidirectional, **kw) if stacked else None
    params = [p.detach().clone() for p in module.parameters()] if stacked else weights(cell, I, H, num_heads, **kw)
    leaves = [x, *params]

    def results(be, leaf_dtype):
        ls = [t.detach().to(leaf_dtype).requires_grad_() for t in leaves]
        if stacked:
            layers = module.to(leaf_dtype)
            layers.backend = be
            out, state = torch.func.functional_call(layers, dict(zip(dict(layers.named_parameters()), ls[1:])), (ls[0],))
            state = state if isinstance(state, tuple) else (state,)
        else:
            out, state = rnn_layer(cell, ls[0], None, *ls[1:], backend=be, num_heads=num_heads)
        loss = out.float().square().mean() + state[-1].float().mean()
        return [t.detach().double() for t in (out, *state, *torch.autograd.grad(loss, ls))]

    def error(got, want):
        return max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(got, want))

    if not (against_float64 if against_float64 is not None else dtype != torch.float32):
        return error(results(backend, dtype), results("python", dtype))
    exact = results("python", torch.float64)
    return error(results(backend, dtype), exact) / max(error(results("python", dtype), exact), 1e-30)


# The check before a configuration is timed: float32 within this relative difference of python; otherwise (and in
# the 16-bit dtypes) the backend's error against float64 within this multiple of python's. TF32 products round to
# 10 bits, and a cell whose derivative is a step (the ReLU RNN) carries that into its gradients: cuda and python
# differed by 2.85e-3 at gpu-S (H200, 2026-12-03), and their errors against float64 are draws of one size, a few
# times apart either way (tests/test_cuda.py). A wrong kernel is off by far more.
FLOAT32_DIFFERENCE, ERROR_MULTIPLE = 1e-3, 4.0


def checked_against_python(where: str, T, B, I, H, device, dtype, backend: str, cell: CellSpec = LLTM,
                           num_heads: int = 1, num_layers: int = 1, bidirectional: bool = False) -> float:
    """:func:`check_against_python` under the bounds above; SystemExit naming ``where`` when the backend differs.
    Returns the figure checked (float32's relative difference when it is within bounds, else the multiple)."""
    layout = dict(num_heads=num_heads, num_layers=num_layers, bidirectional=bidirectional)
    err = check_against_python(T, B, I, H, device, dtype, backend, cell, **layout)
    if dtype == torch.float32 and err < FLOAT32_DIFFERENCE:
        return err
    multiple = err if dtype != torch.float32 else check_against_python(T, B, I, H, device, dtype, backend, cell,
                                                                       against_float64=True, **layout)
    if not multiple <= ERROR_MULTIPLE:
        first = f"relative difference {err:.2e}, then " if dtype == torch.float32 else ""
        raise SystemExit(f"lltm-bench: {backend} differs from python on {where} ({cell.name}, {str(dtype)[6:]}): "
                         f"{first}error against float64 {multiple:.2f}x python's > {ERROR_MULTIPLE:g}x")
    return multiple


def peak_memory_mib(fn: Callable[[], None], device) -> float:
    """Peak CUDA memory one call of fn allocates beyond what was allocated before it, MiB."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def compiled_backend(device: torch.device) -> str:
    """The fused backend for the device (cpp or cuda); exits with the reason when it is not built here."""
    backend = resolve_backend("auto", device.type)
    if backend == "python":
        raise SystemExit(f"lltm-bench: the compiled backend for {device.type} is not available here")
    return backend


def describe_machine(device: torch.device, dtype: str, repeats: int) -> dict:
    """The versions, the CPU, the threads and the device a run was measured on, with its dtype and repeats."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu, "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": dtype,
            "repeats": repeats}
