"""The sLSTM (Beck et al. 2024, "xLSTM"; FlashRNN's slstm with a sigmoid forget gate): its first step and its
stabilizer against values worked out by hand, its invariance to the stabilizer, the refusals (zoneout, the cuda
backend), and FlashRNN's own PyTorch loop where FlashRNN is installed. The checks every cell gets (gradcheck,
opcheck, lengths, dtypes) run on it through the ``cell`` fixture of the other test files."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from conftest import CUDA_READY, CUDA_SKIP_REASON
from lltm_train import nn as fused
from lltm_train.functional import rnn_layer
from lltm_train.ops.reference import slstm_step

F64 = dict(dtype=torch.float64)


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_one_step_by_hand():
    """From the zero state m' = i~ (the first step), so i = 1, n' = 1 and h' = sigmoid(o~) tanh(z~); from a state
    with n > 0, m' = max(i~, m + log sigmoid(f~))."""
    g = torch.tensor([[0.3, -1.2, 0.7, 2.0]], **F64)  # i~, f~, z~, o~ of one unit
    zero = tuple(torch.zeros(1, 1, **F64) for _ in range(4))
    h, c, n, m = (t.item() for t in slstm_step(g, zero))
    assert (m, n, c) == pytest.approx((0.3, 1.0, math.tanh(0.7)))
    assert h == pytest.approx(_sigmoid(2.0) * math.tanh(0.7))
    # a second step from (c, n, m) = (0.5, 2.0, 1.0): L = 1 + log sigmoid(-1.2) = -0.4633 < i~ = 0.3, so m' = i~
    state = tuple(torch.tensor([[v]], **F64) for v in (0.0, 0.5, 2.0, 1.0))
    h, c, n, m = (t.item() for t in slstm_step(g, state))
    L = 1.0 + math.log(_sigmoid(-1.2))
    f = math.exp(L - 0.3)
    assert (m, n, c) == pytest.approx((0.3, f * 2.0 + 1.0, f * 0.5 + math.tanh(0.7)))
    assert h == pytest.approx(_sigmoid(2.0) * c / n)
    # with m = 3, L = 3 - 1.4633 > i~: m' = L, f = 1 and i = exp(i~ - L)
    state = tuple(torch.tensor([[v]], **F64) for v in (0.0, 0.5, 2.0, 3.0))
    _, c, n, m = (t.item() for t in slstm_step(g, state))
    L = 3.0 + math.log(_sigmoid(-1.2))
    assert (m, n, c) == pytest.approx((L, 2.0 + math.exp(0.3 - L), 0.5 + math.exp(0.3 - L) * math.tanh(0.7)))


@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_large_pre_activations_stay_finite_and_n_at_least_one(backend):
    """Weights 30x too large: exp(i~) alone overflows float32, the stabilized gates do not; from the zero state n
    stays >= 1 at every step (so h needs no clamp)."""
    T, B, I, H = 40, 3, 4, 6
    x = torch.randn(T, B, I)
    w_ih, w_hh, b = torch.randn(4 * H, I) * 30, torch.randn(4 * H, H) * 30, torch.randn(4 * H) * 30
    out, (h, c, n, m) = rnn_layer("slstm", x, None, w_ih, w_hh, b, backend=backend)
    assert torch.isfinite(out).all() and torch.isfinite(torch.stack([h, c, n, m])).all()
    assert (n >= 1 - 1e-6).all()
    ref, _ = rnn_layer("slstm", x.double(), None, w_ih.double(), w_hh.double(), b.double(), backend="python")
    assert (out.double() - ref).abs().max() < 1e-3


@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_the_output_does_not_depend_on_the_stabilizer(backend):
    """(c e^-d, n e^-d, m + d) is the same state for any d: the outputs agree, and m_n moves by d."""
    T, B, I, H = 6, 2, 3, 5
    x, w_ih, w_hh, b = torch.randn(T, B, I, **F64), torch.randn(4 * H, I, **F64), torch.randn(4 * H, H, **F64), \
        torch.randn(4 * H, **F64)
    h0, c0, n0, m0 = torch.randn(B, H, **F64), torch.randn(B, H, **F64), torch.rand(B, H, **F64) + 0.5, torch.randn(B, H, **F64)
    d = 2.5
    out1, s1 = rnn_layer("slstm", x, (h0, c0, n0, m0), w_ih, w_hh, b, backend=backend)
    out2, s2 = rnn_layer("slstm", x, (h0, c0 * math.exp(-d), n0 * math.exp(-d), m0 + d), w_ih, w_hh, b, backend=backend)
    assert_close(out1, out2, rtol=1e-10, atol=1e-12)
    assert_close(s1[0], s2[0], rtol=1e-10, atol=1e-12)
    assert_close(s1[1] / s1[2], s2[1] / s2[2], rtol=1e-10, atol=1e-12)


