"""Heads (``num_heads``): the recurrence split into independent heads with a block-diagonal recurrent matrix. Every
backend against independent single-head layers of the python reference, one per head (values, gradients,
lengths), gradcheck, the modules' parameters and arguments, and the model config."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from conftest import DEVICE_BACKENDS, layer_args, leaves, op_states, upstream_like
from lltm_train import nn as fused
from lltm_train.functional import dense_weight_hh, rnn_cell, rnn_layer
from lltm_train.models import recurrent_layer
from lltm_train.ops.cells import CELLS

F64 = dict(rtol=1e-10, atol=1e-10)
TORCH_CELLS = [name for name, spec in CELLS.items() if spec.has_torch]
BACKENDS = [*DEVICE_BACKENDS, pytest.param(("cpu", "torch"), id="torch"), pytest.param(("cpu", "python"), id="python")]


def head_args(spec, T, B, I, NH, DH, device="cpu"):
    """layer_args with weight_hh holding only the heads' blocks, (G H, DH)."""
    p = layer_args(spec, T, B, I, NH * DH, device=device)
    p["weight_hh"] = (torch.randn(spec.num_gates * NH * DH, DH, dtype=torch.float64, device=device) * DH**-0.5
                      ).requires_grad_()
    return p


def per_head(spec, p, NH, DH, lengths):
    """The oracle: NH single-head layers of the python reference, head a on the rows g H + a DH + j of every
    parameter and the units a DH + j of the state, outputs and states concatenated over the heads. Built by
    indexing the same leaves, so its gradients are comparable with the heads layer's."""
    H, G = NH * DH, spec.num_gates
    outs, states = [], []
    for a in range(NH):
        rows = torch.tensor([g * H + a * DH + j for g in range(G) for j in range(DH)])
        units = slice(a * DH, (a + 1) * DH)
        out, state = rnn_layer(spec, p["input"], tuple(s[:, units] for s in p["states"]), p["weight_ih"][rows],
                               p["weight_hh"][rows], *(None if b is None else b[rows] for b in p["biases"]),
                               lengths=lengths, backend="python")
        outs.append(out)
        states.append(state)
    return torch.cat(outs, -1), tuple(torch.cat(s, -1) for s in zip(*states))


def results(spec, p, out, state, upstream):
    loss = sum((r * u).sum() for r, u in zip((out, *state), upstream))
    return (out, *state, *torch.autograd.grad(loss, leaves(p)))


@pytest.mark.parametrize("device_backend", BACKENDS)
@pytest.mark.parametrize("NH, DH, with_lengths", [(3, 4, False), (2, 5, True), (1, 6, False)])
def test_each_head_is_an_independent_recurrence(device_backend, cell, NH, DH, with_lengths):
    device, backend = device_backend
    if backend == "torch" and not cell.has_torch:
        pytest.skip(f"PyTorch has no {cell.title} cell")
    T, B, I = 6, 3, 5
    p = head_args(cell, T, B, I, NH, DH, device)
    lengths = torch.tensor([6, 0, 3]) if with_lengths else None
    upstream = upstream_like(cell, T, B, NH * DH, device)
    got = results(cell, p, *rnn_layer(cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"],
                                      lengths=lengths, backend=backend, num_heads=NH), upstream)
    want = results(cell, p, *per_head(cell, p, NH, DH, lengths), upstream)
    for g, w in zip(got, want):
        assert_close(g, w, **F64)


def test_a_perturbed_head_leaves_the_others_unchanged(cell):
    """h_0 changed in head 0 only: head 0's outputs change, the other heads' stay bit for bit."""
    NH, DH, T = 3, 4, 5
    p = head_args(cell, T, 8, 3, NH, DH)
    args = (p["weight_ih"], p["weight_hh"], *p["biases"])
    with torch.no_grad():
        base, _ = rnn_layer(cell, p["input"], p["states"], *args, backend="cpp", num_heads=NH)
        moved = tuple(s.clone() for s in p["states"])
        moved[0][:, :DH] += 1.0
        out, _ = rnn_layer(cell, p["input"], moved, *args, backend="cpp", num_heads=NH)
    assert torch.equal(out[..., DH:], base[..., DH:])
    assert (out[0, :, :DH] != base[0, :, :DH]).any()  # (a ReLU unit may die later: the first step says it)


