"""Fake kernels of the ``torch.ops.lltm`` ops: what each returns, for torch.compile and torch.export.

One pair per cell, made from its :class:`~lltm_train.ops.cells.CellSpec`. The C++ kernels are the
authority on arguments (csrc/lltm.cpp) and the autograd formulas are in C++ (csrc/lltm_autograd.cpp);
these only state the output shapes. They check the shapes they read, and that the tensors share a device:
the dispatcher sends a call that mixes meta and real tensors here, which would otherwise hand back
uninitialised outputs. ``lengths`` lives on the CPU whatever the device.

Argument order, for a cell with op states S (h, or h and c; the sLSTM's c packs c, n and m: (B, 3 H)) and biases P (bias, or bias_ih and bias_hh):
forward ``(input, *S_0, weight_ih, weight_hh, *P, lengths, save=True, zoneout=None, num_heads=1) -> (output, *S_n,
[cells], activations)``, where save=False (nothing kept for a backward) gives cells and activations of shape (0,);
backward ``(grad_output, *grad_S_n, input, h0, [c0], weight_ih, weight_hh, output, [cells], activations,
lengths, zoneout=None, num_heads=1, input_grad=True) -> (grad_input, *grad_S_0, grad_weight_ih, grad_weight_hh,
*grad_P)`` (c0 and cells for the cells with a c state). ``zoneout``: (T, B, len(S) * H) factors, or None;
``num_heads``: weight_hh holds the heads' blocks (G H, H / num_heads); ``input_grad=False``: grad_input is not
computed and comes back as (0,) (csrc/lltm.h).
"""

from __future__ import annotations

import torch

from .cells import CELLS, CellSpec

_done = False


def _one_device(op: str, *tensors) -> None:
    devices = {t.device for t in tensors if t is not None}
    torch._check(len(devices) == 1, lambda: f"{op}: all tensors must be on one device, got {sorted(map(str, devices))}")


def _lengths_on_cpu(op: str, lengths, input) -> None:
    if lengths is not None:
        torch._check(lengths.device.type == "cpu" or input.device.type == "meta",
                     lambda: f"{op}: expected lengths as an int64 tensor on the CPU, got one on {lengths.device}")


def _check_heads(op: str, spec: CellSpec, weight_hh, h0, num_heads) -> int:
    """The hidden size, after the checks the C++ op makes of num_heads and the heads' weight_hh (G H, H / num_heads)."""
    torch._check(num_heads >= 1, lambda: f"{op}: num_heads must be at least 1, got {num_heads}")
    torch._check(weight_hh.dim() == 2 and h0.dim() == 2,
                 lambda: f"{op}: expected weight_hh of shape ({spec.num_gates} * hidden_size, hidden_size / num_heads) "
                         "and h0 of shape (B, hidden_size)")
    H = weight_hh.shape[1] * num_heads
    torch._check(weight_hh.shape[0] == spec.num_gates * H and h0.shape[1] == H,
                 lambda: f"{op}: expected weight_hh of shape ({spec.num_gates} * hidden_size, hidden_size / {num_heads}) "
                         f"and h0 of shape (B, hidden_size), got {tuple(weight_hh.shape)} and {tuple(h0.shape)}")
    return H


def _forward_fake(spec: CellSpec):
    op = f"lltm.{spec.forward_op}"
    n, C = spec.op_states, spec.cell_blocks

    def fake(input, *args, save=True, zoneout=None, num_heads=1):
        states, (weight_ih, weight_hh), rest = args[:n], args[n:n + 2], args[n + 2:n + 3 + len(spec.biases)]
        biases, lengths = rest[:-1], rest[-1]
        extra = args[n + 3 + len(spec.biases):]  # save, zoneout and num_heads, when given by position
        save = extra[0] if len(extra) > 0 else save
        zoneout = extra[1] if len(extra) > 1 else zoneout
        num_heads = extra[2] if len(extra) > 2 else num_heads
        _one_device(op, input, *states, weight_ih, weight_hh, *biases, zoneout)
        _lengths_on_cpu(op, lengths, input)
        torch._check(input.dim() == 3, lambda: f"{op}: expected input of shape (T, B, input_size), got {tuple(input.shape)}")
        T, B, _ = input.shape
        H = _check_heads(op, spec, weight_hh, states[0], num_heads)
        torch._check(spec.zoneout or zoneout is None, lambda: f"{op}: the {spec.name} cell takes no zoneout")
        torch._check(zoneout is None or tuple(zoneout.shape) == (T, B, n * H),
                     lambda: f"{op}: expected zoneout of shape (T, B, {n} * hidden_size) = {(T, B, n * H)}")
        saved = ((T, B, C * H), (T, B, spec.saved * H)) if save else ((0,), (0,))  # save=False keeps nothing
        cells = (input.new_empty(saved[0]),) if spec.has_cell_state else ()
        return (input.new_empty(T, B, H), *(input.new_empty(B, H * (1 if k == 0 else C)) for k in range(n)), *cells,
                input.new_empty(saved[1]))

    return fake


def _backward_fake(spec: CellSpec):
    op = f"lltm.{spec.backward_op}"
    n = spec.op_states

    def fake(*args, zoneout=None, num_heads=1, input_grad=True):
        grads, (input, h0), rest = args[:n + 1], args[n + 1:n + 3], args[n + 3:]
        c0 = rest[:n - 1]  # the cells with a c state take c0
        rest = rest[n - 1:]
        saved_count = 2 + n  # output, [cells], activations
        weight_ih, weight_hh, saved, lengths = rest[0], rest[1], rest[2:2 + saved_count - 1], rest[1 + saved_count]
        if len(rest) > 2 + saved_count:
            zoneout = rest[2 + saved_count]
        if len(rest) > 3 + saved_count:
            num_heads = rest[3 + saved_count]
        if len(rest) > 4 + saved_count:
            input_grad = rest[4 + saved_count]
        _one_device(op, *grads, input, h0, *c0, weight_ih, weight_hh, *saved, zoneout)
        _lengths_on_cpu(op, lengths, input)
        torch._check(input.dim() == 3 and h0.dim() == 2, lambda: f"{op}: expected input (T, B, input_size) and h0 (B, H)")
        _check_heads(op, spec, weight_hh, h0, num_heads)
        grad_input = torch.empty_like(input) if input_grad else input.new_empty(0)  # input_grad=False: (0,)
        return (grad_input, torch.empty_like(h0), *(torch.empty_like(c) for c in c0), torch.empty_like(weight_ih),
                torch.empty_like(weight_hh), *(weight_hh.new_empty(weight_hh.shape[0]) for _ in spec.biases))

    return fake


def register() -> None:
    """Registers the fake kernels once; called by the loader right after the library is loaded."""
    global _done
    if _done:
        return
    for spec in CELLS.values():
        torch.library.register_fake(f"lltm::{spec.forward_op}")(_forward_fake(spec))
        torch.library.register_fake(f"lltm::{spec.backward_op}")(_backward_fake(spec))
    torch.library.register_fake("lltm::check_state")(_check_state_fake)
    _done = True


def _check_state_fake(state, tokens, num_layers, hidden_size, name):
    torch._check(state.dim() == 3 and state.shape[0] == num_layers and state.shape[2] == hidden_size,
                 lambda: f"the exported model's state {name}: expected shape (num_layers, B, hidden_size) = "
                         f"({num_layers}, B, {hidden_size}), got {tuple(state.shape)}")
    return state.new_empty((num_layers, tokens.shape[1], hidden_size))
