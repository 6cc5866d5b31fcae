"""LLTM and LLTMCell modules: torch.nn.LSTM's conventions, packed sequences, backends sharing one state dict."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.testing import assert_close

from lltm_train.functional import lltm_cell, lltm_layer
from lltm_train.nn import LLTM, LLTMCell

F64 = dict(rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("num_layers, bidirectional, batch_first", [(1, False, False), (2, True, True), (3, False, True)])
def test_shapes_and_names_follow_nn_lstm(num_layers, bidirectional, batch_first):
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


def test_initialisation_is_uniform_within_one_over_sqrt_hidden():
    m = LLTM(3, 16, num_layers=2)
    for p in m.parameters():
        assert p.abs().max() <= 0.25 and p.std() > 0.1


def test_two_layer_bidirectional_equals_its_composition():
    torch.manual_seed(1)
    m = LLTM(3, 4, num_layers=2, bidirectional=True, dtype=torch.float64, backend="python")
    x = torch.randn(6, 2, 3, dtype=torch.float64)
    h0, c0 = torch.randn(4, 2, 4, dtype=torch.float64), torch.randn(4, 2, 4, dtype=torch.float64)
    out, (h_n, c_n) = m(x, (h0, c0))
    layer_in, hs = x, []
    for layer in range(2):
        fwd, (hf, cf) = lltm_layer(layer_in, (h0[2 * layer], c0[2 * layer]), m.get_parameter(f"weight_ih_l{layer}"),
                                   m.get_parameter(f"weight_hh_l{layer}"), m.get_parameter(f"bias_l{layer}"), backend="python")
        rev, (hr, cr) = lltm_layer(layer_in.flip(0), (h0[2 * layer + 1], c0[2 * layer + 1]),
                                   m.get_parameter(f"weight_ih_l{layer}_reverse"), m.get_parameter(f"weight_hh_l{layer}_reverse"),
                                   m.get_parameter(f"bias_l{layer}_reverse"), backend="python")
        layer_in = torch.cat([fwd, rev.flip(0)], -1)
        hs += [(hf, cf), (hr, cr)]
    assert_close(out, layer_in, **F64)
    assert_close(h_n, torch.stack([h for h, _ in hs]), **F64)
    assert_close(c_n, torch.stack([c for _, c in hs]), **F64)


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequence_final_state_at_true_length(backend, bidirectional):
    m = LLTM(3, 5, num_layers=2, bidirectional=bidirectional, batch_first=True, backend=backend, dtype=torch.float64)
    lengths = torch.tensor([4, 1, 6, 6, 2])
    x = torch.randn(5, 6, 3, dtype=torch.float64, requires_grad=True)
    packed_out, (h_n, c_n) = m(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    out, out_lengths = pad_packed_sequence(packed_out, batch_first=True)
    assert out_lengths.tolist() == lengths.tolist()
    for i, n in enumerate(lengths.tolist()):  # each sequence alone, unpadded
        alone, (h_i, c_i) = m(x[i : i + 1, :n])
        assert_close(out[i, :n], alone[0], **F64)
        assert_close(h_n[:, i], h_i[:, 0], **F64)
        assert_close(c_n[:, i], c_i[:, 0], **F64)
    (out.sum() + h_n.sum()).backward()
    assert torch.all(x.grad[1, 1:] == 0) and torch.all(x.grad[1, 0] != 0)  # padding gets no gradient


def test_packed_sequence_is_one_op_call_per_layer_and_direction(monkeypatch):
    import lltm_train.nn.lltm as module

    calls = []

    def counting(*args, **kwargs):
        calls.append(kwargs.get("lengths"))
        return lltm_layer(*args, **kwargs)

    monkeypatch.setattr(module, "lltm_layer", counting)
    m = LLTM(3, 5, num_layers=2, bidirectional=True, backend="cpp")
    lengths = torch.tensor([7, 1, 4, 4, 2, 6])  # five distinct lengths
    m(pack_padded_sequence(torch.randn(7, 6, 3), lengths, enforce_sorted=False))
    assert len(calls) == 4  # 2 layers x 2 directions, whatever the lengths
    assert all(sorted(c.tolist(), reverse=True) == sorted(lengths.tolist(), reverse=True) for c in calls)


def test_state_dict_moves_between_backends_unchanged():
    torch.manual_seed(2)
    src = LLTM(4, 6, num_layers=2, backend="python", dtype=torch.float64)
    dst = LLTM(4, 6, num_layers=2, backend="cpp", dtype=torch.float64)
    dst.load_state_dict(src.state_dict())
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    for a, b in zip(src(x)[0], dst(x)[0]):
        assert_close(a, b, **F64)
    dst.backend = "python"
    assert_close(dst(x)[0], src(x)[0], **F64)


def test_dropout_only_between_layers_and_only_in_training():
    m = LLTM(3, 8, num_layers=2, dropout=0.5, backend="python")
    x = torch.randn(5, 4, 3)
    m.eval()
    assert_close(m(x)[0], m(x)[0])
    m.train()
    assert not torch.equal(m(x)[0], m(x)[0])
    with pytest.warns(UserWarning, match="does nothing with num_layers=1"):
        LLTM(3, 8, dropout=0.5)


@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_cell_module_matches_functional_and_handles_unbatched(backend):
    cell = LLTMCell(3, 5, backend=backend, dtype=torch.float64)
    x, h, c = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    want = lltm_cell(x, (h, c), cell.weight_ih, cell.weight_hh, cell.bias, backend="python")
    for g, w in zip(cell(x, (h, c)), want):
        assert_close(g, w, **F64)
    h1, c1 = cell(x[0], (h[0], c[0]))
    assert h1.shape == (5,)
    assert_close(h1, want[0][0], **F64)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="hidden_size must be a positive integer, got 0"):
        LLTM(3, 0)
    with pytest.raises(ValueError, match="dropout must be a number in"):
        LLTM(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="unknown LLTM backend 'gpu'"):
        LLTM(3, 4, backend="gpu")
    m = LLTM(3, 4, num_layers=2)
    with pytest.raises(ValueError, match="unknown LLTM backend"):
        m.backend = "fast"
    with pytest.raises(ValueError, match=r"with input_size=3, got \(5, 2, 7\)"):
        m(torch.randn(5, 2, 7))
    with pytest.raises(ValueError, match=r"expected h_0 of shape \(2, 2, 4\)"):
        m(torch.randn(5, 2, 3), (torch.zeros(1, 2, 4), torch.zeros(2, 2, 4)))
    with pytest.raises(ValueError, match=r"LLTMCell: expected input of shape \(B, 3\)"):
        LLTMCell(3, 4)(torch.randn(2, 2, 3))


def test_flags_must_be_booleans_and_packed_sequences_well_formed():
    for kwargs in ({"bidirectional": "no"}, {"batch_first": "no"}, {"bias": "false"}, {"bias": 0}):
        with pytest.raises(ValueError, match="must be True or False"):
            LLTM(4, 5, **kwargs)
    with pytest.raises(ValueError, match="must be True or False"):
        LLTMCell(4, 5, bias="false")
    with pytest.raises(ValueError, match="dropout must be a number in"):
        LLTM(4, 5, num_layers=2, dropout=float("nan"))
    with pytest.raises(ValueError, match="hx must be a tuple"):
        LLTMCell(4, 5)(torch.randn(4), (torch.zeros(5), torch.zeros(5), torch.zeros(5)))
    from torch.nn.utils.rnn import PackedSequence

    m = LLTM(4, 5)
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


@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_compiled_module_on_packed_sequences_of_varying_lengths_matches_eager(backend):
    """torch.compile (inductor) of the module on PackedSequence batches whose lengths change from batch to
    batch: each batch gives what the eager module gives (it used to fail at the second batch)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = LLTM(12, 16, backend=backend)
    compiled = torch.compile(model)
    for lengths in ([5, 3, 2], [7, 7, 1, 4], [6, 2], [1]):
        x = pack_padded_sequence(torch.randn(max(lengths), len(lengths), 12), torch.tensor(lengths), enforce_sorted=False)
        (out, (h, c)), (out_ref, (h_ref, c_ref)) = compiled(x), model(x)
        assert_close(out.data, out_ref.data)
        assert_close(h, h_ref)
        assert_close(c, c_ref)