@pytest.mark.parametrize("device_backend", DEVICE_BACKENDS)
def test_gradcheck_float64(device_backend, cell):
    device, backend = device_backend
    p = head_args(cell, 3, 2, 3, 2, 3, device)

    def f(*xs):
        x, *rest = xs
        states, (w_ih, w_hh), biases = rest[:len(cell.states)], rest[len(cell.states):len(cell.states) + 2], \
            rest[len(cell.states) + 2:]
        out, state = rnn_layer(cell, x, tuple(states), w_ih, w_hh, *biases, backend=backend, num_heads=2)
        return (out, *state)

    assert torch.autograd.gradcheck(f, tuple(leaves(p)), eps=1e-6, atol=1e-7)


def test_the_cell_function_is_a_layer_of_one_step(cell):
    p = head_args(cell, 1, 3, 4, 2, 3)
    state = rnn_cell(cell, p["input"][0], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"], backend="cpp",
                     num_heads=2)
    _, want = per_head(cell, p, 2, 3, None)
    for a, b in zip(state, want):
        assert_close(a, b, **F64)


def test_dense_weight_is_block_diagonal_in_the_documented_layout():
    """Row g H + a DH + j of the blocks is gate g, unit a DH + j; it reads columns a DH .. a DH + DH - 1."""
    G, NH, DH = 4, 3, 2
    H = NH * DH
    w = torch.arange(G * H * DH, dtype=torch.float64).reshape(G * H, DH) + 1
    dense = dense_weight_hh("lstm", w, NH)
    assert dense.shape == (G * H, H)
    for g in range(G):
        for a in range(NH):
            for j in range(DH):
                row = g * H + a * DH + j
                assert torch.equal(dense[row, a * DH:(a + 1) * DH], w[row])
                assert dense[row].count_nonzero() == DH
    square = torch.randn(G * H, H, dtype=torch.float64)
    assert dense_weight_hh("lstm", square, 1) is square


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "2"])
def test_bad_num_heads_are_refused_in_one_line(bad):
    p = layer_args(CELLS["gru"], 2, 2, 3, 4)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        rnn_layer("gru", p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"], num_heads=bad)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        fused.GRU(3, 4, num_heads=bad)


def test_weights_of_the_wrong_shape_for_the_heads_are_refused():
    p = layer_args(CELLS["lstm"], 2, 2, 3, 4)  # a dense (16, 4) weight_hh given with 2 heads
    with pytest.raises(ValueError, match=r"expected weight_hh of shape \(4 \* hidden_size, hidden_size / 2\) = \(16, 2\), "
                                         r"got \(16, 4\)"):
        rnn_layer("lstm", p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"], num_heads=2)
    with pytest.raises(ValueError, match=r"hidden_size \(10\) must be a multiple of num_heads \(4\)"):
        fused.LSTM(3, 10, num_heads=4)
    with pytest.raises(ValueError, match=r"hidden_size \(10\) must be a multiple of num_heads \(4\)"):
        fused.LSTMCell(3, 10, num_heads=4)


@pytest.mark.parametrize("name", list(CELLS))
def test_modules_hold_the_blocks_and_run_on_every_backend(name):
    """Parameters (G H, H / NH); 2 layers, bidirectional, batch_first: the same outputs on python, cpp (and torch
    where PyTorch has the cell) from one state dict, and the repr says num_heads."""
    spec = CELLS[name]
    torch.manual_seed(0)
    layers = fused.recurrent_layers(name, 5, 8, num_layers=2, bidirectional=True, batch_first=True, num_heads=4,
                                    backend="python", dtype=torch.float64)
    assert layers.weight_hh_l1_reverse.shape == (spec.num_gates * 8, 2)
    assert layers.weight_ih_l1.shape == (spec.num_gates * 8, 16)
    assert "num_heads=4" in repr(layers)
    x = torch.randn(3, 7, 5, dtype=torch.float64)
    want, _ = layers(x)
    for backend in ("cpp", "torch") if spec.has_torch else ("cpp",):
        layers.backend = backend
        got, _ = layers(x)
        assert_close(got, want, **F64)
    cell = fused.RecurrentCell.for_cell(name, 5, 8, num_heads=2, dtype=torch.float64)
    assert cell.weight_hh.shape == (spec.num_gates * 8, 4) and "num_heads=2" in repr(cell)


def test_weight_drop_drops_the_blocks():
    torch.manual_seed(0)
    layers = fused.LSTM(3, 8, num_heads=2, weight_drop=0.5, backend="cpp", dtype=torch.float64).train()
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    a, _ = layers(x)
    b, _ = layers(x)
    assert not torch.equal(a, b)  # a fresh mask of the blocks each call
    layers.eval()
    assert torch.equal(layers(x)[0], layers(x)[0])


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_the_model_layer_takes_num_heads_on_the_fused_and_torch_backends(backend):
    layer = recurrent_layer("lstm", 5, 12, num_layers=1, backend=backend, forget_bias=1.0, num_heads=3)
    assert isinstance(layer, fused.LSTM) and layer.num_heads == 3 and layer.backend == backend
    assert layer.weight_hh_l0.shape == (48, 4)
    assert torch.equal(layer.bias_ih_l0[12:24], torch.ones(12))
    with pytest.raises(ValueError, match="must be a multiple of num_heads"):
        recurrent_layer("gru", 5, 10, backend=backend, num_heads=4)


def test_model_num_heads_trains_and_its_checkpoint_loads(tmp_path):
    """``model.num_heads=2`` through the config: the task's layer has the heads, training takes steps, and the best
    checkpoint restores the blocks."""
    from helpers import ADDING, make_cfg

    from lltm_train.train import build, train

    overrides = [*ADDING, "model.cell=lstm", "model.num_heads=2", "trainer.max_steps=4", "backend=cpp"]
    built = build(make_cfg(tmp_path / "b", *overrides)).task
    assert built.net.rnn.num_heads == 2
    metrics = train(make_cfg(tmp_path, *overrides))
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))
    best = next(tmp_path.rglob("best-*.ckpt"))
    task = type(built).load_from_checkpoint(best, map_location="cpu")
    assert task.net.rnn.num_heads == 2 and task.net.rnn.weight_hh_l0.shape == (32, 4)
    with pytest.raises(Exception, match="multiple of num_heads"):
        build(make_cfg(tmp_path / "c", *ADDING, "model.num_heads=3"))


