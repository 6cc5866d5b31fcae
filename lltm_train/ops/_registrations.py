"""Fake (meta) kernels and autograd formulas of the ``torch.ops.lltm`` ops.

The fake kernels give ``torch.compile`` and ``torch.export`` the output shapes; the autograd formulas
route the backward of each forward op through its registered backward op, so compiled graphs see
through both.
"""

from __future__ import annotations

import torch
from torch import Tensor

_done = False


def _check_fake(op: str, tensors: dict, shapes: dict) -> None:
    """The C++ kernels' argument checks, for fake tensors: one dtype and device, the expected shapes."""
    ref = tensors["input"]
    torch._check(ref.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64),
                 lambda: f"{op}: expected a floating-point input, got {ref.dtype}")
    for name, t in tensors.items():
        torch._check(t.dtype == ref.dtype, lambda: f"{op}: {name} has dtype {t.dtype} but input has dtype {ref.dtype}")
        torch._check(t.device == ref.device, lambda: f"{op}: {name} is on {t.device} but input is on {ref.device}")
    for name, shape in shapes.items():
        t = tensors[name]
        torch._check(t.dim() == len(shape), lambda: f"{op}: expected {name} with {len(shape)} dimensions, got {tuple(t.shape)}")
        for have, want in zip(t.shape, shape):
            torch._check(have == want, lambda: f"{op}: expected {name} of shape {tuple(shape)}, got {tuple(t.shape)}")


def _sizes(op: str, input, weight_hh, sequence: bool):
    torch._check(input.dim() == (3 if sequence else 2), lambda: f"{op}: expected input with {3 if sequence else 2} dimensions")
    torch._check(weight_hh.dim() == 2, lambda: f"{op}: expected weight_hh of shape (3 * hidden_size, hidden_size)")
    if sequence:
        torch._check(input.shape[0] >= 1, lambda: f"{op}: expected a sequence of length T >= 1")
    return input.shape[-2], input.shape[-1], weight_hh.shape[1]


def _forward_shapes(input, weight_hh, sequence, op):
    B, I, H = _sizes(op, input, weight_hh, sequence)
    return B, I, H, {"weight_ih": (3 * H, I), "weight_hh": (3 * H, H)}


def _fake_cell_forward(input, h, c, weight_ih, weight_hh, bias):
    op = "lltm.cell_forward"
    B, I, H, shapes = _forward_shapes(input, weight_hh, False, op)
    tensors = {"input": input, "h": h, "c": c, "weight_ih": weight_ih, "weight_hh": weight_hh}
    if bias is not None:
        tensors["bias"], shapes["bias"] = bias, (3 * H,)
    _check_fake(op, tensors, {**shapes, "h": (B, H), "c": (B, H)})
    return input.new_empty(B, H), input.new_empty(B, H), input.new_empty(B, 3 * H)


def _fake_cell_backward(grad_h_new, grad_c_new, input, h, weight_ih, weight_hh, c_new, gates):
    op = "lltm.cell_backward"
    B, I, H, shapes = _forward_shapes(input, weight_hh, False, op)
    tensors = {"input": input, "h": h, "c_new": c_new, "gates": gates, "grad_h": grad_h_new, "grad_c": grad_c_new,
               "weight_ih": weight_ih, "weight_hh": weight_hh}
    _check_fake(op, tensors, {**shapes, "h": (B, H), "c_new": (B, H), "gates": (B, 3 * H), "grad_h": (B, H), "grad_c": (B, H)})
    return (input.new_empty(B, I), h.new_empty(B, H), h.new_empty(B, H), weight_ih.new_empty(3 * H, I),
            weight_hh.new_empty(3 * H, H), weight_hh.new_empty(3 * H))


def _fake_layer_forward(input, h0, c0, weight_ih, weight_hh, bias):
    op = "lltm.layer_forward"
    B, I, H, shapes = _forward_shapes(input, weight_hh, True, op)
    T = input.shape[0]
    tensors = {"input": input, "h0": h0, "c0": c0, "weight_ih": weight_ih, "weight_hh": weight_hh}
    if bias is not None:
        tensors["bias"], shapes["bias"] = bias, (3 * H,)
    _check_fake(op, tensors, {**shapes, "h0": (B, H), "c0": (B, H)})
    return (input.new_empty(T, B, H), input.new_empty(B, H), input.new_empty(B, H), input.new_empty(T, B, H),
            input.new_empty(T, B, 3 * H))


