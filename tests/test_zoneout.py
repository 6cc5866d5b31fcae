"""Zoneout (Krueger et al. 2017) inside the fused recurrences: the reference's rule, every compiled backend against
it (values, gradients, gradcheck, opcheck, lengths), and the modules' masks (training draws, evaluation's
expectation). The 16-bit and TF32 persistent kernels under zoneout: tests/test_cuda.py."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from conftest import forward_args, layer_args, leaves, upstream_like
from lltm_train import nn as fused
from lltm_train.functional import rnn_layer
from lltm_train.models import recurrent_layer
from lltm_train.ops.cells import CELLS, CellSpec

F64 = dict(rtol=1e-10, atol=1e-10)


@pytest.fixture(params=[name for name, spec in CELLS.items() if spec.zoneout])
def cell(request) -> CellSpec:
    """Each cell that takes zoneout (not the sLSTM: tests/test_slstm.py checks that it is refused)."""
    return CELLS[request.param]


def factors(spec, T, B, H, device="cpu", dtype=torch.float64, fraction=False):
    """Zoneout factors (T, B, S H): Bernoulli(0.4) draws, or (fraction=True) values in [0, 1] with exact 0s and 1s."""
    shape = (T, B, len(spec.states) * H)
    if not fraction:
        return torch.bernoulli(torch.full(shape, 0.4, dtype=dtype, device=device))
    z = torch.rand(shape, dtype=dtype, device=device)
    z[z < 0.2] = 0.0
    z[z > 0.8] = 1.0
    return z


def run(spec, p, backend, upstream, zoneout, lengths=None):
    out, state = rnn_layer(spec, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"],
                           lengths=lengths, backend=backend, zoneout=zoneout)
    loss = sum((r * u).sum() for r, u in zip((out, *state), upstream))
    return (out, *state, *torch.autograd.grad(loss, leaves(p)))


def test_the_reference_keeps_zoned_out_units_and_blends_by_the_factor(cell):
    """Each state after a step is lerp(new, previous, factor): all ones keep the initial state (the output is
    h_0 at every step), all zeros are the plain layer, and a fraction blends, step by step."""
    T, B, I, H = 5, 3, 4, 6
    p = layer_args(cell, T, B, I, H, requires_grad=False)
    S = len(cell.states)
    args = (cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"])
    out, state = rnn_layer(*args, backend="python", zoneout=torch.ones(T, B, S * H, dtype=torch.float64))
    assert torch.equal(out, p["states"][0].expand(T, B, H)) and all(torch.equal(a, b) for a, b in zip(state, p["states"]))
    plain = rnn_layer(*args, backend="python")
    zero = rnn_layer(*args, backend="python", zoneout=torch.zeros(T, B, S * H, dtype=torch.float64))
    assert torch.equal(zero[0], plain[0])
    z = factors(cell, T, B, H, fraction=True)
    out, state = rnn_layer(*args, backend="python", zoneout=z)
    s = p["states"]
    for t in range(T):  # one step at a time, from the previous step's zoned state
        _, new = rnn_layer(cell, p["input"][t:t + 1], s, p["weight_ih"], p["weight_hh"], *p["biases"], backend="python")
        s = tuple((1 - zk) * n + zk * prev for n, prev, zk in zip(new, s, z[t].chunk(S, dim=1)))
        assert_close(out[t], s[0], **F64)
    for a, b in zip(state, s):
        assert_close(a, b, **F64)


@pytest.mark.parametrize("fraction", [False, True], ids=["bernoulli", "fractions"])
@pytest.mark.parametrize("sizes", [(1, 1, 1, 1), (6, 3, 5, 7), (9, 4, 3, 129)], ids=lambda s: "T{}B{}I{}H{}".format(*s))
def test_compiled_backends_match_python_float64(device_backend, cell, sizes, fraction):
    device, backend = device_backend
    T, B, I, H = sizes
    p = layer_args(cell, T, B, I, H, device)
    up = upstream_like(cell, T, B, H, device)
    z = factors(cell, T, B, H, device, fraction=fraction)
    z[0, 0, 0] = 1.0  # at least one zoned-out unit of h, so that the result differs from the plain layer's
    got = run(cell, p, backend, up, z)
    want = run(cell, p, "python", up, z)
    for g, w in zip(got, want):
        assert_close(g, w, **F64)
    assert not torch.equal(got[0], run(cell, p, backend, up, None)[0])  # zoneout changed the result


def test_with_lengths_finished_rows_keep_their_state(device_backend, cell):
    device, backend = device_backend
    T, B, H = 7, 4, 5
    p = layer_args(cell, T, B, 3, H, device)
    up = upstream_like(cell, T, B, H, device)
    z = factors(cell, T, B, H, device)
    lengths = torch.tensor([7, 2, 0, 5])
    got = run(cell, p, backend, up, z, lengths)
    for g, w in zip(got, run(cell, p, "python", up, z, lengths)):
        assert_close(g, w, **F64)
    out, *state = got[: 1 + len(cell.states)]
    assert torch.all(out[2:, 1] == 0) and torch.all(out[:, 2] == 0)
    assert all(torch.equal(s[2], s0[2]) for s, s0 in zip(state, p["states"]))


def test_gradcheck_float64(device_backend, cell):
    device, backend = device_backend
    p = layer_args(cell, 4, 3, 5, 6, device)
    n = len(cell.states)
    z = factors(cell, 4, 3, 6, device, fraction=True)

    def layer(x, *rest, lengths=None):
        states, (w_ih, w_hh), biases = rest[:n], rest[n:n + 2], rest[n + 2:]
        out, state = rnn_layer(cell, x, states, w_ih, w_hh, *biases, lengths=lengths, backend=backend, zoneout=z)
        return (out, *state)

    args = tuple(leaves(p))
    assert torch.autograd.gradcheck(layer, args)
    assert torch.autograd.gradcheck(lambda *a: layer(*a, lengths=torch.tensor([4, 0, 2])), args)


def test_opcheck_both_ops_with_zoneout(device_backend, cell):
    device, _ = device_backend
    T, B, H = 3, 2, 5
    p = layer_args(cell, T, B, 4, H, device)
    d = layer_args(cell, T, B, 4, H, device, requires_grad=False)
    z = factors(cell, T, B, H, device, fraction=True)
    forward_op = getattr(torch.ops.lltm, cell.forward_op).default
    backward_op = getattr(torch.ops.lltm, cell.backward_op).default
    for lengths in (None, torch.tensor([3, 1])):
        for args in (forward_args(cell, p, lengths), forward_args(cell, d, lengths)):
            torch.library.opcheck(forward_op, (*args, True, z))
    result = forward_op(*forward_args(cell, d), True, z)
    n = len(cell.states)
    out, finals, saved = result[0], result[1:1 + n], result[1 + n:]
    common = (d["input"], *d["states"], d["weight_ih"], d["weight_hh"], out, *saved)
    torch.library.opcheck(backward_op, (torch.randn_like(out), *(torch.randn_like(s) for s in finals), *common, None, z))


def test_bad_factors_are_refused_in_one_line(device_backend, cell):
    device, backend = device_backend
    p = layer_args(cell, 3, 2, 4, 5, device, requires_grad=False)
    args = (cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"])
    S = len(cell.states)
    for be in (backend, "python"):
        with pytest.raises(ValueError, match=rf"expected zoneout of shape \(T, B, {S} \* hidden_size\) = \(3, 2, {5 * S}\)"):
            rnn_layer(*args, backend=be, zoneout=torch.zeros(3, 2, 5 * S + 1, dtype=torch.float64, device=device))
        with pytest.raises(TypeError, match="zoneout must have input's dtype and device"):
            rnn_layer(*args, backend=be, zoneout=torch.zeros(3, 2, 5 * S, dtype=torch.int64, device=device))
    if cell.has_torch:
        with pytest.raises(ValueError, match="zoneout runs in the fused backends"):
            rnn_layer(*args, backend="torch", zoneout=torch.zeros(3, 2, 5 * S, dtype=torch.float64, device=device))


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("name", ["lltm", "lstm", "gru"])
def test_modules_draw_masks_in_training_and_use_the_expectation_in_evaluation(name, backend):
    spec = CELLS[name]
    T, B, I, H = 6, 3, 4, 5
    layer = fused.RecurrentLayers.for_cell(name, I, H, num_layers=2, bidirectional=True, backend=backend,
                                           zoneout=[0.3, 0.1] if spec.has_cell_state else 0.1).double()
    x = torch.randn(T, B, I, dtype=torch.float64)
    f64 = dict(dtype=torch.float64)
    probabilities = torch.cat([torch.full((H,), 0.1, **f64), torch.full((H,), 0.3, **f64)][: len(spec.states)])

    def by_hand(draw: bool):
        """The layers through rnn_layer with masks drawn in the module's order (layer by layer, forward first)."""
        h = x
        for layer_index in range(2):
            outs = []
            for d, suffix in enumerate(layer._suffixes(layer_index)):
                xd = h if d == 0 else h.flip(0)
                p = probabilities.expand(T, B, -1)
                z = torch.bernoulli(p) if draw else p
                out, _ = rnn_layer(name, xd, None, *layer._weights(suffix), backend="python", zoneout=z)
                outs.append(out if d == 0 else out.flip(0))
            h = torch.cat(outs, -1)
        return h

    layer.train()
    torch.manual_seed(3)
    trained = layer(x)[0]
    torch.manual_seed(3)
    assert_close(trained, by_hand(True), **F64)
    layer.eval()
    assert_close(layer(x)[0], by_hand(False), **F64)
    assert ("zoneout=(0.3, 0.1)" if spec.has_cell_state else "zoneout=(0.1, 0.1)") in repr(layer)


