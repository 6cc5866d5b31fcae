"""The networks: shapes per cell, padded batches, argument errors, sampling, parameter counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lltm_train.models import CELLS, CharLM, SequenceClassifier, SequenceRegressor, char_lm, recurrent_layer
from lltm_train import nn as fused
from lltm_train.ops.cells import CELLS as SPECS

# cell, backend pairs: each cell with its reference and its fused CPU kernels, and the torch.nn baselines
CELL_BACKENDS = [(c, b) for c in CELLS for b in ("python", "cpp", "torch") if b != "torch" or SPECS[c].has_torch]
CELL_IDS = [f"{c}-{b}" for c, b in CELL_BACKENDS]


def layer_params(cell: str, i: int, h: int) -> int:
    """Parameters of one recurrent layer and direction: G gate blocks of h rows over the input and h, and a
    bias of G h per bias parameter (the LLTM's one, torch.nn's two)."""
    spec = SPECS[cell]
    return spec.num_gates * h * (i + h) + len(spec.biases) * spec.num_gates * h


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("cell, backend", CELL_BACKENDS, ids=CELL_IDS)
def test_recurrent_layer_builds_the_named_cell(cell, backend):
    layer = recurrent_layer(cell, 3, 5, num_layers=2, dropout=0.1, bidirectional=True, backend=backend)
    if backend == "torch":
        expected_type = getattr(nn, SPECS[cell].torch_module)
    else:
        drop_ins = {"lltm": fused.LLTM, "lstm": fused.LSTM, "gru": fused.GRU, "rnn": fused.RNN, "rnn_relu": fused.RNN,
                    "slstm": fused.SLSTM}
        expected_type = drop_ins.get(cell, fused.RecurrentLayers)  # a cell with no class of its own: the generic one
    assert type(layer) is expected_type
    assert getattr(layer, "nonlinearity", "relu" if cell == "rnn_relu" else "tanh") == ("relu" if cell == "rnn_relu" else "tanh")
    assert (layer.input_size, layer.hidden_size, layer.num_layers, layer.bidirectional) == (3, 5, 2, True)
    assert layer.dropout == pytest.approx(0.1)
    out, _ = layer(torch.randn(7, 2, 3))
    assert out.shape == (7, 2, 10)


def test_recurrent_layer_dropout_is_dropped_with_one_layer():
    # dropout acts between layers only, so one layer gets none (and neither nn.LSTM nor LLTM warns)
    assert recurrent_layer("lstm", 3, 4, num_layers=1, dropout=0.5).dropout == 0.0
    assert recurrent_layer("lltm", 3, 4, num_layers=1, dropout=0.5, backend="python").dropout == 0.0


@pytest.mark.parametrize("cell, backend", CELL_BACKENDS, ids=CELL_IDS)
def test_char_lm_shapes_and_dtypes(cell, backend):
    model = CharLM(vocab_size=11, hidden_size=8, embedding_dim=5, num_layers=2, cell=cell, backend=backend)
    tokens = torch.randint(0, 11, (6, 3))
    logits, state = model(tokens)
    assert logits.shape == (6, 3, 11) and logits.dtype == torch.float32
    h = state[0] if isinstance(state, tuple) else state
    assert h.shape == (2, 3, 8)
    if SPECS[cell].has_cell_state:
        assert isinstance(state, tuple) and state[1].shape == (2, 3, 8)
    # num_classes sets the head's width independently of the vocabulary
    model = CharLM(vocab_size=10, hidden_size=8, embedding_dim=5, num_classes=9, cell=cell, backend=backend)
    assert model(torch.randint(0, 10, (4, 2)))[0].shape == (4, 2, 9)


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine: scripts/test.sh -m cuda)")]),
])
@pytest.mark.parametrize("vocab", [84, char_lm.ONE_HOT_MAX_VOCAB, char_lm.ONE_HOT_MAX_VOCAB + 1])
def test_char_lm_embeds_as_nn_embedding_does(device, vocab, monkeypatch):
    """On a GPU a vocabulary of up to ONE_HOT_MAX_VOCAB ids embeds as a one-hot product: nn.Embedding's rows
    (exactly, in float64 and under bfloat16 autocast) and its weight gradient; larger ones, batches whose
    one-hot matrix would exceed ONE_HOT_MAX_ELEMENTS, and the CPU use nn.Embedding itself."""
    torch.manual_seed(0)
    model = CharLM(vocab, hidden_size=4, embedding_dim=6, backend="python").to(device, torch.float64)
    tokens = torch.randint(0, vocab, (37, 5), device=device)
    tokens[0, :2] = torch.tensor([0, vocab - 1])
    upstream = torch.randn(37, 5, 6, device=device, dtype=torch.float64)
    got = model.embed(tokens)
    one_hot = device == "cuda" and vocab <= char_lm.ONE_HOT_MAX_VOCAB
    assert (type(got.grad_fn).__name__ == "EmbeddingBackward0") is not one_hot
    want = model.embedding(tokens)
    assert torch.equal(got, want)
    (got_grad,) = torch.autograd.grad(got, model.embedding.weight, upstream)
    (want_grad,) = torch.autograd.grad(want, model.embedding.weight, upstream)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)
    if device == "cuda":
        model.float()
        with torch.autocast("cuda", torch.bfloat16):
            got = model.embed(tokens)
        assert got.dtype == (torch.bfloat16 if one_hot else torch.float32)
        assert torch.equal(got.to(torch.bfloat16), model.embedding(tokens).to(torch.bfloat16))
        # a batch whose one-hot matrix would exceed ONE_HOT_MAX_ELEMENTS keeps nn.Embedding (its memory)
        monkeypatch.setattr(char_lm, "ONE_HOT_MAX_ELEMENTS", tokens.numel() * vocab - 1)
        assert type(model.embed(tokens).grad_fn).__name__ == "EmbeddingBackward0"


@pytest.mark.parametrize("cell, backend", CELL_BACKENDS, ids=CELL_IDS)
def test_char_lm_state_carries_over(cell, backend):
    """Running the sequence in two pieces with the state passed on gives the logits of one run."""
    model = CharLM(vocab_size=7, hidden_size=6, embedding_dim=4, num_layers=2, cell=cell, backend=backend).eval()
    tokens = torch.randint(0, 7, (9, 2))
    whole, _ = model(tokens)
    first, state = model(tokens[:4])
    second, _ = model(tokens[4:], state)
    torch.testing.assert_close(torch.cat([first, second]), whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cell, backend", CELL_BACKENDS, ids=CELL_IDS)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("model_cls", [SequenceClassifier, SequenceRegressor])
def test_sequence_models_shapes_with_and_without_lengths(model_cls, bidirectional, cell, backend):
    model = model_cls(4, 3, 8, num_layers=2, bidirectional=bidirectional, cell=cell, backend=backend)
    assert model.head.in_features == 8 * (2 if bidirectional else 1) and model.head.out_features == 3
    x = torch.randn(5, 7, 4)
    out = model(x)
    assert out.shape == (5, 3) and out.dtype == torch.float32
    out = model(x, torch.tensor([7, 3, 1, 5, 7]))
    assert out.shape == (5, 3) and out.dtype == torch.float32 and torch.isfinite(out).all()


@pytest.mark.parametrize("cell, backend", CELL_BACKENDS, ids=CELL_IDS)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_padded_batch_equals_each_sequence_alone(bidirectional, cell, backend):
    """With lengths, every sequence's output is the one it gets alone and unpadded, whatever the padding holds."""
    model = SequenceRegressor(3, 2, 6, num_layers=2, bidirectional=bidirectional, cell=cell, backend=backend).eval()
    lengths = torch.tensor([2, 6, 1, 4])  # unsorted, shortest of one step
    x = torch.randn(4, 6, 3)
    for i, n in enumerate(lengths.tolist()):
        x[i, n:] = 1e3  # garbage past the end: it must be ignored, not just zero
    batched = model(x, lengths)
    for i, n in enumerate(lengths.tolist()):
        alone = model(x[i : i + 1, :n])
        torch.testing.assert_close(batched[i : i + 1], alone, rtol=1e-5, atol=1e-5)
    # and without lengths the padding is read: a different answer for the padded sequences
    assert not torch.allclose(model(x)[0], batched[0])


