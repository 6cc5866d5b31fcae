"""The forward that keeps nothing for a backward (``save=False``): under ``torch.no_grad()``, inference mode,
or with nothing that requires grad, the compiled ops write no per-step activations and return the same
outputs, bit for bit, as the forward that saves them (every cell, cpp and cuda); where autograd needs a
backward all the same, they save."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import CUDA_READY, CUDA_SKIP_REASON, forward_args, layer_args, op_states
from lltm_train.functional import rnn_layer
from lltm_train.nn import recurrent_layers
from lltm_train.ops.cells import CELLS

# (T, B, input_size, hidden_size): one step and one row; several rows per CPU thread; on CUDA, H 64 takes the
# persistent kernels (bfloat16, and float32 with TF32) and 200 the stepped path.
SIZES = [(1, 1, 1, 1), (7, 9, 5, 6), (5, 3, 4, 64), (6, 4, 3, 200)]


def dtypes(device):
    return [torch.float64, torch.float32] + ([torch.bfloat16] if device == "cuda" else [])


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "T{}B{}I{}H{}".format(*s))
def test_save_false_gives_the_same_outputs_and_keeps_nothing(device_backend, cell, sizes):
    device, _ = device_backend
    T, B = sizes[:2]
    op = getattr(torch.ops.lltm, cell.forward_op)
    n = cell.op_states
    for dtype in dtypes(device):
        p = layer_args(cell, *sizes, device, dtype=dtype, requires_grad=False)
        for lengths in (None, torch.arange(B) % (T + 1)):  # row lengths 0, 1, ..., every row finished early
            saved = op(*forward_args(cell, p, lengths), True)
            kept = op(*forward_args(cell, p, lengths), False)
            for name, a, b in zip(("output", "h_n", "c_n"), kept[:1 + n], saved[:1 + n]):
                assert torch.equal(a, b), f"{cell.name} {dtype} lengths={lengths}: {name} differs"
            assert [tuple(t.shape) for t in kept[1 + n:]] == [(0,)] * (len(saved) - 1 - n)
            assert all(t.numel() > 0 for t in saved[1 + n:])


def test_opcheck_without_saving(device_backend, cell):
    device, _ = device_backend
    p = layer_args(cell, 3, 2, 4, 5, device, requires_grad=False)
    op = getattr(torch.ops.lltm, cell.forward_op).default
    for lengths in (None, torch.tensor([3, 1])):
        torch.library.opcheck(op, (*forward_args(cell, p, lengths), False))


def test_save_false_still_saves_where_autograd_needs_a_backward(device_backend, cell):
    """save=False is the caller's word that no backward follows; where autograd wants one all the same (an
    input requires grad in grad mode) the op saves, and the gradients are those of save=True."""
    device, _ = device_backend
    p = layer_args(cell, 3, 2, 4, 5, device)  # requires grad
    op = getattr(torch.ops.lltm, cell.forward_op)
    args = forward_args(cell, p, None)  # (once: the sLSTM's packed state is a tensor of this graph)
    leaves = [t for t in args if isinstance(t, torch.Tensor)]
    grads = []
    for save in (True, False):
        out = op(*args, save)[0]
        grads.append(torch.autograd.grad(out.square().sum(), leaves))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    with torch.no_grad():
        out = op(*forward_args(cell, p, None), False)[0]
    assert not out.requires_grad and out.grad_fn is None


def test_backward_of_a_forward_that_saved_nothing_says_so(device_backend, cell):
    device, _ = device_backend
    p = layer_args(cell, 3, 2, 4, 5, device, requires_grad=False)
    result = getattr(torch.ops.lltm, cell.forward_op)(*forward_args(cell, p, None), False)
    n = cell.op_states
    out, finals, saved = result[0], result[1:1 + n], result[1 + n:]
    c0 = op_states(cell, p["states"])[1:]  # the cells with a c state: c0
    args = (torch.randn_like(out), *(torch.randn_like(s) for s in finals), p["input"], p["states"][0], *c0,
            p["weight_ih"], p["weight_hh"], out, *saved, None)
    with pytest.raises(RuntimeError, match=rf"lltm.{cell.backward_op}: the saved tensors are empty: they come from "
                                           r"a forward run with save=False"):
        getattr(torch.ops.lltm, cell.backward_op)(*args)


@pytest.mark.parametrize("name", list(CELLS))
def test_a_module_exported_or_traced_under_no_grad_still_trains(device_backend, name):
    """torch.export and torch.jit.trace under no_grad write save=False into the program as a constant; the
    program, run with grad, still gives torch's gradients (the op saves where autograd needs it)."""
    device, backend = device_backend
    torch.manual_seed(0)
    m = recurrent_layers(name, 4, 6, backend=backend).to(device).double()
    x = torch.randn(5, 3, 4, dtype=torch.float64, device=device)
    with torch.no_grad():
        exported = torch.export.export(m, (x,)).module()
        traced = torch.jit.trace(m, (x,), check_trace=False)
    assert "False" in str(exported.graph)  # the constant is there
    want = torch.autograd.grad(m(x)[0].square().sum(), list(m.parameters()))
    for program, params in ((exported, list(exported.parameters())), (traced, list(traced.parameters()))):
        got = torch.autograd.grad(program(x)[0].square().sum(), params)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


