"""Stacked one-direction layers as a wavefront (lltm_train/nn/_wavefront.py): the sequence in time pieces, each
layer on its own CUDA stream, gives what the layer-by-layer loop gives: outputs, final states and every gradient,
with lengths, dropout between layers, zoneout and weight drop (the same random draws)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence
from torch.testing import assert_close

import lltm_train.nn._wavefront as wave
import lltm_train.nn.rnn as rnn
from conftest import CUDA_READY, CUDA_SKIP_REASON
from lltm_train.nn import recurrent_layers
from lltm_train.ops.cells import CELLS

F64 = dict(rtol=1e-10, atol=1e-10)
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)])]


def _run(m, x, hx, lengths, packed):
    torch.manual_seed(7)  # the same dropout, zoneout and weight-drop draws for both
    inp = x.clone().requires_grad_()
    h = tuple(s.clone().requires_grad_() for s in hx)
    out, state = m(pack_padded_sequence(inp, lengths, enforce_sorted=False) if packed else inp, h if len(h) > 1 else h[0])
    out = out.data if packed else out
    state = state if isinstance(state, tuple) else (state,)
    weights = torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype, device=out.device)
    ((out * weights).sum() + sum((s * s).sum() for s in state)).backward()
    return [out, *state, inp.grad, *(s.grad for s in h), *(p.grad for p in m.parameters())]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_wavefront_gives_what_layer_by_layer_gives(cell, device, packed, monkeypatch):
    backend = "cuda" if device == "cuda" else "cpp"
    m = recurrent_layers(cell.name, 5, 6, num_layers=3, dropout=0.3, weight_drop=0.25, backend=backend,
                         zoneout=0.2 if cell.zoneout else 0.0, dtype=torch.float64, device=device)
    x = torch.randn(11, 4, 5, dtype=torch.float64, device=device)  # 11 steps: pieces of 2, 3, 3, 3
    hx = tuple(torch.randn(3, 4, 6, dtype=torch.float64, device=device) for _ in cell.states)
    lengths = torch.tensor([11, 3, 8, 1])  # one row ends in the first piece, one in the third
    calls = []
    real = wave.rnn_layer
    monkeypatch.setattr(wave, "rnn_layer", lambda *a, **k: calls.append(a[1].shape[0]) or real(*a, **k))
    if device == "cpu":  # no streams: the pieces in turn
        monkeypatch.setattr(rnn, "layer_streams", lambda layers, t: [None] * layers.num_layers)
    monkeypatch.setattr(wave, "MIN_WIDTH", 1)  # the widths it is used at are a speed rule; 6 checks the streams
    pieces = _run(m, x, hx, lengths, packed)
    assert calls == [2] * 3 + [3] * 9  # every layer in every piece
    monkeypatch.setattr(rnn, "layer_streams", lambda layers, t: None)
    whole = _run(m, x, hx, lengths, packed)
    for a, b in zip(pieces, whole, strict=True):
        assert_close(a, b, **F64)


@pytest.mark.parametrize("name", [name for name, spec in CELLS.items() if len(spec.states) == 1])
def test_under_autocast_the_draws_are_the_one_stream_draws(name, monkeypatch):
    """bfloat16 autocast: a layer's output, and so the draws of the layers above the first, in bfloat16. A cell
    whose one state is its output (GRU, RNN) gives the one-stream results bit for bit, dropout, zoneout and weight
    drop included. (A cell with c keeps it in float32 within a call and in bfloat16 between pieces: its results
    differ in the last bits, about 1e-3 relative.)"""
    spec = CELLS[name]
    m = recurrent_layers(name, 5, 6, num_layers=3, dropout=0.3, weight_drop=0.25, backend="cpp",
                         zoneout=0.2 if spec.zoneout else 0.0)
    x, hx, lengths = torch.randn(11, 4, 5), (torch.randn(3, 4, 6),), torch.tensor([11, 3, 8, 1])
    results = []
    for streams in (lambda layers, t: [None] * layers.num_layers, lambda layers, t: None):
        monkeypatch.setattr(rnn, "layer_streams", streams)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(_run(m, x, hx, lengths, False))
    assert results[0][0].dtype == torch.bfloat16
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("size, kwargs, T, expected", [
    (256, {"num_layers": 3}, 16, True), (512, {"num_layers": 2}, 8, True), (1024, {"num_layers": 3, "num_heads": 4}, 16, True),
    (256, {"num_layers": 1}, 16, False), (256, {"num_layers": 2, "bidirectional": True}, 16, False),
    (256, {"num_layers": 2}, 7, False),  # under 2 steps a piece
    (128, {"num_layers": 3}, 16, False),  # too narrow eagerly: slower there (MIN_WIDTH's comment)
    (1024, {"num_layers": 3}, 16, False)])  # the wide kernels fill the GPU
def test_which_stacks_run_as_a_wavefront(size, kwargs, T, expected):
    layers = recurrent_layers("lstm", 3, size, **kwargs)
    assert wave.fits(layers, T) == expected
    # inside a capture from width 128 (no host time per piece), the other rules the same
    assert wave.fits(layers, T, captured=True) == (expected or (size == 128 and kwargs == {"num_layers": 3}))
    assert not wave.fits(recurrent_layers("lstm", 3, 64, num_layers=3), T, captured=True)
    x = torch.zeros(T, 2, 3)
    assert wave.layer_streams(layers, x) is None  # on a CPU never
    if CUDA_READY:
        streams = wave.layer_streams(layers.cuda(), x.cuda())
        assert (streams is not None and len(streams) == layers.num_layers) == expected
