"""The cells in plain PyTorch: the ``python`` backend, and the oracle every other backend is tested against.

One step of each cell, from its pre-activations (G blocks of H each) and its state, returns the new state
(h first). For the LLTM, the LSTM and the RNN the pre-activations are one sum,
``g = x @ weight_ih.T + bias_ih + h @ weight_hh.T + bias_hh``; the GRU keeps the two sides apart,
``gx = x @ weight_ih.T + bias_ih`` and ``gh = h @ weight_hh.T + bias_hh``:

- LLTM (PyTorch's "Custom C++ and CUDA Extensions" tutorial; one bias)::

      i, o, z = sigmoid(g[:H]), sigmoid(g[H:2H]), elu(g[2H:])
      c' = c + i * z          # no forget gate: the cell accumulates
      h' = tanh(c') * o

- LSTM (``torch.nn.LSTM``)::

      i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of the four blocks of g
      c' = f * c + i * g
      h' = o * tanh(c')

- GRU (``torch.nn.GRU``)::

      r, z = sigmoid of the first two blocks of gx + gh
      n = tanh(gx_n + r * gh_n)
      h' = (1 - z) * n + z * h

- sLSTM (Beck et al. 2024, "xLSTM: Extended Long Short-Term Memory", eqs. 8-17, with the stabilizer m of
  eqs. 15-17 and a sigmoid forget gate: FlashRNN's ``slstm``; one bias), state (h, c, n, m)::

      i~, f~, z~, o~ = the four blocks of g
      L = m + logsigmoid(f~)
      m' = i~ where n == 0 (a unit's first step from the zero state), else max(i~, L)
      i, f = exp(i~ - m'), exp(L - m')      # exp(i~) and sigmoid(f~), both scaled by exp(-m'); f = 0 where n == 0
      c' = f * c + i * tanh(z~)
      n' = f * n + i
      h' = sigmoid(o~) * c' / n'

  m' only keeps exp() in range: h' is the same for any m' (c' and n' scale alike). From n_0 = 0, n >= 1 after
  every step (one of i, f is 1), so h' is finite without FlashRNN's max(n', 1) clamp, which is left out here. A
  state with n == 0 has no history: f = 0 there, so a finite c adds nothing (FlashRNN multiplies exp(L - i~), which can
  overflow, by n = 0 and c = 0: NaN at large pre-activations).

- RNN (``torch.nn.RNN``, Elman's network: Elman 1990, "Finding Structure in Time"), with
  ``nonlinearity="tanh"`` (the ``rnn`` cell) or ``"relu"`` (``rnn_relu``)::

      h' = tanh(g)  or  relu(g)

:func:`layer_forward` runs a step function over a sequence (the input projection of all T steps is one
GEMM). Autograd differentiates these functions; they run on any device and dtype.

Zoneout (Krueger et al. 2017, "Zoneout: Regularizing RNNs by Randomly Preserving Hidden Activations"), when
:func:`layer_forward` gets factors ``z``: after each step every state is ``lerp(new, previous, z)`` =
``(1 - z) * new + z * previous`` (``torch.lerp``): a factor of 1 keeps the unit's previous value (zoned out),
0 takes the new one; the state after zoneout is the output and the next step's input. Training draws the
factors from Bernoulli(p); evaluation uses their expectation p.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

State = tuple[Tensor, ...]


def lltm_step(g: Tensor, state: State) -> State:
    h, c = state
    i, o, z = g.chunk(3, dim=1)
    c = c + torch.sigmoid(i) * F.elu(z)
    return torch.tanh(c) * torch.sigmoid(o), c


def lstm_step(g: Tensor, state: State) -> State:
    h, c = state
    i, f, g, o = g.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def gru_step(gx: Tensor, gh: Tensor, state: State) -> State:
    (h,) = state
    x_r, x_z, x_n = gx.chunk(3, dim=1)
    h_r, h_z, h_n = gh.chunk(3, dim=1)
    r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return (n + z * (h - n),)


def slstm_step(g: Tensor, state: State) -> State:
    h, c, n, m = state
    i_raw, f_raw, z_raw, o_raw = g.chunk(4, dim=1)
    L = m + F.logsigmoid(f_raw)
    # a tie, or a NaN, to i~ (as the kernels): the gradient then goes to i~ alone
    first = n == 0  # no history: f = 0, f c is 0 for a finite c (exp(L - i~) could overflow there, and 0 * inf is NaN)
    m_new = torch.where(first | ~(i_raw < L), i_raw, L)
    i = torch.exp(i_raw - m_new)
    f = torch.where(first, 0.0, torch.exp(torch.where(first, 0.0, L - m_new)))  # (no inf even in the unused branch)
    c = f * c + i * torch.tanh(z_raw)
    n = f * n + i
    return torch.sigmoid(o_raw) * c / n, c, n, m_new


def rnn_tanh_step(g: Tensor, state: State) -> State:
    return (torch.tanh(g),)


def rnn_relu_step(g: Tensor, state: State) -> State:
    return (torch.relu(g),)


def layer_forward(step: Callable[..., State], split: bool, input: Tensor, state: State, weight_ih: Tensor,
                  weight_hh: Tensor, bias_ih: Tensor | None, bias_hh: Tensor | None = None,
                  lengths: Tensor | None = None, zoneout: Tensor | None = None) -> tuple[Tensor, State]:
    """A whole sequence, as the compiled ops compute it.

    step: a step function above; split: whether it takes the two sides of its pre-activations apart (the
    GRU). input (T, B, I); state: (h, c), (h,) or (h, c, n, m), each (B, H); lengths (B,) int64 or None (every row runs
    all T steps; otherwise row b stops after lengths[b] steps: its state stays, its later outputs are zero,
    and its padding never reaches a gradient); zoneout (T, B, S * H) or None: each step's factors of the S
    states, in the state's order (h, then c). Returns (output (T, B, H), the final state).
    """
    running = None
    if lengths is not None:
        running = (torch.arange(input.shape[0])[:, None] < lengths[None, :]).to(input.device)  # (T, B)
        input = torch.where(running[:, :, None], input, torch.zeros((), dtype=input.dtype, device=input.device))
    if not split and bias_hh is not None:  # one sum: both biases go into the input projection
        bias_ih = bias_hh if bias_ih is None else bias_ih + bias_hh
        bias_hh = None
    projected = F.linear(input, weight_ih, bias_ih)
    outputs = []
    for t in range(input.shape[0]):
        if split:
            new = step(projected[t], F.linear(state[0], weight_hh, bias_hh), state)
        else:
            new = step(torch.addmm(projected[t], state[0], weight_hh.t()), state)
        if zoneout is not None:
            factors = zoneout[t].chunk(len(state), dim=1)
            new = tuple(torch.lerp(n, s, z) for n, s, z in zip(new, state, factors))
        if running is None:
            state = new
            outputs.append(new[0])
        else:
            run = running[t][:, None]
            state = tuple(torch.where(run, n, s) for n, s in zip(new, state))
            outputs.append(torch.where(run, new[0], torch.zeros_like(new[0])))
    return torch.stack(outputs), state