def test_classifier_lengths_equal_each_sequence_alone_cpp_and_python_agree():
    torch.manual_seed(0)
    a = SequenceClassifier(3, 4, 5, bidirectional=True, backend="python").eval()
    b = SequenceClassifier(3, 4, 5, bidirectional=True, backend="cpp").eval()
    b.load_state_dict(a.state_dict())
    x, lengths = torch.randn(3, 5, 3), torch.tensor([5, 2, 3])
    torch.testing.assert_close(a(x, lengths), b(x, lengths), rtol=1e-5, atol=1e-5)


def test_char_lm_refuses_bidirectional():
    with pytest.raises(ValueError, match="cannot be used to predict the next token"):
        CharLM(10, 8, 4, bidirectional=True)


@pytest.mark.parametrize("build", [
    lambda: recurrent_layer("elman", 3, 4),
    lambda: CharLM(10, 8, 4, cell="transformer"),
    lambda: SequenceClassifier(3, 2, 4, cell="LSTM"),
    lambda: SequenceRegressor(3, 2, 4, cell=""),
], ids=["recurrent_layer", "CharLM", "SequenceClassifier", "SequenceRegressor"])
def test_unknown_cell_names_the_choices(build):
    with pytest.raises(ValueError, match=r"cell must be one of 'lltm', 'lstm', 'gru', 'rnn', 'rnn_relu', 'slstm'"):
        build()
    assert CELLS == tuple(SPECS) == ("lltm", "lstm", "gru", "rnn", "rnn_relu", "slstm")


