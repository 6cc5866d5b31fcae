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


def layer_forward(input: Tensor, h: Tensor, c: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias: Tensor | None,
                  lengths: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """A whole sequence, as ``torch.ops.lltm.layer_forward`` computes it.

    input (T, B, I); h, c (B, H); lengths (B,) int64 or None (every row runs all T steps; otherwise row b
    stops after lengths[b] steps: its state stays and its later outputs are zero). Returns
    (output (T, B, H), h_n (B, H), c_n (B, H)). The input projection of all T steps is one GEMM.
    """
    projected = F.linear(input, weight_ih, bias)
    outputs = []
    for t in range(input.shape[0]):
        i, o, z = torch.addmm(projected[t], h, weight_hh.t()).chunk(3, dim=1)
        c_new = c + torch.sigmoid(i) * F.elu(z)
        h_new = torch.tanh(c_new) * torch.sigmoid(o)
        if lengths is None:
            h, c = h_new, c_new
            outputs.append(h)
        else:
            running = (t < lengths).to(input.device)[:, None]
            h, c = torch.where(running, h_new, h), torch.where(running, c_new, c)
            outputs.append(torch.where(running, h_new, torch.zeros_like(h_new)))
    return torch.stack(outputs), h, c
