"""Fake (meta) kernels and autograd formulas of the ``torch.ops.lltm`` ops.

The fake kernels give ``torch.compile`` and ``torch.export`` the output shapes; the autograd formulas
route the backward of each forward op through its registered backward op, so compiled graphs see
through both.
"""

from __future__ import annotations

import torch
from torch import Tensor

_done = False


def _fake_cell_forward(input, h, c, weight_ih, weight_hh, bias):
    B, H = h.shape
    return input.new_empty(B, H), input.new_empty(B, H), input.new_empty(B, 3 * H)


def _fake_cell_backward(grad_h_new, grad_c_new, input, h, weight_ih, weight_hh, c_new, gates):
    return (
        input.new_empty(input.shape),
        h.new_empty(h.shape),
        h.new_empty(h.shape),
        weight_ih.new_empty(weight_ih.shape),
        weight_hh.new_empty(weight_hh.shape),
        weight_hh.new_empty(weight_hh.shape[0]),
    )


def _fake_layer_forward(input, h0, c0, weight_ih, weight_hh, bias):
    T, B = input.shape[0], input.shape[1]
    H = weight_hh.shape[1]
    return (
        input.new_empty(T, B, H),
        input.new_empty(B, H),
        input.new_empty(B, H),
        input.new_empty(T, B, H),
        input.new_empty(T, B, 3 * H),
    )


def _fake_layer_backward(grad_output, grad_h_n, grad_c_n, input, h0, weight_ih, weight_hh, output, cells, gates):
    return (
        input.new_empty(input.shape),
        h0.new_empty(h0.shape),
        h0.new_empty(h0.shape),
        weight_ih.new_empty(weight_ih.shape),
        weight_hh.new_empty(weight_hh.shape),
        weight_hh.new_empty(weight_hh.shape[0]),
    )


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
    _done = True
