"""The LLTM in plain PyTorch: the ``python`` backend, and the oracle every other backend is tested against.

Math (PyTorch's "Custom C++ and CUDA Extensions" tutorial; weights split as in ``torch.nn.LSTM``)::

    gates = x @ weight_ih.T + h @ weight_hh.T + bias        # (B, 3H): input, output, candidate
    i, o, z = sigmoid(gates[:, :H]), sigmoid(gates[:, H:2H]), elu(gates[:, 2H:])
    c' = c + i * z          # no forget gate: the cell accumulates
    h' = tanh(c') * o

Autograd differentiates these functions; they run on any device and dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _pointwise(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    i, o, z = gates.chunk(3, dim=1)
    c_new = c + torch.sigmoid(i) * F.elu(z)
    return torch.tanh(c_new) * torch.sigmoid(o), c_new


def lltm_cell(
    input: Tensor, h: Tensor, c: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One step: input (B, I), h and c (B, H) -> (h_1, c_1), each (B, H)."""
    gates = torch.addmm(F.linear(input, weight_ih, bias), h, weight_hh.t())
    return _pointwise(gates, c)


def lltm_layer(
    input: Tensor, h: Tensor, c: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """A whole sequence: input (T, B, I) -> (output (T, B, H), h_n (B, H), c_n (B, H)).

    The input projection of all T steps is one GEMM, hoisted out of the time loop.
    """
    projected = F.linear(input, weight_ih, bias)
    outputs = []
    for t in range(input.shape[0]):
        h, c = _pointwise(torch.addmm(projected[t], h, weight_hh.t()), c)
        outputs.append(h)
    return torch.stack(outputs), h, c
