"""The modules of every cell of the registry (LLTM, LSTM, GRU, RNN and their cells): torch.nn's conventions and,
for the cells PyTorch has, torch.nn's very parameters and results; packed sequences; backends sharing one state
dict."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence
from torch.testing import assert_close

from conftest import CUDA_READY, CUDA_SKIP_REASON
from lltm_train.functional import rnn_layer
from lltm_train.nn import LLTM, RNN, RNNCell, recurrent_cell, recurrent_layers
from lltm_train.ops.cells import CELLS

F64 = dict(rtol=1e-10, atol=1e-10)
# each cell's layers and one-step module (its drop-in: LLTM, ..., RNN(nonlinearity="relu")), from the registry
MODULES = {name: lambda *a, _n=name, **k: recurrent_layers(_n, *a, **k) for name in CELLS}
CELL_MODULES = {name: lambda *a, _n=name, **k: recurrent_cell(_n, *a, **k) for name in CELLS}
TORCH_CELLS = [name for name, spec in CELLS.items() if spec.has_torch]  # torch.nn has their layer and cell
# the backends that run each cell on a device (cuda only on a GPU machine)
BACKENDS = [pytest.param(("cpu", b), id=b) for b in ("python", "cpp", "torch")] + [
    pytest.param(("cuda", b), id=f"cuda-{b}", marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)])
    for b in ("cuda", "torch")]


def as_tuple(state):
    return state if isinstance(state, tuple) else (state,)


@pytest.mark.parametrize("num_layers, bidirectional, batch_first", [(1, False, False), (2, True, True), (3, False, True)])
def test_lltm_shapes_and_names_follow_nn_lstm(num_layers, bidirectional, batch_first):
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    lltm, lstm = LLTM(5, 7, **kw), torch.nn.LSTM(5, 7, **kw)
    x = torch.randn(4, 6, 5)
    (out, (h, c)), (ref, (h_ref, c_ref)) = lltm(x), lstm(x)
    assert out.shape == ref.shape and h.shape == h_ref.shape and c.shape == c_ref.shape
    # nn.LSTM names its two biases bias_ih/bias_hh; the LLTM has one, and 3 gates instead of 4
    expected = {n.replace("bias_ih", "bias") for n, _ in lstm.named_parameters() if "bias_hh" not in n}
    assert {n for n, _ in lltm.named_parameters()} == expected
    for name, p in lltm.named_parameters():
        assert p.shape[0] == getattr(lstm, name.replace("bias", "bias_ih")).shape[0] // 4 * 3
    unbatched_out, (uh, uc) = lltm(x[0])
    assert unbatched_out.shape == lstm(x[0])[0].shape and uh.shape == (num_layers * (1 + bidirectional), 7)


@pytest.mark.parametrize("name", TORCH_CELLS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("num_layers, bidirectional, batch_first", [(1, False, False), (2, True, True)])
def test_state_dict_is_torch_nn_s_and_moves_both_ways(name, bias, num_layers, bidirectional, batch_first):
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias, dtype=torch.float64)
    ours, theirs = MODULES[name](5, 7, **kw), CELLS[name].torch_layer(5, 7, **kw)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in theirs.named_parameters()]
    ours.load_state_dict(theirs.state_dict())
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
    fresh = MODULES[name](5, 7, **kw)
    theirs.load_state_dict(fresh.state_dict())  # and back
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), theirs.parameters()))


@pytest.mark.parametrize("device_backend", BACKENDS)
@pytest.mark.parametrize("name", TORCH_CELLS)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_float64_outputs_and_gradients_equal_torch_nn(device_backend, name, packed):
    device, backend = device_backend
    kw = dict(num_layers=2, bidirectional=True, dtype=torch.float64, device=device)
    theirs = CELLS[name].torch_layer(5, 7, **kw)
    ours = MODULES[name](5, 7, backend=backend, **kw)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(6, 4, 5, dtype=torch.float64, device=device, requires_grad=True)
    h0 = torch.randn(4, 4, 7, dtype=torch.float64, device=device)
    hx = (h0, torch.randn_like(h0)) if CELLS[name].has_cell_state else h0
    results = []
    for module in (ours, theirs):
        inp = pack_padded_sequence(x, torch.tensor([6, 2, 5, 1]), enforce_sorted=False) if packed else x
        out, state = module(inp, hx)
        out = out.data if packed else out
        loss = (out * torch.linspace(-1, 1, out.shape[-1], dtype=torch.float64, device=device)).sum() + \
            sum((s ** 2).sum() for s in as_tuple(state))
        results.append((out, *as_tuple(state), *torch.autograd.grad(loss, [x, *module.parameters()])))
    for a, b in zip(*results):
        assert_close(a, b, **F64)


@pytest.mark.parametrize("name", list(CELLS))
def test_cell_modules_match_the_layer_and_torch_nn(name):
    spec = CELLS[name]
    m = CELL_MODULES[name](3, 5, dtype=torch.float64)
    x, *states = (torch.randn(2, n, dtype=torch.float64) for n in (3, *(5 for _ in spec.states)))
    states = [s.abs() + 0.5 if name == "n" else s for name, s in zip(spec.states, states)]  # (the sLSTM's n > 0)
    h = states[0]
    hx = tuple(states) if spec.has_cell_state else h
    layer = MODULES[name](3, 5, dtype=torch.float64, backend="python")
    layer.load_state_dict({f"{k}_l0": v for k, v in m.state_dict().items()})
    _, want = layer(x[None], tuple(t[None] for t in as_tuple(hx)) if spec.has_cell_state else h[None])
    for backend in ("python", "cpp", *(("torch",) if spec.has_torch else ())):
        m.backend = backend
        got = as_tuple(m(x, hx))
        for g, w in zip(got, as_tuple(want)):
            assert_close(g, w[0], **F64)
        unbatched = as_tuple(m(x[0], tuple(t[0] for t in as_tuple(hx)) if spec.has_cell_state else h[0]))
        assert unbatched[0].shape == (5,)
        assert_close(unbatched[0], got[0][0], **F64)
    if spec.has_torch:
        theirs = spec.torch_cell(3, 5, dtype=torch.float64)
        theirs.load_state_dict(m.state_dict())
        for g, w in zip(as_tuple(m(x, hx)), as_tuple(theirs(x, hx))):
            assert_close(g, w, **F64)


def test_initialisation_is_uniform_within_one_over_sqrt_hidden(cell):
    """torch.nn's rule: every parameter uniform in [-1/sqrt(hidden_size), 1/sqrt(hidden_size)] = [-0.25, 0.25],
    whose standard deviation is 0.25/sqrt(3) = 0.144. Pooled (the RNN's biases are 16 values each, whose own
    sample deviation fell below 0.1 in one draw)."""
    m = MODULES[cell.name](3, 16, num_layers=2)
    values = torch.cat([p.detach().flatten() for p in m.parameters()])
    assert values.abs().max() <= 0.25 and values.numel() > 800
    assert 0.13 < values.std() < 0.16


def test_two_layer_bidirectional_equals_its_composition(cell):
    torch.manual_seed(1)
    m = MODULES[cell.name](3, 4, num_layers=2, bidirectional=True, dtype=torch.float64, backend="python")
    x = torch.randn(6, 2, 3, dtype=torch.float64)
    state0 = tuple(torch.randn(4, 2, 4, dtype=torch.float64) for _ in cell.states)
    out, state_n = m(x, state0 if cell.has_cell_state else state0[0])
    layer_in, finals = x, []
    for layer in range(2):
        directions = []
        for d, suffix in enumerate((f"_l{layer}", f"_l{layer}_reverse")):
            weights = [m.get_parameter(f"{n}{suffix}") for n in ("weight_ih", "weight_hh", *cell.biases)]
            inp = layer_in if d == 0 else layer_in.flip(0)
            o, s = rnn_layer(cell, inp, tuple(s0[2 * layer + d] for s0 in state0), *weights, backend="python")
            directions.append(o if d == 0 else o.flip(0))
            finals.append(s)
        layer_in = torch.cat(directions, -1)
    assert_close(out, layer_in, **F64)
    for i, s in enumerate(as_tuple(state_n)):
        assert_close(s, torch.stack([f[i] for f in finals]), **F64)


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequence_final_state_at_true_length(cell, backend, bidirectional):
    m = MODULES[cell.name](3, 5, num_layers=2, bidirectional=bidirectional, batch_first=True, backend=backend,
                           dtype=torch.float64)
    lengths = torch.tensor([4, 1, 6, 6, 2])
    x = torch.randn(5, 6, 3, dtype=torch.float64, requires_grad=True)
    packed_out, state = m(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    out, out_lengths = pad_packed_sequence(packed_out, batch_first=True)
    assert out_lengths.tolist() == lengths.tolist()
    for i, n in enumerate(lengths.tolist()):  # each sequence alone, unpadded
        alone, alone_state = m(x[i : i + 1, :n])
        assert_close(out[i, :n], alone[0], **F64)
        for s, a in zip(as_tuple(state), as_tuple(alone_state)):
            assert_close(s[:, i], a[:, 0], **F64)
    (out.sum() + as_tuple(state)[0].sum()).backward()
    assert torch.all(x.grad[1, 1:] == 0)  # padding gets no gradient
    # and the real step gets the gradient of the sequence alone (rows do not interact; a nonzero test failed
    # the ReLU RNN in a draw where every unit of the one step was off, so its gradient is 0 there too)
    x1 = x[1:2, :1].detach().requires_grad_()
    alone, alone_state = m(x1)
    (alone.sum() + as_tuple(alone_state)[0].sum()).backward()
    assert_close(x.grad[1, :1], x1.grad[0], **F64)


def test_packed_sequence_is_one_op_call_per_layer_and_direction(cell, monkeypatch):
    import lltm_train.nn.rnn as module

    calls = []

    def counting(*args, **kwargs):
        calls.append(kwargs.get("lengths"))
        return rnn_layer(*args, **kwargs)

    monkeypatch.setattr(module, "rnn_layer", counting)
    m = MODULES[cell.name](3, 5, num_layers=2, bidirectional=True, backend="cpp")
    lengths = torch.tensor([7, 1, 4, 4, 2, 6])  # five distinct lengths
    m(pack_padded_sequence(torch.randn(7, 6, 3), lengths, enforce_sorted=False))
    assert len(calls) == 4  # 2 layers x 2 directions, whatever the lengths
    assert all(sorted(c.tolist(), reverse=True) == sorted(lengths.tolist(), reverse=True) for c in calls)


def test_state_dict_moves_between_backends_unchanged(cell):
    torch.manual_seed(2)
    src = MODULES[cell.name](4, 6, num_layers=2, backend="python", dtype=torch.float64)
    dst = MODULES[cell.name](4, 6, num_layers=2, backend="cpp", dtype=torch.float64)
    dst.load_state_dict(src.state_dict())
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    assert_close(src(x)[0], dst(x)[0], **F64)
    dst.backend = "python"
    assert_close(dst(x)[0], src(x)[0], **F64)


def test_dropout_only_between_layers_and_only_in_training(cell):
    m = MODULES[cell.name](3, 8, num_layers=2, dropout=0.5, backend="python")
    x = torch.randn(5, 4, 3)
    m.eval()
    assert_close(m(x)[0], m(x)[0])
    m.train()
    assert not torch.equal(m(x)[0], m(x)[0])
    with pytest.warns(UserWarning, match="does nothing with num_layers=1"):
        MODULES[cell.name](3, 8, dropout=0.5)


def test_bad_arguments_raise_clear_errors(cell):
    Module, name = MODULES[cell.name], type(MODULES[cell.name](3, 4)).__name__
    with pytest.raises(ValueError, match="hidden_size must be a positive integer, got 0"):
        Module(3, 0)
    with pytest.raises(ValueError, match="dropout must be a number in"):
        Module(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        Module(3, 4, backend="gpu")
    m = Module(3, 4, num_layers=2)
    with pytest.raises(ValueError, match="unknown backend"):
        m.backend = "fast"
    with pytest.raises(ValueError, match=rf"{name}: expected input of shape .* with input_size=3, got \(5, 2, 7\)"):
        m(torch.randn(5, 2, 7))
    bad = tuple(torch.zeros(1 if i == 0 else 2, 2, 4) for i in range(len(cell.states)))
    with pytest.raises(ValueError, match=r"expected h_0 of shape \(2, 2, 4\)"):
        m(torch.randn(5, 2, 3), bad if cell.has_cell_state else bad[0])
    with pytest.raises(ValueError, match=rf"{type(CELL_MODULES[cell.name](3, 4)).__name__}: expected input of shape \(B, 3\)"):
        CELL_MODULES[cell.name](3, 4)(torch.randn(2, 2, 3))
    # an unbatched input (3,) with a batched state: the shapes the caller passed, not the unsqueezed ones
    batched = tuple(torch.zeros(1, 4) for _ in cell.states)
    with pytest.raises(ValueError, match=r"expected h of shape \(4,\) for input of shape \(3,\), got \(1, 4\)"):
        CELL_MODULES[cell.name](3, 4)(torch.randn(3), batched if cell.has_cell_state else batched[0])
    if cell.name == "lltm":
        with pytest.raises(ValueError, match="PyTorch has no LLTM"):
            LLTM(3, 4, backend="torch")
    with pytest.raises(ValueError, match="hx must be"):
        m(torch.randn(5, 2, 3), [torch.zeros(4, 2, 4)] * 3)
    # a state of the wrong rank for the input: the shape the caller passed, and the rank torch.nn would want
    for x, hx, message in ((torch.randn(5, 3), torch.zeros(2, 1, 4), r"h_0 must be 2-D for unbatched 2-D input, "
                            r"\(num_layers \* num_directions, hidden_size\) = \(2, 4\); got 3-D \(2, 1, 4\)"),
                           (torch.randn(5, 2, 3), torch.zeros(2, 4), r"h_0 must be 3-D for batched input, .* = \(2, 2, "
                            r"4\); got 2-D \(2, 4\)")):
        with pytest.raises(ValueError, match=message):
            m(x, (hx,) * len(cell.states) if cell.has_cell_state else hx)
    with pytest.raises(ValueError, match="proj_size=3 is not supported" if cell.has_cell_state else "proj_size is only for LSTMs"):
        Module(3, 4, proj_size=3)
    assert Module(3, 4, proj_size=0).proj_size == 0  # torch.nn's default, passed by configs written for it


@pytest.mark.parametrize("name", TORCH_CELLS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_torch_nn_introspection_is_torch_nn_s(name, bias):
    """Code written for torch.nn.LSTM / GRU / RNN reads these: the same names and tensors, in the same order."""
    kw = dict(num_layers=2, bidirectional=True, bias=bias)
    ours, theirs = MODULES[name](3, 5, **kw), CELLS[name].torch_layer(3, 5, **kw)
    assert ours._flat_weights_names == theirs._flat_weights_names
    assert ours._all_weights == theirs._all_weights
    assert [[p.shape for p in w] for w in ours.all_weights] == [[p.shape for p in w] for w in theirs.all_weights]
    assert all(p is getattr(ours, n) for p, n in zip(ours._flat_weights, ours._flat_weights_names))
    ours.flatten_parameters()  # called by much torch.nn code in forward: nothing to do, nothing changes
    assert [p.data_ptr() for p in ours.parameters()] == [p.data_ptr() for p in ours._flat_weights]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_jit_trace_of_a_module_runs_other_lengths_or_refuses(cell):
    """torch.jit.trace with its defaults (check_trace on): the cpp backend records one op a layer, which runs
    other lengths and batch sizes and trains; the python backend would record its loop unrolled (a trace
    that runs one length only), so it refuses."""
    torch.manual_seed(0)
    m = MODULES[cell.name](3, 4, num_layers=2, backend="cpp", dtype=torch.float64)
    traced = torch.jit.trace(m, (torch.randn(5, 2, 3, dtype=torch.float64),))
    x = torch.randn(9, 3, 3, dtype=torch.float64, requires_grad=True)
    (out, state), (want, want_state) = traced(x), m(x)
    assert_close(out, want, **F64)
    assert_close(as_tuple(state), as_tuple(want_state), **F64)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    assert_close(grad, torch.autograd.grad(want.square().sum(), x)[0], **F64)
    m.backend = "python"
    with pytest.raises(RuntimeError, match="trace of the python backend records its loop over time step by step, so "
                                           "the trace would run sequences of 5 steps only; trace with backend='cpp'"):
        torch.jit.trace(m, (torch.randn(5, 2, 3, dtype=torch.float64),))


def test_flags_must_be_booleans_and_packed_sequences_well_formed(cell):
    Module, CellModule = MODULES[cell.name], CELL_MODULES[cell.name]
    for kwargs in ({"bidirectional": "no"}, {"batch_first": "no"}, {"bias": "false"}, {"bias": 0}):
        with pytest.raises(ValueError, match="must be True or False"):
            Module(4, 5, **kwargs)
    with pytest.raises(ValueError, match="must be True or False"):
        CellModule(4, 5, bias="false")
    with pytest.raises(ValueError, match="dropout must be a number in"):
        Module(4, 5, num_layers=2, dropout=float("nan"))
    with pytest.raises(ValueError, match="hx must be"):
        CellModule(4, 5)(torch.randn(4), (torch.zeros(5), torch.zeros(5), torch.zeros(5)))
    m = Module(4, 5)
    for sizes in ([], [2, 2, 0], [1, 2]):
        data = torch.randn(sum(sizes), 4)
        with pytest.raises(ValueError, match="PackedSequence is malformed"):
            m(PackedSequence(data, torch.tensor(sizes, dtype=torch.int64)))
    with pytest.raises(ValueError, match="PackedSequence is malformed"):
        m(PackedSequence(torch.randn(4, 4), torch.tensor([[2, 2]])))
    with pytest.raises(ValueError, match="PackedSequence is malformed"):
        m(PackedSequence(torch.randn(4, 4), torch.tensor([2.0, 2.0])))
    with pytest.raises(ValueError, match=r"expected packed data of shape \(N, input_size\)"):
        m(PackedSequence(torch.randn(4), torch.tensor([2, 2])))
    with pytest.raises(ValueError, match="sorted_indices must hold one index per sequence"):
        m(PackedSequence(torch.randn(4, 4), torch.tensor([2, 2]), torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])))


# the python backend's loop compiles step by step, for each length: 25-35 s a cell on 2 cores, so -m slow
@pytest.mark.parametrize("backend", [pytest.param("python", marks=pytest.mark.slow), "cpp"])
def test_compiled_module_on_packed_sequences_of_varying_lengths_matches_eager(cell, backend):
    """torch.compile (inductor) of the module on PackedSequence batches whose lengths change from batch to
    batch: each batch gives what the eager module gives (it used to fail at the second batch)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MODULES[cell.name](12, 16, backend=backend)
    compiled = torch.compile(model)
    for lengths in ([5, 3, 2], [7, 7, 1, 4], [6, 2], [1]):
        x = pack_padded_sequence(torch.randn(max(lengths), len(lengths), 12), torch.tensor(lengths), enforce_sorted=False)
        (out, state), (out_ref, state_ref) = compiled(x), model(x)
        assert_close(out.data, out_ref.data)
        for s, r in zip(as_tuple(state), as_tuple(state_ref)):
            assert_close(s, r)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_takes_torch_nn_rnn_s_arguments_in_its_order(nonlinearity):
    """torch.nn.RNN(input_size, hidden_size, num_layers, nonlinearity, bias, batch_first, dropout, bidirectional),
    positionally too; RNNCell(input_size, hidden_size, bias, nonlinearity); the same results in float64."""
    args = (3, 5, 2, nonlinearity, True, True, 0.0, True)
    ours, theirs = RNN(*args, dtype=torch.float64), torch.nn.RNN(*args, dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())
    assert ours.nonlinearity == theirs.nonlinearity and ours.mode == theirs.mode
    assert ours.cell is CELLS["rnn" if nonlinearity == "tanh" else "rnn_relu"]
    assert ("nonlinearity='relu'" in repr(ours)) == (nonlinearity == "relu")
    x = torch.randn(4, 6, 3, dtype=torch.float64)  # batch_first: (B, T, input_size)
    for backend in ("python", "cpp", "torch"):
        ours.backend = backend
        (out, h), (want, want_h) = ours(x), theirs(x)
        assert_close(out, want, **F64)
        assert_close(h, want_h, **F64)
    cell, their_cell = RNNCell(3, 5, True, nonlinearity, dtype=torch.float64), torch.nn.RNNCell(3, 5, True, nonlinearity, dtype=torch.float64)
    their_cell.load_state_dict(cell.state_dict())
    assert cell.nonlinearity == nonlinearity
    assert_close(cell(x[:, 0]), their_cell(x[:, 0]), **F64)


