"""Functional LLTM: a whole sequence (:func:`lltm_layer`) and one step (:func:`lltm_cell`, a layer with T = 1).

This module is the authority on the arguments of the Python API: TypeError or ValueError with the
argument's name. For the compiled backends the op's own C++ checks run first, and the Python ones only
when the op refuses its arguments, so a valid call pays for one set of checks.

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


def _state_or_zeros(op: str, hx, input, weight_hh, batch_dim: int) -> tuple[Tensor, Tensor]:
    """(h_0, c_0) from ``hx``, or zeros of the right shape when it is None."""
    for name, t in (("input", input), ("weight_hh", weight_hh)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if hx is None:
        if weight_hh.dim() != 2:
            raise ValueError(f"{op}: expected weight_hh of shape (3 * hidden_size, hidden_size), got {tuple(weight_hh.shape)}")
        if input.dim() <= batch_dim:
            raise ValueError(f"{op}: expected input with a batch dimension at {batch_dim}, got {tuple(input.shape)}")
        zeros = input.new_zeros(input.shape[batch_dim], weight_hh.shape[-1])
        return zeros, zeros
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise TypeError(f"{op}: hx must be a tuple (h, c) of two tensors or None, got {type(hx).__name__}")
    return hx[0], hx[1]


def _check(op: str, layout: str, input, h, c, weight_ih, weight_hh, bias) -> None:
    named = {"input": input, "h": h, "c": c, "weight_ih": weight_ih, "weight_hh": weight_hh, "bias": bias}
    for name, t in named.items():
        if not isinstance(t, Tensor) and not (name == "bias" and t is None):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if input.dtype not in _DTYPES:
        raise TypeError(f"{op}: expected a floating-point input (float16, bfloat16, float32, float64), got {input.dtype}")
    for name, t in named.items():
        if t is None:
            continue
        if t.dtype != input.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but input has {input.dtype}; all tensors must share one dtype")
        if t.device != input.device:
            raise ValueError(f"{op}: {name} is on {t.device} but input is on {input.device}; all tensors must be on one device")
    if input.dim() != 3:
        raise ValueError(f"{op}: expected input of shape {layout}, got {tuple(input.shape)}")
    if weight_hh.dim() != 2 or weight_hh.shape[0] != 3 * weight_hh.shape[1]:
        raise ValueError(f"{op}: expected weight_hh of shape (3 * hidden_size, hidden_size), got {tuple(weight_hh.shape)}")
    if input.shape[0] == 0:
        raise ValueError(f"{op}: expected a sequence of length T >= 1, got input of shape {tuple(input.shape)}")
    H, I, B = weight_hh.shape[1], input.shape[-1], input.shape[1]
    for name, shape in (("weight_ih", (3 * H, I)), ("h", (B, H)), ("c", (B, H)), ("bias", (3 * H,))):
        if named[name] is not None and named[name].shape != shape:
            raise ValueError(f"{op}: expected {name} of shape {shape} for input {tuple(input.shape)} and hidden_size "
                             f"{H}, got {tuple(named[name].shape)}")


def _check_lengths(op: str, lengths, T: int, B: int) -> None:
    if not isinstance(lengths, Tensor) or lengths.dtype != torch.int64 or lengths.device.type != "cpu" \
            or lengths.shape != (B,):
        got = f"{lengths.dtype} {tuple(lengths.shape)} on {lengths.device}" if isinstance(lengths, Tensor) else type(lengths).__name__
        raise ValueError(f"{op}: lengths must be an int64 CPU tensor of shape ({B},), got {got}")
    # The values are read only outside torch.compile (data-dependent there); the op checks them anyway.
    if B and not torch.compiler.is_compiling() and not (0 <= int(lengths.min()) and int(lengths.max()) <= T):
        raise ValueError(f"{op}: every length must be in [0, T = {T}], got {lengths.min()} to {lengths.max()}")


def _uses_compiled(op: str, backend: str, device_type: str, tensors: tuple) -> bool:
    """True when ``backend`` means a compiled op for these tensors (False: the python reference)."""
    if resolve_backend(backend, device_type) == "python":
        return False
    # The compiled ops have no forward-mode derivative. Tangents exist only inside a dual level
    # (torch.func.jvp, torch.autograd.forward_ad), so the common case costs one comparison.
    if fwAD._current_level >= 0 and not torch.compiler.is_compiling():
        if any(isinstance(t, Tensor) and fwAD.unpack_dual(t).tangent is not None for t in tensors):
            raise NotImplementedError(f"{op}: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) is not "
                                      "supported by the cpp and cuda backends; use backend='python'")
    return True


def _layer(op: str, layout: str, input, h, c, weight_ih, weight_hh, bias, lengths, backend):
    tensors = _autocast(input.device.type, (input, h, c, weight_ih, weight_hh, bias))
    if lengths is not None:
        _check_lengths(op, lengths, input.shape[0], input.shape[1] if input.dim() > 1 else 0)
    if _uses_compiled(op, backend, input.device.type, tensors):
        # The op checks every argument itself (in C++, for nothing on the common path); when it refuses
        # them, the Python checks say what is wrong in this API's terms (TypeError, ValueError, names).
        try:
            output, h_n, c_n, _, _ = torch.ops.lltm.layer_forward(*tensors, lengths)
        except (RuntimeError, TypeError):
            _check(op, layout, *tensors)
            raise
        return output, h_n, c_n
    _check(op, layout, *tensors)
    return reference.layer_forward(*tensors, lengths)


def lltm_layer(
    input: Tensor,
    hx: tuple[Tensor, Tensor] | None,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias: Tensor | None = None,
    *,
    lengths: Tensor | None = None,
    backend: str = "auto",
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One LLTM layer, one direction, over a whole sequence (the time loop runs inside the backend).

    Args:
        input: (T, B, input_size), time-major, T >= 1; B may be 0 (empty outputs). Floating point
            (float16, bfloat16, float32, float64).
        hx: ``(h_0, c_0)``, each (B, hidden_size), or None for zeros.
        weight_ih: (3 * hidden_size, input_size). weight_hh: (3 * hidden_size, hidden_size).
        bias: (3 * hidden_size,) or None.
        lengths: None, or (B,) int64 on the CPU with values in [0, T]: row b runs lengths[b] steps, then
            keeps its state and outputs zeros (padded batches; one kernel call whatever the lengths). The
            padding itself must be finite (zeros, as ``pad_packed_sequence`` gives): it does not change the
            outputs, but 0 x NaN is NaN in the weight gradients.
        backend: ``"auto"``, ``"python"``, ``"cpp"`` or ``"cuda"`` (see :mod:`lltm_train.backends`).

    Returns:
        ``(output, (h_n, c_n))``: output (T, B, hidden_size) holds h_1..h_T; h_n and c_n (B, hidden_size)
        hold each row's state after its last step. Dtype and device of ``input``.

    Raises:
        TypeError: a non-tensor argument, an integer input, or mixed dtypes.
        ValueError: wrong shapes, T = 0, bad lengths, mixed devices, an unknown backend or one for
            another device.
        RuntimeError: the backend asked for is not built or usable here.
        NotImplementedError: forward-mode AD or a second derivative with the cpp or cuda backend.
    """
    h, c = _state_or_zeros("lltm_layer", hx, input, weight_hh, 1)
    output, h_n, c_n = _layer("lltm_layer", "(T, B, input_size)", input, h, c, weight_ih, weight_hh, bias, lengths,
                              backend)
    return output, (h_n, c_n)


def lltm_cell(
    input: Tensor,
    hx: tuple[Tensor, Tensor] | None,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias: Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """One LLTM step: :func:`lltm_layer` over a sequence of length 1.

    Args:
        input: (B, input_size). hx: ``(h_0, c_0)``, each (B, hidden_size), or None for zeros.
        weight_ih, weight_hh, bias, backend: as in :func:`lltm_layer`.

    Returns:
        ``(h_1, c_1)``, each (B, hidden_size), dtype and device of ``input``.

    Raises:
        As :func:`lltm_layer`.
    """
    h, c = _state_or_zeros("lltm_cell", hx, input, weight_hh, 0)
    if not isinstance(input, Tensor) or input.dim() != 2:
        got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise ValueError(f"lltm_cell: expected input of shape (B, input_size), got {got}")
    _, h_1, c_1 = _layer("lltm_cell", "(B, input_size)", input.unsqueeze(0), h, c, weight_ih, weight_hh, bias, None,
                         backend)
    return h_1, c_1