def test_zoneout_settings_are_checked():
    with pytest.raises(ValueError, match="zoneout's cell probability must be a number in"):
        fused.LSTM(3, 4, zoneout=[1.5, 0.1])
    with pytest.raises(ValueError, match=r"zoneout must be a probability or a pair \[cell, hidden\]"):
        fused.LSTM(3, 4, zoneout=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="backend=torch .* has none"):
        recurrent_layer("lstm", 3, 4, backend="torch", zoneout=0.1)
    assert fused.GRU(3, 4, zoneout=0.2).zoneout == (0.2, 0.2)
    for one in (1.0, [1, 0.1], [0.0, 1]):  # a state that never leaves its initial value: refused, as weight_drop=1
        with pytest.raises(ValueError, match="zoneout's probabilities must be below 1"):
            fused.LSTM(3, 4, zoneout=one)


def test_zoneout_and_weight_drop_set_after_construction_are_checked_and_used():
    x = torch.randn(6, 2, 3, dtype=torch.float64)
    layer = fused.LSTM(3, 4, backend="python", dtype=torch.float64)
    layer.zoneout, layer.weight_drop = 0.2, 0.3  # one number for both states, as the constructor takes
    assert layer.zoneout == (0.2, 0.2) and layer.weight_drop == 0.3
    built = fused.LSTM(3, 4, backend="python", dtype=torch.float64, zoneout=0.2, weight_drop=0.3)
    built.load_state_dict(layer.state_dict())
    outputs = []
    for m in (layer, built):
        torch.manual_seed(5)
        outputs.append(m(x)[0])
    assert_close(outputs[0], outputs[1], **F64)
    assert not torch.allclose(outputs[0], layer.eval()(x)[0])  # the draws acted: evaluation has none
    layer.train()
    for name, bad, message in (("zoneout", (1.5, 1.5), "zoneout's cell probability must be a number in"),
                               ("zoneout", 1.0, "zoneout's probabilities must be below 1"),
                               ("weight_drop", 1.0, "weight_drop must be below 1"),
                               ("weight_drop", float("nan"), "weight_drop must be a number")):
        with pytest.raises(ValueError, match=message):
            setattr(layer, name, bad)
    assert layer.zoneout == (0.2, 0.2) and layer.weight_drop == 0.3  # a refused value changes nothing
    with pytest.raises(ValueError, match="the sLSTM takes no zoneout"):
        fused.SLSTM(3, 4).zoneout = 0.1
    # the GRU and the RNN have h alone: a pair's cell part would be dropped unused (it was, silently, before)
    for cls in (fused.GRU, fused.RNN):
        assert cls(3, 4, zoneout=0.2).zoneout == (0.2, 0.2) and cls(3, 4, zoneout=[0.3, 0.3]).zoneout == (0.3, 0.3)
        with pytest.raises(ValueError, match="has no cell state, only h: give zoneout one probability"):
            cls(3, 4, zoneout=[0.9, 0.0])
    layer = recurrent_layer("lstm", 3, 4, backend="torch", zoneout=[0.0, 0.0])  # none asked: torch.nn's layer
    assert type(layer) is torch.nn.LSTM
