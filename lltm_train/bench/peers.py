"""The other fused-RNN library as a contender of ``lltm-bench``, where it is installed: FlashRNN (NX-AI, the kernels
behind xLSTM; PyPI ``flashrnn``, Apache-2.0; Pöppel, Beck & Hochreiter 2024, "FlashRNN: I/O-Aware Optimization of
Traditional RNNs on modern hardware").

FlashRNN runs the recurrence alone: it takes the input projection as given (``Wx`` (B, T, G, NH, DH)), with a
block-diagonal recurrent matrix of NH heads (``R`` (G, NH, DH, DH), row by output unit, the layout of
:func:`lltm_train.functional.dense_weight_hh`: ``R.reshape(G * H, DH)`` is our ``weight_hh``) and a bias
(G, NH, DH). So it is timed without an input projection, forward + backward of its output, against our layers
with theirs: the comparison is in its favour. On a GPU its ``cuda_fused`` kernels (LSTM and sLSTM; the others
fall back to its alternating ``cuda`` kernels), on a CPU its PyTorch ``vanilla`` loop. Each (cell, sizes, dtype)
compiles its own CUDA kernels at the first call (30-90 s on an H200), which the warm-up absorbs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from ..ops.cells import CellSpec

FUNCTIONS = {"lstm": "lstm", "gru": "gru", "rnn": "elman", "slstm": "slstm"}  # our cell -> FlashRNN's function of the same math
FUSED = ("lstm", "slstm")  # FlashRNN's functions with a cuda_fused kernel


def installed() -> bool:
    return importlib.util.find_spec("flashrnn") is not None


def flashrnn_backend(function: str, device: torch.device) -> str:
    if device.type != "cuda":
        return "vanilla"
    return "cuda_fused" if function in FUSED else "cuda"


def flashrnn_contender(cell: CellSpec, T: int, B: int, H: int, num_heads: int, device: torch.device,
                       dtype: torch.dtype) -> tuple[str, Callable[[], None]] | None:
    """(label, fn) running FlashRNN's layer of the same cell, forward + backward on fresh random inputs; None when
    FlashRNN is not installed or has no such cell (our LLTM, the ReLU RNN; its sLSTM is ours with the sigmoid forget gate)."""
    function = FUNCTIONS.get(cell.name)
    if function is None or not installed():
        return None
    from flashrnn import flashrnn  # noqa: PLC0415 - optional

    G, DH = cell.num_gates, H // num_heads
    kw = dict(device=device, dtype=dtype)
    wx = torch.randn(B, T, G, num_heads, DH, **kw).requires_grad_()
    r = (torch.randn(G, num_heads, DH, DH, **kw) * DH**-0.5).requires_grad_()
    gates_t = 4 if function == "gru" else G  # its GRU keeps the h-side bias of the candidate apart: 4 bias blocks
    b = (torch.randn(gates_t, num_heads, DH, **kw) * 0.1).requires_grad_()
    backend = flashrnn_backend(function, device)
    grad = torch.randn(B, T, num_heads, DH, **kw)

    def run():
        h, _ = flashrnn(wx, r, b, function=function, backend=backend, dtype=str(dtype).removeprefix("torch."))
        h[0].backward(grad)  # the outputs (h at every step; states 1.. are c and the others)

    return f"FlashRNN {backend}", run


def try_contender(fn: Callable[[], None]) -> str | None:
    """Runs fn once; the reason it failed (FlashRNN's kernels do not build or refuse the sizes), or None."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - an optional peer: its failure is reported, not fatal
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None