class SaveFlags(TorchDispatchMode):
    """Records the ``save`` argument of every forward op call that reaches a kernel (below autograd)."""

    def __init__(self, op_name):
        super().__init__()
        self.op_name, self.flags = op_name, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.name() == f"lltm::{self.op_name}":
            self.flags.append(args[-1] if isinstance(args[-1], bool) else kwargs.get("save", True))
        return func(*args, **(kwargs or {}))


def test_functional_saves_only_when_autograd_needs_it(device_backend, cell):
    device, backend = device_backend
    p = layer_args(cell, 4, 3, 2, 5, device)
    frozen = layer_args(cell, 4, 3, 2, 5, device, requires_grad=False)
    args = lambda q: (q["input"], q["states"], q["weight_ih"], q["weight_hh"], *q["biases"])  # noqa: E731

    def flags(q, context):
        mode = SaveFlags(cell.forward_op)
        with context(), mode:
            rnn_layer(cell, *args(q), backend=backend)
        return mode.flags

    assert flags(p, torch.enable_grad) == [True]
    assert flags(p, torch.no_grad) == [False]
    assert flags(p, torch.inference_mode) == [False]
    assert flags(p, lambda: _both(torch.inference_mode(), torch.enable_grad())) == [False]  # nothing is recorded
    assert flags(frozen, torch.enable_grad) == [False]  # nothing requires grad
    only_input = {**frozen, "input": frozen["input"].clone().requires_grad_()}
    assert flags(only_input, torch.enable_grad) == [True]


@pytest.mark.parametrize("name", list(CELLS))
def test_module_in_eval_under_no_grad_matches_training_forward(device_backend, name):
    device, backend = device_backend
    torch.manual_seed(0)
    m = recurrent_layers(name, 5, 7, num_layers=2, backend=backend).to(device).double()
    x = torch.randn(6, 3, 5, dtype=torch.float64, device=device)
    with_grad = m(x)
    with torch.no_grad():
        without = m(x)
    for a, b in zip(torch.utils._pytree.tree_leaves(without), torch.utils._pytree.tree_leaves(with_grad)):
        assert torch.equal(a, b.detach())


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)
@pytest.mark.parametrize("H", [64, 200], ids=["persistent", "stepped"])
def test_no_grad_forward_peak_memory_leaves_out_the_saved_tensors(cell, H):
    """Peak CUDA memory of a forward under no_grad is below the training forward's by at least the saved
    tensors' size: the cells (T, B, H) of a cell with a c state, and activations that are not the
    pre-activation buffer itself (the GRU's (T, B, 4 H)); the RNN keeps nothing else, and is left out."""
    T, B, I = 256, 64, 32
    p = layer_args(cell, T, B, I, H, "cuda", dtype=torch.float32)

    def peak(context):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with context():
            out, state = rnn_layer(cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"],
                                   backend="cuda")
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    saved_bytes = T * B * H * 4 * (cell.has_cell_state + (cell.saved if cell.saved != cell.num_gates else 0))
    if saved_bytes == 0:
        pytest.skip(f"the {cell.title}'s forward keeps only its pre-activation buffer, which both forwards allocate")
    training, inference = peak(torch.enable_grad), peak(torch.no_grad)
    assert training - inference >= 0.9 * saved_bytes, (training, inference, saved_bytes)