def test_rnn_refuses_an_unknown_nonlinearity():
    for make in (lambda: RNN(3, 5, nonlinearity="sigmoid"), lambda: RNNCell(3, 5, nonlinearity="sigmoid")):
        with pytest.raises(ValueError, match="unknown nonlinearity 'sigmoid'; select from 'tanh' or 'relu'"):
            make()


def test_a_fixed_cell_refuses_another_and_the_generic_class_needs_one():
    from lltm_train.nn import RecurrentLayers

    with pytest.raises(TypeError, match="LLTM is the lltm cell; cell= is for the generic class"):
        LLTM(3, 4, cell="gru")
    with pytest.raises(TypeError, match="give the cell"):
        RecurrentLayers(3, 4)
    with pytest.raises(ValueError, match="unknown cell 'elman'"):
        RecurrentLayers(3, 4, cell="elman")


@pytest.mark.parametrize("backend", ["python", "torch"])
def test_gradcheck_passes_through_the_parameters_gradient_hooks(cell, backend):
    """torch.autograd.gradcheck (default settings) of the module, its parameters among the inputs; and each
    parameter's gradient hook (nn/_params.py) passes an undefined gradient (None) through, as autograd may hand
    one (issue 41 saw "'NoneType' object has no attribute 'is_cuda'" from it under gradcheck)."""
    if backend == "torch" and not cell.has_torch:
        pytest.skip(f"PyTorch has no {cell.title}")
    m = MODULES[cell.name](3, 4, dtype=torch.float64, backend=backend)
    names = [n for n, _ in m.named_parameters()]
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    weights = [p.detach().clone().requires_grad_() for p in m.parameters()]

    def outputs(x, *weights):
        out, state = torch.func.functional_call(m, dict(zip(names, weights)), (x,))
        return (out, *state) if isinstance(state, tuple) else (out, state)

    assert torch.autograd.gradcheck(outputs, (x, *weights))
    for p in m.parameters():
        hooks = list(p._backward_hooks.values())
        assert hooks and all(hook(None) is None for hook in hooks)