@pytest.mark.parametrize("name, function", [("lstm", "lstm"), ("rnn", "elman")])
def test_flashrnn_s_heads_are_ours_reshaped(name, function):
    """Where FlashRNN (NX-AI) is installed: its multi-head layer (the vanilla PyTorch loop) equals ours with
    ``weight_hh = R.reshape(G * H, DH)``, ``bias_ih = b.reshape(G * H)`` and the identity as the input weight
    (FlashRNN takes the input projection as given). A FlashRNN user's weights load as they are."""
    pytest.importorskip("flashrnn", reason="FlashRNN is optional (pip install flashrnn); not a dependency")
    from flashrnn import flashrnn

    spec = CELLS[name]
    B, T, NH, DH, G = 2, 6, 3, 4, spec.num_gates
    H = NH * DH
    f64 = dict(dtype=torch.float64)
    wx = torch.randn(B, T, G, NH, DH, **f64)
    r = torch.randn(G, NH, DH, DH, **f64) * DH**-0.5
    b = torch.randn(G, NH, DH, **f64) * 0.1
    h, _ = flashrnn(wx, r, b, function=function, backend="vanilla", dtype="float64")
    theirs = h[0].permute(1, 0, 2, 3).reshape(T, B, H)  # (T, B, H), h_1 .. h_T
    x = wx.permute(1, 0, 2, 3, 4).reshape(T, B, G * H)
    ours, _ = rnn_layer(name, x, None, torch.eye(G * H, **f64), r.reshape(G * H, DH), b.reshape(G * H),
                        torch.zeros(G * H, **f64), backend="cpp", num_heads=NH)
    assert_close(ours, theirs, **F64)