def _fake_layer_backward(grad_output, grad_h_n, grad_c_n, input, h0, weight_ih, weight_hh, output, cells, gates):
    op = "lltm.layer_backward"
    B, I, H, shapes = _forward_shapes(input, weight_hh, True, op)
    T = input.shape[0]
    tensors = {"input": input, "h0": h0, "weight_ih": weight_ih, "weight_hh": weight_hh, "output": output, "cells": cells,
               "gates": gates, "grad_output": grad_output, "grad_h_n": grad_h_n, "grad_c_n": grad_c_n}
    _check_fake(op, tensors, {**shapes, "h0": (B, H), "output": (T, B, H), "cells": (T, B, H), "gates": (T, B, 3 * H),
                              "grad_output": (T, B, H), "grad_h_n": (B, H), "grad_c_n": (B, H)})
    return (input.new_empty(T, B, I), h0.new_empty(B, H), h0.new_empty(B, H), weight_ih.new_empty(3 * H, I),
            weight_hh.new_empty(3 * H, H), weight_hh.new_empty(3 * H))


def _zeros_if_none(grad: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if grad is None else grad


def _setup_cell(ctx, inputs, output):
    input, h, c, weight_ih, weight_hh, bias = inputs
    h_new, c_new, gates = output
    ctx.save_for_backward(input, h, weight_ih, weight_hh, c_new, gates)
    ctx.has_bias = bias is not None
    ctx.mark_non_differentiable(gates)
    ctx.set_materialize_grads(False)


def _backward_cell(ctx, grad_h_new, grad_c_new, _grad_gates):
    input, h, weight_ih, weight_hh, c_new, gates = ctx.saved_tensors
    grads = torch.ops.lltm.cell_backward(
        _zeros_if_none(grad_h_new, c_new),
        _zeros_if_none(grad_c_new, c_new),
        input,
        h,
        weight_ih,
        weight_hh,
        c_new,
        gates,
    )
    return *grads[:5], (grads[5] if ctx.has_bias else None)


def _setup_layer(ctx, inputs, output):
    input, h0, c0, weight_ih, weight_hh, bias = inputs
    out, h_n, c_n, cells, gates = output
    ctx.save_for_backward(input, h0, weight_ih, weight_hh, out, cells, gates)
    ctx.has_bias = bias is not None
    ctx.mark_non_differentiable(cells, gates)
    ctx.set_materialize_grads(False)


def _backward_layer(ctx, grad_output, grad_h_n, grad_c_n, _grad_cells, _grad_gates):
    input, h0, weight_ih, weight_hh, out, cells, gates = ctx.saved_tensors
    grads = torch.ops.lltm.layer_backward(
        _zeros_if_none(grad_output, out),
        _zeros_if_none(grad_h_n, h0),
        _zeros_if_none(grad_c_n, h0),
        input,
        h0,
        weight_ih,
        weight_hh,
        out,
        cells,
        gates,
    )
    return *grads[:5], (grads[5] if ctx.has_bias else None)


def _setup_nothing(ctx, inputs, output):
    pass


def _no_double_backward(ctx, *grads):
    raise NotImplementedError(
        "the cpp and cuda LLTM backends have no second derivative (double backward, create_graph=True, Hessians); "
        "use backend='python' for those"
    )


def register() -> None:
    """Registers everything once; called by the loader right after the library is loaded."""
    global _done
    if _done:
        return
    lib = torch.library
    lib.register_fake("lltm::cell_forward")(_fake_cell_forward)
    lib.register_fake("lltm::cell_backward")(_fake_cell_backward)
    lib.register_fake("lltm::layer_forward")(_fake_layer_forward)
    lib.register_fake("lltm::layer_backward")(_fake_layer_backward)
    lib.register_autograd("lltm::cell_forward", _backward_cell, setup_context=_setup_cell)
    lib.register_autograd("lltm::layer_forward", _backward_layer, setup_context=_setup_layer)
    # A backward op reached by autograd means a second derivative was asked for: say it is not supported
    # rather than let autograd treat its outputs as constants (a silent zero).
    lib.register_autograd("lltm::cell_backward", _no_double_backward, setup_context=_setup_nothing)
    lib.register_autograd("lltm::layer_backward", _no_double_backward, setup_context=_setup_nothing)
    _done = True