@pytest.mark.parametrize("kwargs, match", [
    ({"vocab_size": 0}, "vocab_size must be a positive integer"),
    ({"embedding_dim": 0}, "embedding_dim must be a positive integer"),
    ({"dropout": 1.5}, r"dropout must be a number in \[0, 1\]"),
    ({"hidden_size": 0, "cell": "lstm"}, "hidden_size must be a positive integer"),
    ({"bidirectional": 1}, "bidirectional must be True or False"),
])
def test_char_lm_bad_arguments(kwargs, match):
    args = {"vocab_size": 10, "hidden_size": 8, "embedding_dim": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        CharLM(**args)


def test_sequence_model_bad_arguments():
    with pytest.raises(ValueError, match="SequenceClassifier: output_size must be a positive integer, got 0"):
        SequenceClassifier(3, 0, 4)
    with pytest.raises(ValueError, match="SequenceRegressor: bidirectional must be True or False"):
        SequenceRegressor(3, 1, 4, bidirectional="yes")


@pytest.mark.parametrize("cell, backend", CELL_BACKENDS, ids=CELL_IDS)
def test_generate_returns_steps_ids_in_range_reproducibly(cell, backend):
    model = CharLM(vocab_size=6, hidden_size=8, embedding_dim=4, cell=cell, backend=backend).eval()
    out = model.generate([1, 2, 3], 25, temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert len(out) == 25 and all(isinstance(t, int) and 0 <= t < 6 for t in out)
    again = model.generate([1, 2, 3], 25, temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert again == out
    assert model.generate([1], 0) == []


def test_generate_follows_the_model():
    """A head that puts (almost) all mass on one class makes generate return that class every step."""
    model = CharLM(vocab_size=5, hidden_size=4, embedding_dim=3, backend="python")
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 50.0, 0.0]))
    assert model.generate([0, 1], 12, temperature=1.0, generator=torch.Generator().manual_seed(0)) == [3] * 12
    # a different seed draws other tokens from a uniform head
    with torch.no_grad():
        model.head.bias.zero_()
    draws = {tuple(model.generate([0], 30, 1.0, torch.Generator().manual_seed(s))) for s in range(3)}
    assert len(draws) == 3


@pytest.mark.parametrize("cell", CELLS)
def test_char_lm_parameter_count(cell):
    V, E, H, C = 13, 5, 7, 13
    model = CharLM(V, H, E, num_layers=2, cell=cell, backend="python")
    expected = V * E + layer_params(cell, E, H) + layer_params(cell, H, H) + (H * C + C)
    assert n_params(model) == expected


@pytest.mark.parametrize("cell", CELLS)
def test_bidirectional_sequence_model_parameter_count(cell):
    I, H, C = 3, 6, 4
    model = SequenceClassifier(I, C, H, num_layers=2, bidirectional=True, cell=cell, backend="python")
    # two directions per layer; the second layer reads both directions of the first
    expected = 2 * layer_params(cell, I, H) + 2 * layer_params(cell, 2 * H, H) + (2 * H * C + C)
    assert n_params(model) == expected


def test_lstm_and_lltm_of_the_same_width_parameter_counts():
    I, H = 5, 8
    lltm = recurrent_layer("lltm", I, H, backend="python")
    lstm = recurrent_layer("lstm", I, H)
    gru = recurrent_layer("gru", I, H)
    rnn = recurrent_layer("rnn_relu", I, H)
    assert n_params(lltm) == 3 * H * (I + H) + 3 * H == 336
    assert n_params(lstm) == 4 * H * (I + H) + 8 * H == 480
    assert n_params(gru) == 3 * H * (I + H) + 6 * H == 360
    assert n_params(rnn) == H * (I + H) + 2 * H == 120


