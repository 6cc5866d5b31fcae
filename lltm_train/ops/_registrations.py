"""Fake kernels of the ``torch.ops.lltm`` ops: what each returns, for torch.compile and torch.export.

The C++ kernels are the authority on arguments (csrc/lltm.cpp) and the autograd formulas are in C++
(csrc/lltm_autograd.cpp); these only state the output shapes. They check the shapes they read, and that
the tensors share a device: the dispatcher sends a call that mixes meta and real tensors here, which
would otherwise hand back uninitialised outputs. ``lengths`` lives on the CPU whatever the device.
"""

from __future__ import annotations

import torch

_done = False


def _one_device(op: str, *tensors) -> None:
    devices = {t.device for t in tensors if t is not None}
    torch._check(len(devices) == 1, lambda: f"{op}: all tensors must be on one device, got {sorted(map(str, devices))}")


def _lengths_on_cpu(op: str, lengths, input) -> None:
    if lengths is not None:
        torch._check(lengths.device.type == "cpu" or input.device.type == "meta",
                     lambda: f"{op}: expected lengths as an int64 tensor on the CPU, got one on {lengths.device}")


def _fake_layer_forward(input, h0, c0, weight_ih, weight_hh, bias, lengths):
    op = "lltm.layer_forward"
    _one_device(op, input, h0, c0, weight_ih, weight_hh, bias)
    _lengths_on_cpu(op, lengths, input)
    torch._check(input.dim() == 3, lambda: f"{op}: expected input of shape (T, B, input_size), got {tuple(input.shape)}")
    torch._check(weight_hh.dim() == 2, lambda: f"{op}: expected weight_hh of shape (3 * hidden_size, hidden_size)")
    T, B, _ = input.shape
    H = weight_hh.shape[1]
    return (input.new_empty(T, B, H), input.new_empty(B, H), input.new_empty(B, H), input.new_empty(T, B, H),
            input.new_empty(T, B, 3 * H))


def _fake_layer_backward(grad_output, grad_h_n, grad_c_n, input, h0, weight_ih, weight_hh, output, cells, activations,
                         lengths):
    op = "lltm.layer_backward"
    _one_device(op, grad_output, grad_h_n, grad_c_n, input, h0, weight_ih, weight_hh, output, cells, activations)
    _lengths_on_cpu(op, lengths, input)
    torch._check(input.dim() == 3 and h0.dim() == 2, lambda: f"{op}: expected input (T, B, input_size) and h0 (B, H)")
    return (torch.empty_like(input), torch.empty_like(h0), torch.empty_like(h0), torch.empty_like(weight_ih),
            torch.empty_like(weight_hh), weight_hh.new_empty(weight_hh.shape[0]))


def register() -> None:
    """Registers the fake kernels once; called by the loader right after the library is loaded."""
    global _done
    if _done:
        return
    torch.library.register_fake("lltm::layer_forward")(_fake_layer_forward)
    torch.library.register_fake("lltm::layer_backward")(_fake_layer_backward)
    _done = True