def test_compile_fullgraph_with_heads_and_zoneout_matches_eager():
    """torch.compile(fullgraph=True) of a 2-layer, 2-head LSTM with zoneout in evaluation (the expectation,
    deterministic): one graph, the eager module's outputs and gradients of the heads' blocks."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = fused.LSTM(5, 8, num_layers=2, num_heads=2, zoneout=[0.3, 0.1], backend="cpp").eval()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(6, 3, 5)
    (out, (h, c)), (out_ref, (h_ref, c_ref)) = compiled(x), model(x)
    for a, b in ((out, out_ref), (h, h_ref), (c, c_ref)):
        assert_close(a, b)
    grads = torch.autograd.grad(out.sum() + c.sum(), model.weight_hh_l1)
    grads_ref = torch.autograd.grad(out_ref.sum() + c_ref.sum(), model.weight_hh_l1)
    assert grads[0].shape == (32, 4)
    assert_close(grads[0], grads_ref[0])


@pytest.mark.parametrize("name", ["lstm", "slstm"])
def test_compile_fullgraph_of_rnn_layer_with_num_heads_an_argument_that_changes(name):
    """num_heads as an argument of the compiled function: its second value makes it dynamic (a SymInt), and the
    shape checks still trace into one graph (an f-string of it did not: Dynamo's BUILD_STRING)."""
    spec = CELLS[name]
    G = spec.num_gates

    def f(x, weight_ih, weight_hh, bias, num_heads):
        out, state = rnn_layer(name, x, None, weight_ih, weight_hh, *[bias] * len(spec.biases), backend="cpp",
                               num_heads=num_heads)
        return out.sum() + state[0].sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.manual_seed(0)
    x, weight_ih, bias = torch.randn(3, 2, 4), torch.randn(8 * G, 4), torch.randn(8 * G)
    for num_heads in (2, 4, 1, 8):
        weight_hh = torch.randn(8 * G, 8 // num_heads)
        assert_close(compiled(x, weight_ih, weight_hh, bias, num_heads), f(x, weight_ih, weight_hh, bias, num_heads))


@pytest.mark.parametrize("device_backend", DEVICE_BACKENDS)
def test_opcheck_both_ops_with_heads(device_backend, cell):
    """torch.library.opcheck (schema, fake kernels, autograd registration) with num_heads=3, weight_hh the blocks."""
    device, _ = device_backend
    p = head_args(cell, 4, 3, 5, 3, 2, device)
    tensors = (p["input"], *op_states(cell, p["states"]), p["weight_ih"], p["weight_hh"], *p["biases"])
    forward = getattr(torch.ops.lltm, cell.forward_op)
    torch.library.opcheck(forward, (*tensors, None, True, None, 3))
    out = forward(*tensors, None, True, None, 3)
    assert out[0].shape == (4, 3, 6)
    n = cell.op_states
    saved = out[n + 1:]  # [cells], activations
    grads = (torch.randn_like(out[0]), *(torch.randn_like(s) for s in out[1:1 + n]))
    backward = getattr(torch.ops.lltm, cell.backward_op)
    c0 = op_states(cell, p["states"])[1:]
    args = (*grads, p["input"], p["states"][0], *c0, p["weight_ih"], p["weight_hh"], out[0], *saved, None, None, 3)
    torch.library.opcheck(backward, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    assert backward(*args)[1 + n + 1].shape == p["weight_hh"].shape  # grad_weight_hh: the blocks'


def test_the_fake_kernels_check_num_heads_as_the_kernels_do():
    """Meta tensors (torch.compile's and torch.export's tracing) get the C++ op's refusals, not wrong shapes."""
    x, h0, w_ih, w_hh, b = (torch.empty(s, device="meta") for s in ((5, 3, 4), (3, 8), (32, 4), (32, 4), (32,)))
    forward = torch.ops.lltm.lstm_layer_forward
    assert forward(x, h0, h0, w_ih, w_hh, b, b, None, True, None, 2)[0].shape == (5, 3, 8)
    for bad in (0, 3, -1):
        with pytest.raises(RuntimeError, match="num_heads|weight_hh of shape"):
            forward(x, h0, h0, w_ih, w_hh, b, b, None, True, None, bad)
    with pytest.raises(RuntimeError, match="num_heads must be at least 1 and at most hidden_size"):
        forward(torch.randn(5, 3, 4), torch.zeros(3, 8), torch.zeros(3, 8), torch.randn(32, 4), torch.randn(32, 4),
                None, None, None, True, None, 2**62)  # the real kernel: no overflow of 4 * 2**62


def test_dense_weight_hh_checks_one_head_too():
    with pytest.raises(ValueError, match=r"dense_weight_hh: expected weight_hh of shape \(4 \* hidden_size, hidden_size\)"):
        dense_weight_hh("lstm", torch.zeros(5, 3), 1)
    with pytest.raises(TypeError, match="floating-point torch.Tensor, got list"):
        dense_weight_hh("lstm", [[1.0]], 1)
    with pytest.raises(ValueError, match=r"hidden_size \(16, .*\) must be a multiple of num_heads \(3\)"):
        dense_weight_hh("lstm", torch.zeros(64, 4), 3)


def test_per_cell_functions_take_num_heads():
    from lltm_train.functional import gru_cell, lltm_layer, lstm_cell, lstm_layer

    p = head_args(CELLS["lstm"], 4, 2, 3, 2, 3)
    args = (p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"])
    want = rnn_layer("lstm", *args, backend="python", num_heads=2)
    got = lstm_layer(*args, backend="cpp", num_heads=2)
    assert_close(got[0], want[0], **F64)
    assert_close(lstm_cell(p["input"][0], *args[1:], backend="cpp", num_heads=2)[1], rnn_layer(
        "lstm", p["input"][:1], *args[1:], backend="python", num_heads=2)[1][1], **F64)
    q = head_args(CELLS["lltm"], 4, 2, 3, 2, 3)
    assert lltm_layer(q["input"], q["states"], q["weight_ih"], q["weight_hh"], *q["biases"], num_heads=2)[0].shape == (4, 2, 6)
    r = head_args(CELLS["gru"], 1, 2, 3, 3, 2)
    assert gru_cell(r["input"][0], r["states"][0], r["weight_ih"], r["weight_hh"], *r["biases"], num_heads=3).shape == (2, 6)


def test_a_state_dict_of_other_heads_is_named_as_such():
    with pytest.raises(RuntimeError, match=r"weight_hh_l0 is \(32, 4\) in the state dict: if it holds this module's cell "
                                           r"\(LSTM, hidden_size 8\), those are the blocks of num_heads=2; this one has "
                                           r"num_heads=1 \(\(32, 8\)\): build it with the saved model's cell and num_heads"):
        fused.LSTM(5, 8).load_state_dict(fused.LSTM(5, 8, num_heads=2).state_dict())
    # shapes alone cannot tell the cell (a GRU's 3 gates of 8 units have the rows of an LSTM's 4 of 6): the hint is
    # conditional, never an instruction to load another cell's weights
    with pytest.raises(RuntimeError, match=r"if it holds this module's cell \(LSTM, hidden_size 6\)"):
        fused.LSTM(4, 6).load_state_dict(fused.GRU(4, 8, num_heads=4).state_dict())
    # torch.nn.LSTM's proj_size gives weight_hh proj_size columns: PyTorch's own message names weight_hr_l0, and no
    # word of heads is added (it was: "the blocks of num_heads=2")
    with pytest.raises(RuntimeError) as refused:
        fused.LSTM(3, 4).load_state_dict(torch.nn.LSTM(3, 4, proj_size=2).state_dict())
    assert "weight_hr_l0" in str(refused.value) and "num_heads" not in str(refused.value)


@pytest.mark.parametrize("bad", [True, 1.0, 0])
def test_the_model_layer_refuses_a_num_heads_that_is_not_a_positive_int_on_every_backend(bad):
    for backend in ("torch", "cpp"):
        with pytest.raises(ValueError, match="num_heads must be a positive integer"):
            recurrent_layer("lstm", 4, 8, backend=backend, num_heads=bad)


def test_torch_backend_layers_compile_train_and_take_empty_batches():
    """torch.compile runs PyTorch's RNN kernels eagerly inside a compiled module (Inductor failed on
    mkldnn_rnn_layer on the CPU), with heads or not; a batch of 0 rows with lengths gives empty results."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    for heads in (1, 4):
        model = fused.LSTM(10, 16, num_heads=heads, backend="torch")
        x = torch.randn(7, 3, 10)
        out, _ = torch.compile(model)(x)
        out.sum().backward()
        assert_close(out, model(x)[0])
    out, (h, c) = rnn_layer("lstm", torch.randn(4, 0, 5), None, torch.randn(32, 5), torch.randn(32, 8), None, None,
                            lengths=torch.zeros(0, dtype=torch.long), backend="torch")
    assert out.shape == (4, 0, 8) and h.shape == c.shape == (0, 8)


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_float32_at_the_size_where_the_weight_gradient_reads_the_loops_transposed_h(name, full_float32):
    """float32 at T 16, B 12, H 64 (4 heads of 16): the sizes where the CPU loop writes h_{t-1} transposed for the
    weight gradient's GEMM (lltm.cpp's oneDNN path), with lengths; against the python reference."""
    spec = CELLS[name]
    p = head_args(spec, 16, 12, 8, 4, 16)
    p = {k: (tuple(t.detach().float().requires_grad_() if t is not None else None for t in v) if isinstance(v, tuple)
             else v.detach().float().requires_grad_()) for k, v in p.items()}
    lengths = torch.randint(0, 17, (12,))
    upstream = upstream_like(spec, 16, 12, 64, dtype=torch.float32)
    got, want = (results(spec, p, *rnn_layer(spec, p["input"], p["states"], p["weight_ih"], p["weight_hh"],
                                             *p["biases"], lengths=lengths, backend=b, num_heads=4), upstream)
                 for b in ("cpp", "python"))
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-4, atol=1e-4)