@pytest.mark.parametrize("backend", ["python", "cpp", "torch"])
def test_forget_bias_sets_every_layers_and_directions_forget_gate(backend):
    torch.manual_seed(0)
    plain = recurrent_layer("lstm", 3, 5, 2, 0.0, True, backend)
    torch.manual_seed(0)
    layer = recurrent_layer("lstm", 3, 5, 2, 0.0, True, backend, forget_bias=1.5)
    forget = slice(5, 10)  # torch.nn's gate order: input, forget, cell, output
    biases = {n: p for n, p in layer.named_parameters() if n.startswith("bias")}
    assert len(biases) == 8  # 2 layers x 2 directions x (bias_ih, bias_hh)
    for name, p in biases.items():
        assert torch.equal(p[forget], torch.full((5,), 1.5 if name.startswith("bias_ih") else 0.0)), name
    for (name, p), q in zip(layer.named_parameters(), plain.parameters()):
        if name.startswith("bias"):  # the other gates keep their initialisation
            assert torch.equal(torch.cat([p[:5], p[10:]]), torch.cat([q[:5], q[10:]])), name
        else:
            assert torch.equal(p, q), name
    # the model: the forget gate opens with the bias (sigmoid(1.5) on a zero input and state)
    model = SequenceClassifier(3, 2, 5, cell="lstm", backend=backend, forget_bias=1.5)
    assert torch.equal(model.rnn.bias_ih_l0[forget], torch.full((5,), 1.5))


@pytest.mark.parametrize("cell", [c for c in CELLS if "forget" not in SPECS[c].gates])
def test_forget_bias_is_refused_for_a_cell_without_a_forget_gate(cell):
    with pytest.raises(ValueError, match=f"the {cell} cell has none"):
        recurrent_layer(cell, 3, 5, forget_bias=1.0)
    with pytest.raises(ValueError, match="forget_bias must be a finite number or null, got inf"):
        recurrent_layer("lstm", 3, 5, forget_bias=float("inf"))


WEIGHT_DROP_CELLS = [(c, b) for c, b in CELL_BACKENDS if c in ("lltm", "lstm", "gru")]


@pytest.mark.parametrize("cell, backend", WEIGHT_DROP_CELLS, ids=[f"{c}-{b}" for c, b in WEIGHT_DROP_CELLS])
def test_weight_drop_masks_the_recurrent_weights_in_training_only(cell, backend):
    torch.manual_seed(0)
    layer = recurrent_layer(cell, 3, 5, 2, 0.0, True, backend, weight_drop=0.4).double()
    x = torch.randn(6, 4, 3, dtype=torch.float64)
    plain = recurrent_layer(cell, 3, 5, 2, 0.0, True, "python").double()
    plain.load_state_dict(layer.state_dict())
    layer.eval()
    torch.testing.assert_close(layer(x)[0], plain(x)[0], rtol=1e-10, atol=1e-10)  # evaluation: the weights as they are
    # training: each weight_hh (layer by layer, forward direction first) times its own mask / (1 - p), drawn
    # from the default generator in that order
    layer.train()
    torch.manual_seed(7)
    out, _ = layer(x)
    torch.manual_seed(7)
    names = [n for n, _ in plain.named_parameters() if n.startswith("weight_hh")]
    G = SPECS[cell].num_gates
    masks = {n: torch.nn.functional.dropout(torch.ones(G * 5, 5, dtype=torch.float64), 0.4) for n in names}
    assert all(set(m.unique().tolist()) == {0.0, 1 / 0.6} for m in masks.values())
    masked = {n: p * masks[n] if n in masks else p for n, p in plain.named_parameters()}
    expected, _ = torch.func.functional_call(plain, masked, (x,))
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    out.sum().backward()  # the mask reaches the gradient: dropped weights get none
    for n in names:
        grad = getattr(layer, n).grad
        assert torch.all(grad[masks[n] == 0] == 0) and grad[masks[n] != 0].abs().sum() > 0, n


@pytest.mark.parametrize("weight_drop, message", [(1.0, "weight_drop must be below 1"), (-0.1, r"weight_drop must be a number in \[0, 1\]"),
                                                  (float("nan"), "weight_drop must be a number")])
@pytest.mark.parametrize("backend", ["python", "torch"])
def test_weight_drop_out_of_range_is_refused(weight_drop, message, backend):
    with pytest.raises(ValueError, match=message):
        recurrent_layer("lstm", 3, 5, backend=backend, weight_drop=weight_drop)