def test_zoneout_is_refused_by_name():
    with pytest.raises(ValueError, match="SLSTM: the sLSTM takes no zoneout"):
        fused.SLSTM(3, 4, zoneout=0.1)
    x, w_ih, w_hh, b = torch.randn(2, 1, 3), torch.randn(16, 3), torch.randn(16, 4), torch.randn(16)
    for backend in ("python", "cpp"):
        with pytest.raises(ValueError, match="slstm_layer: the sLSTM takes no zoneout"):
            rnn_layer("slstm", x, None, w_ih, w_hh, b, backend=backend, zoneout=torch.zeros(2, 1, 16))
    with pytest.raises(ValueError, match="PyTorch has no sLSTM"):
        fused.SLSTM(3, 4, backend="torch")


def test_the_module_takes_and_returns_four_states():
    m = fused.SLSTM(3, 4, num_layers=2, batch_first=True)
    out, (h, c, n, m_n) = m(torch.randn(2, 5, 3))
    assert out.shape == (2, 5, 4) and all(s.shape == (2, 2, 4) for s in (h, c, n, m_n))
    out2, _ = m(torch.randn(2, 5, 3), (h, c, n, m_n))
    assert out2.shape == (2, 5, 4)
    with pytest.raises(ValueError, match=r"hx must be a tuple \(h_0, c_0, n_0, m_0\) of 4 tensors"):
        m(torch.randn(2, 5, 3), (h, c))
    cell = fused.SLSTMCell(3, 4)
    assert [t.shape for t in cell(torch.randn(3))] == [(4,)] * 4
    assert sorted(n for n, _ in m.named_parameters()) == sorted(
        f"{p}_l{k}" for p in ("weight_ih", "weight_hh", "bias") for k in (0, 1))


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)
def test_cuda_refuses_by_name_and_auto_runs_the_reference():
    x, w_ih, w_hh, b = (torch.randn(*s, device="cuda") for s in ((3, 2, 4), (20, 4), (20, 5), (20,)))
    with pytest.raises(NotImplementedError, match="the sLSTM has no CUDA kernels yet"):
        rnn_layer("slstm", x, None, w_ih, w_hh, b, backend="cuda")
    out, _ = rnn_layer("slstm", x, None, w_ih, w_hh, b, backend="auto")
    want, _ = rnn_layer("slstm", x.cpu(), None, w_ih.cpu(), w_hh.cpu(), b.cpu(), backend="cpp")
    assert_close(out.cpu(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_matches_flashrnn_vanilla_slstm_with_heads(backend):
    """FlashRNN 1.0.8's own PyTorch loop (backend="vanilla"), where it is installed (pip install flashrnn einops):
    the same outputs in float64, 2 heads of 4 units (its max(n, 1) clamp never acts from the zero state)."""
    flashrnn = pytest.importorskip("flashrnn").flashrnn
    T, B, I, NH, DH = 7, 3, 5, 2, 4
    H = NH * DH
    x, w_ih = torch.randn(T, B, I, **F64), torch.randn(4 * H, I, **F64) * 0.8
    w_hh, b = torch.randn(4 * H, DH, **F64) * 0.8, torch.randn(4 * H, **F64)
    ours, _ = rnn_layer("slstm", x, None, w_ih, w_hh, b, backend=backend, num_heads=NH)
    wx = (x @ w_ih.T).permute(1, 0, 2).reshape(B, T, 4, NH, DH)
    theirs, _ = flashrnn(wx, w_hh.reshape(4, NH, DH, DH), b.reshape(4, NH, DH), function="slstm", backend="vanilla",
                         dtype="float64")
    assert_close(ours, theirs[0].reshape(B, T, H).permute(1, 0, 2), rtol=1e-12, atol=1e-12)
