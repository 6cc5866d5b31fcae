"""Functional LLTM: one step (:func:`lltm_cell`) and one whole sequence (:func:`lltm_layer`).

Parameters follow ``torch.nn.LSTM``'s layout with three gates instead of four: ``weight_ih`` (3H, I),
``weight_hh`` (3H, H), ``bias`` (3H), gate order (input, output, candidate). The tutorial's single weight
(3H, H + I) over ``cat([h, x])`` equals ``cat([weight_hh, weight_ih], 1)``.
See :mod:`lltm_train.ops.reference` for the formulas and :mod:`lltm_train.backends` for ``backend``.

Under ``torch.autocast`` every floating tensor is cast to the autocast dtype of the input's device, so
``bf16-mixed`` training runs the kernels in bfloat16 (with float32 arithmetic inside).
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .backends import resolve_backend
from .ops import reference

__all__ = ["lltm_cell", "lltm_layer"]


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")  # asked by name: older dynamo cannot trace the check


def _autocast(device_type: str, tensors: tuple) -> tuple:
    if device_type not in _AUTOCAST_DEVICES or not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if isinstance(t, Tensor) and t.is_floating_point() else t for t in tensors)


def _check(op: str, sequence: bool, input, h, c, weight_ih, weight_hh, bias) -> None:
    layout = "(T, B, input_size)" if sequence else "(B, input_size)"
    named = {"input": input, "h": h, "c": c, "weight_ih": weight_ih, "weight_hh": weight_hh}
    if bias is not None:
        named["bias"] = bias
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if input.dtype not in _DTYPES:
        raise TypeError(f"{op}: expected a floating-point input (float16, bfloat16, float32, float64), got {input.dtype}")
    for name, t in named.items():
        if t.dtype != input.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but input has {input.dtype}; all tensors must share one dtype")
        if t.device != input.device:
            raise ValueError(f"{op}: {name} is on {t.device} but input is on {input.device}; all tensors must be on one device")
    if input.dim() != (3 if sequence else 2):
        raise ValueError(f"{op}: expected input of shape {layout}, got {tuple(input.shape)}")
    if weight_hh.dim() != 2 or weight_hh.shape[0] != 3 * weight_hh.shape[1]:
        raise ValueError(f"{op}: expected weight_hh of shape (3 * hidden_size, hidden_size), got {tuple(weight_hh.shape)}")
    H, I, B = weight_hh.shape[1], input.shape[-1], input.shape[-2]
    if sequence and input.shape[0] == 0:
        raise ValueError(f"{op}: expected a sequence of length T >= 1, got input of shape {tuple(input.shape)}")
    expected = {"weight_ih": (3 * H, I), "h": (B, H), "c": (B, H), "bias": (3 * H,)}
    for name, shape in expected.items():
        if name in named and tuple(named[name].shape) != shape:
            raise ValueError(
                f"{op}: expected {name} of shape {shape} for input {tuple(input.shape)} and hidden_size {H}, "
                f"got {tuple(named[name].shape)}"
            )


def _state(op: str, hx, input: Tensor, weight_hh: Tensor, batch_dim: int) -> tuple[Tensor, Tensor]:
    for name, t in (("input", input), ("weight_hh", weight_hh)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if weight_hh.dim() != 2:
        raise ValueError(f"{op}: expected weight_hh of shape (3 * hidden_size, hidden_size), got {tuple(weight_hh.shape)}")
    if hx is None:
        if input.dim() <= batch_dim:
            raise ValueError(f"{op}: expected input with a batch dimension at {batch_dim}, got {tuple(input.shape)}")
        zeros = input.new_zeros(input.shape[batch_dim], weight_hh.shape[-1])
        return zeros, zeros
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise TypeError(f"{op}: hx must be a tuple (h, c) of two tensors or None, got {type(hx).__name__}")
    return hx[0], hx[1]


def _no_forward_ad(op: str, tensors: tuple) -> None:
    # The compiled ops have no forward-mode derivative, and PyTorch would drop the tangents silently.
    if torch.compiler.is_compiling():
        return
    if any(isinstance(t, Tensor) and fwAD.unpack_dual(t).tangent is not None for t in tensors):
        raise NotImplementedError(
            f"{op}: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) is not supported by the cpp and "
            "cuda backends; use backend='python'"
        )


def _run_compiled(op: str, backend: str, device_type: str, tensors: tuple) -> bool:
    """True when the compiled op runs (else the python reference does); checks what it cannot do."""
    if resolve_backend(backend, device_type) == "python":
        return False
    _no_forward_ad(op, tensors)
    return True


def lltm_cell(
    input: Tensor,
    hx: tuple[Tensor, Tensor] | None,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias: Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """One LLTM step.

    Args:
        input: (B, input_size), floating point (float16, bfloat16, float32, float64).
        hx: ``(h_0, c_0)``, each (B, hidden_size), or None for zeros.
        weight_ih: (3 * hidden_size, input_size). weight_hh: (3 * hidden_size, hidden_size).
        bias: (3 * hidden_size,) or None.
        backend: ``"auto"``, ``"python"``, ``"cpp"`` or ``"cuda"`` (see :mod:`lltm_train.backends`).

    Returns:
        ``(h_1, c_1)``, each (B, hidden_size), dtype and device of ``input``.

    Raises:
        TypeError: a non-tensor argument, an integer input, or mixed dtypes.
        ValueError: wrong shapes, mixed devices, an unknown backend or one for another device.
        RuntimeError: the backend asked for is not built or usable here.
        NotImplementedError: forward-mode AD or a second derivative with the cpp or cuda backend.
    """
    h, c = _state("lltm_cell", hx, input, weight_hh, 0)
    input, h, c, weight_ih, weight_hh, bias = _autocast(input.device.type, (input, h, c, weight_ih, weight_hh, bias))
    _check("lltm_cell", False, input, h, c, weight_ih, weight_hh, bias)
    if not _run_compiled("lltm_cell", backend, input.device.type, (input, h, c, weight_ih, weight_hh, bias)):
        return reference.lltm_cell(input, h, c, weight_ih, weight_hh, bias)
    h_1, c_1, _ = torch.ops.lltm.cell_forward(input, h, c, weight_ih, weight_hh, bias)
    return h_1, c_1


def lltm_layer(
    input: Tensor,
    hx: tuple[Tensor, Tensor] | None,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias: Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One LLTM layer, one direction, over a whole sequence (the time loop runs inside the backend).

    Args:
        input: (T, B, input_size), time-major, T >= 1; B may be 0 (empty outputs).
        hx: ``(h_0, c_0)``, each (B, hidden_size), or None for zeros.
        weight_ih, weight_hh, bias, backend: as in :func:`lltm_cell`.

    Returns:
        ``(output, (h_n, c_n))``: output (T, B, hidden_size) holds h_1..h_T; h_n and c_n are (B, hidden_size).

    Raises:
        As :func:`lltm_cell`; also ValueError for T = 0.
    """
    h, c = _state("lltm_layer", hx, input, weight_hh, 1)
    input, h, c, weight_ih, weight_hh, bias = _autocast(input.device.type, (input, h, c, weight_ih, weight_hh, bias))
    _check("lltm_layer", True, input, h, c, weight_ih, weight_hh, bias)
    if not _run_compiled("lltm_layer", backend, input.device.type, (input, h, c, weight_ih, weight_hh, bias)):
        output, h_n, c_n = reference.lltm_layer(input, h, c, weight_ih, weight_hh, bias)
    else:
        output, h_n, c_n, _, _ = torch.ops.lltm.layer_forward(input, h, c, weight_ih, weight_hh, bias)
    return output, (h_n, c_n)