def test_jit_script_is_refused_in_one_line_naming_trace_and_export(cell):
    """TorchScript cannot compile the modules (their backends are chosen in Python): torch.jit.script says so in
    one line that names what works, for the layers and the one-step cell alike."""
    for m in (MODULES[cell.name](3, 4), CELL_MODULES[cell.name](3, 4)):
        with pytest.raises(RuntimeError) as error:
            torch.jit.script(m)
        message = str(error.value)
        assert "\n" not in message and type(m).__name__ in message
        assert "torch.jit.trace" in message and "torch.export" in message


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_directions_on_two_streams_give_what_one_stream_gives(cell, packed, monkeypatch):
    """On a GPU a layer's backward direction runs on a side stream (lltm_train/nn/rnn.py, _overlapped); float64
    outputs, final states and gradients equal those of the same module on one stream."""
    import lltm_train.nn.rnn as rnn

    m = MODULES[cell.name](5, 7, num_layers=2, bidirectional=True, dtype=torch.float64, device="cuda", backend="cuda")
    x = torch.randn(9, 4, 5, dtype=torch.float64, device="cuda")
    lengths = torch.tensor([9, 3, 6, 1])
    sides = []

    def run():
        m.zero_grad()
        inp = x.clone().requires_grad_()
        out, state = m(pack_padded_sequence(inp, lengths, enforce_sorted=False) if packed else inp)
        out = out.data if packed else out
        (out.square().sum() + sum(s.sum() for s in as_tuple(state))).backward()
        return [out, *as_tuple(state), inp.grad, *(p.grad for p in m.parameters())]

    real = rnn._side_stream
    monkeypatch.setattr(rnn, "_side_stream", lambda t: sides.append(real(t)) or sides[-1])
    two = run()
    assert sides and all(isinstance(s, torch.cuda.Stream) for s in sides)
    monkeypatch.setattr(rnn, "_side_stream", lambda t: None)
    one = run()
    for a, b in zip(two, one):
        assert_close(a, b, **F64)
