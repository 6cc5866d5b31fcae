"""The compiled backends of every cell against the python oracle: values, gradients, registrations, odd inputs.

Each test runs for each cell (lltm, lstm, gru) on the CPU (``cpp``) and, on a GPU machine, on CUDA
(``cuda``: the persistent kernels where one exists for the cell, dtype and hidden size, the stepped path
otherwise, float64 included).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import forward_args, layer_args, op_states, leaves, run_cell, run_layer, upstream_like
import lltm_train.nn
from lltm_train.functional import rnn_cell, rnn_layer

F64 = dict(rtol=1e-10, atol=1e-10)
SIZES = [(1, 1, 1, 1), (5, 3, 7, 5), (3, 4, 10, 129), (17, 2, 3, 8), (4, 9, 6, 64)]  # (T, B, input_size, hidden_size)


def assert_all_close(got, want, **tol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert_close(g, w, **tol)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "T{}B{}I{}H{}".format(*s))
def test_layer_and_cell_match_python_float64(device_backend, cell, sizes, bias):
    device, backend = device_backend
    p = layer_args(cell, *sizes, device, bias=bias)
    up = upstream_like(cell, sizes[0], sizes[1], sizes[3], device)
    assert_all_close(run_layer(cell, p, backend, up), run_layer(cell, p, "python", up), **F64)
    assert_all_close(run_cell(cell, p, backend, up), run_cell(cell, p, "python", up), **F64)


def test_variable_lengths_match_python_and_stop_each_row(device_backend, cell):
    device, backend = device_backend
    T, B, H = 7, 5, 6
    p = layer_args(cell, T, B, 4, H, device)
    up = upstream_like(cell, T, B, H, device)
    lengths = torch.tensor([7, 3, 0, 5, 1])
    got = run_layer(cell, p, backend, up, lengths)
    assert_all_close(got, run_layer(cell, p, "python", up, lengths), **F64)
    out, *state = got[: 1 + len(cell.states)]
    assert torch.all(out[3:, 1] == 0) and torch.all(out[:, 2] == 0)  # finished rows output zeros
    for s, s0 in zip(state, p["states"]):
        assert torch.equal(s[2], s0[2])  # length 0 keeps the initial state
    one = {**p, "input": p["input"][:3, 1:2], "states": tuple(s[1:2] for s in p["states"])}
    alone, alone_state = rnn_layer(cell, one["input"], one["states"], p["weight_ih"], p["weight_hh"], *p["biases"],
                                   backend=backend)
    for s, a in zip(state, alone_state):
        assert_close(s[1], a[0], **F64)  # the state after the row's own last step
    assert_close(out[:3, 1], alone[:, 0], **F64)


def test_padding_never_reaches_a_gradient(device_backend, cell):
    """NaN in the padding past each row's length changes no output and no gradient (every backend, torch's
    LSTM and GRU included), a row of length 0 too."""
    device, backend = device_backend
    T, B, H = 6, 4, 5
    p = layer_args(cell, T, B, 4, H, device)
    lengths = torch.tensor([6, 2, 4, 0])
    up = upstream_like(cell, T, B, H, device)
    backends = (backend, "python", *(("torch",) if cell.has_torch else ()))
    clean = {be: run_layer(cell, p, be, up, lengths) for be in backends}
    with torch.no_grad():
        p["input"][2:, 1] = float("nan")
        p["input"][4:, 2] = float("inf")
        p["input"][:, 3] = float("nan")
    for be in backends:
        assert_all_close(run_layer(cell, p, be, up, lengths), clean[be], rtol=0, atol=0)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_gradcheck_float64(device_backend, cell, bias):
    device, backend = device_backend
    p = layer_args(cell, 4, 3, 5, 6, device, bias=bias)
    n = len(cell.states)

    def layer(x, *rest, lengths=None):
        states, (w_ih, w_hh), biases = rest[:n], rest[n:n + 2], rest[n + 2:]
        biases = biases if bias else (None,) * len(cell.biases)
        out, state = rnn_layer(cell, x, states, w_ih, w_hh, *biases, lengths=lengths, backend=backend)
        return (out, *state)

    def one_step(x, *rest):
        states, (w_ih, w_hh), biases = rest[:n], rest[n:n + 2], rest[n + 2:]
        biases = biases if bias else (None,) * len(cell.biases)
        return rnn_cell(cell, x[0], states, w_ih, w_hh, *biases, backend=backend)

    args = tuple(leaves(p))
    assert torch.autograd.gradcheck(layer, args)
    assert torch.autograd.gradcheck(lambda *a: layer(*a, lengths=torch.tensor([4, 0, 2])), args)
    assert torch.autograd.gradcheck(one_step, args)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_opcheck_both_ops(device_backend, cell, bias):
    device, _ = device_backend
    p = layer_args(cell, 3, 2, 4, 5, device, bias=bias)
    d = layer_args(cell, 3, 2, 4, 5, device, bias=bias, requires_grad=False)
    forward_op = getattr(torch.ops.lltm, cell.forward_op).default
    backward_op = getattr(torch.ops.lltm, cell.backward_op).default
    for lengths in (None, torch.tensor([3, 1])):
        for args in (forward_args(cell, p, lengths), forward_args(cell, d, lengths)):  # with and without autograd
            torch.library.opcheck(forward_op, args)
    result = forward_op(*forward_args(cell, d))
    n = cell.op_states
    out, finals, saved = result[0], result[1:1 + n], result[1 + n:]  # saved: (cells,) activations
    c0 = op_states(cell, d["states"])[1:]  # the cells with a c state: c0
    common = (d["input"], d["states"][0], *c0, d["weight_ih"], d["weight_hh"], out, *saved)
    torch.library.opcheck(backward_op, (torch.randn_like(out), *(torch.randn_like(s) for s in finals), *common, None))
    torch.library.opcheck(backward_op, (None, torch.randn_like(finals[0]), *(None,) * (n - 1), *common,
                                        torch.tensor([2, 3])))
    torch.library.opcheck(backward_op, (torch.randn_like(out), *(torch.randn_like(s) for s in finals), *common, None),
                          {"input_grad": False})


def test_backward_op_without_input_grad(device_backend, cell):
    """input_grad=False leaves grad_input out ((0,)) and every other gradient as it was; under autograd the op
    gets it where the input requires no grad (a first layer's input from data), and the weights' gradients match
    the python oracle's."""
    device, backend = device_backend
    d = layer_args(cell, 5, 3, 4, 6, device, requires_grad=False)
    result = getattr(torch.ops.lltm, cell.forward_op)(*forward_args(cell, d))
    n = cell.op_states
    upstream = [torch.randn_like(t) for t in result[:1 + n]]
    args = (*upstream, d["input"], d["states"][0], *op_states(cell, d["states"])[1:], d["weight_ih"], d["weight_hh"],
            result[0], *result[1 + n:], None)
    backward_op = getattr(torch.ops.lltm, cell.backward_op)
    full, lean = backward_op(*args), backward_op(*args, input_grad=False)
    assert full[0].shape == d["input"].shape and lean[0].shape == (0,)
    assert all(torch.equal(a, b) for a, b in zip(full[1:], lean[1:]))

    p = layer_args(cell, 5, 3, 4, 6, device)
    p["input"].requires_grad_(False)
    up = upstream_like(cell, 5, 3, 6, device)
    calls = []

    class Calls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.name() == f"lltm::{cell.backward_op}":
                calls.append(args[-1])  # input_grad, the last argument (the C++ autograd kernel passes all)
            return func(*args, **(kwargs or {}))

    def run(backend):
        out, state = rnn_layer(cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"],
                               backend=backend)
        loss = sum((r * u).sum() for r, u in zip((out, *state), up))
        return (out, *state, *torch.autograd.grad(loss, leaves(p)[1:]))  # all but the input

    with Calls():
        got = run(backend)
    assert calls == [False]
    assert_all_close(got, run("python"), **F64)


def test_noncontiguous_and_expanded_inputs(device_backend, cell):
    device, backend = device_backend
    T, B, I, H = 6, 3, 5, 7
    G = cell.num_gates
    kw = dict(dtype=torch.float64, device=device)
    x = torch.randn(B, T, I, **kw).transpose(0, 1).requires_grad_()  # time-major view of batch-first data
    states = [torch.randn(1, H, **kw).expand(B, H).requires_grad_()]  # stride 0
    for name in cell.states[1:]:  # transposed (the sLSTM's n positive)
        c = torch.randn(H, B, **kw).t()
        states.append((c.abs() + 0.5 if name == "n" else c).detach().requires_grad_())
    w_ih = torch.randn(I, G * H, **kw).t().requires_grad_()
    w_hh = torch.randn(G * H, 2 * H, **kw)[:, ::2].requires_grad_()  # strided columns
    biases = [torch.randn(1, **kw).expand(G * H).requires_grad_() for _ in cell.biases]
    inputs = (x, *states, w_ih, w_hh, *biases)
    results = {}
    for be in (backend, "python"):
        out, state = rnn_layer(cell, x, tuple(states), w_ih, w_hh, *biases, backend=be)
        # sum() hands the backward an expanded (stride 0) gradient
        results[be] = (out, *state, *torch.autograd.grad(out.sum() + sum((s * (i + 1)).sum() for i, s in enumerate(state)), inputs))
        new = rnn_cell(cell, x[0], tuple(states), w_ih, w_hh, *biases, backend=be)
        results[be] += (*new, *torch.autograd.grad(sum(s.sum() for s in new), inputs))
    assert_all_close(results[backend], results["python"], **F64)


def test_strided_and_expanded_bias_at_onednn_sizes(device_backend, cell, full_float32):
    """A bias that is a strided view or an expanded (stride 0) tensor, at sizes where the CPU's input projection
    goes to oneDNN (float32, T B I G H >= 2^21), which takes a bias by its storage: it once read a strided bias as
    if contiguous (a wrong answer) and an expanded one past its storage (NaN)."""
    device, backend = device_backend
    T, B, I, H = 8, 32, 128, 64
    G = cell.num_gates
    p = layer_args(cell, T, B, I, H, device, dtype=torch.float32, requires_grad=False)
    for bias in (torch.randn(2 * G * H, device=device)[::2], torch.randn(1, device=device).expand(G * H)):
        biases = (bias,) + (None,) * (len(cell.biases) - 1)  # one bias: the sum of the two is no longer a view
        got = rnn_layer(cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *biases, backend=backend)
        want = rnn_layer(cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *biases, backend="python")
        for g, w in zip((got[0], *got[1]), (want[0], *want[1])):
            assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_relu_gradient_passes_where_the_output_is_nan(device_backend):
    """The ReLU RNN's backward zeroes the gradient only where the output is <= 0, as torch's relu backward
    (threshold_backward): where a step's output is NaN (inf - inf from an infinite input), dh passes."""
    from lltm_train.ops.cells import CELLS

    cell = CELLS["rnn_relu"]
    device, backend = device_backend
    p = layer_args(cell, 5, 3, 2, 6, device)
    with torch.no_grad():
        p["input"][2, 1] = torch.tensor([float("inf"), float("-inf")])
        p["weight_ih"][:3] = 1.0  # units 0-2 of row 1 at step 2: inf - inf = NaN
    up = upstream_like(cell, 5, 3, 6, device)
    got, want = run_layer(cell, p, backend, up), run_layer(cell, p, "python", up)
    assert torch.isnan(got[0][2, 1, :3]).all()
    assert_all_close(got, want, equal_nan=True, **F64)


def test_batch_one_and_zero(device_backend, cell):
    device, backend = device_backend
    p = layer_args(cell, 4, 1, 3, 5, device)
    up = upstream_like(cell, 4, 1, 5, device)
    assert_all_close(run_layer(cell, p, backend, up), run_layer(cell, p, "python", up), **F64)
    p = layer_args(cell, 4, 0, 3, 5, device)
    out, state = rnn_layer(cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"], backend=backend)
    assert out.shape == (4, 0, 5) and all(s.shape == (0, 5) for s in state)
    (out.sum() + state[0].sum()).backward()
    G = cell.num_gates
    assert p["weight_hh"].grad.shape == (G * 5, 5) and torch.all(p["weight_hh"].grad == 0)
    assert all(torch.all(b.grad == 0) for b in p["biases"])


def test_batch_zero_on_the_torch_backend_trains_as_torch_nn(cell):
    """An empty batch: torch.nn's layers give results in the autograd graph, so a training step's backward runs
    and gives zero gradients; the torch backend gave results with no graph ("does not require grad")."""
    if not cell.has_torch:
        pytest.skip(f"PyTorch has no {cell.title}")
    p = layer_args(cell, 4, 0, 3, 5, "cpu")
    out, state = rnn_layer(cell, p["input"], None, p["weight_ih"], p["weight_hh"], *p["biases"], backend="torch")
    assert out.shape == (4, 0, 5) and all(s.shape == (0, 5) for s in state)
    (out.sum() + state[0].sum()).backward()
    assert all(torch.equal(w.grad, torch.zeros_like(w)) for w in (p["weight_ih"], p["weight_hh"], *p["biases"]))
    step = lltm_train.nn.RecurrentCell(3, 5, cell=cell, backend="torch")
    h = step(torch.randn(0, 3))
    (h[0] if isinstance(h, tuple) else h).sum().backward()
    assert torch.equal(step.weight_hh.grad, torch.zeros_like(step.weight_hh))


@pytest.mark.parametrize("num_heads", [1, 2])
@pytest.mark.parametrize("backend", ["python", "cpp", "torch"])
def test_hidden_size_zero_gives_empty_results_on_every_backend(cell, backend, num_heads):
    """H = 0 through the functional API: an empty output and state and a zero input gradient on every CPU
    backend (torch's own kernels refuse H = 0, so the torch backend answers as the reference does); with 2
    heads too (0 is a multiple of 2: the reference accepts it, and the C++ op did not)."""
    if backend == "torch" and (not cell.has_torch or num_heads > 1):
        pytest.skip(f"PyTorch has no {cell.title}" if not cell.has_torch else "torch.nn has no heads")
    G = cell.num_gates
    x = torch.randn(4, 3, 2, requires_grad=True)  # float32: oneDNN's LSTM (torch on a CPU) refused H = 0
    weights = [torch.zeros(G * 0, 2), torch.zeros(0, 0)]
    biases = [torch.zeros(0) for _ in cell.biases]
    out, state = rnn_layer(cell, x, None, *weights, *biases, backend=backend, num_heads=num_heads)
    assert out.shape == (4, 3, 0) and all(s.shape == (3, 0) for s in state)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_unused_outputs_get_no_gradient_work(device_backend, cell):
    """Backward from h_n alone: right gradients, and no zero-filled gradient buffers for the unused outputs."""
    device, backend = device_backend
    p = layer_args(cell, 5, 2, 3, 4, device)
    grads = {}
    for be in (backend, "python"):
        _, state = rnn_layer(cell, p["input"], None, p["weight_ih"], p["weight_hh"], *p["biases"], backend=be)
        with torch.profiler.profile(record_shapes=True) as prof:
            grads[be] = torch.autograd.grad(state[0].sum(), [p["input"], p["weight_hh"]])
        if be != "python":
            assert f"lltm::{cell.backward_op}" in {e.name for e in prof.events()}
            fills = [(e.name, e.input_shapes) for e in prof.events() if e.name in ("aten::zeros", "aten::fill_", "aten::zero_")]
            big = [f for f in fills if any(math.prod(s) >= 5 * 2 * 4 for s in f[1] if s)]  # (T, B, H) or more
            assert not big, big
    assert_all_close(grads[backend], grads["python"], **F64)


def test_backward_twice_with_retain_graph(device_backend, cell):
    device, backend = device_backend
    p = layer_args(cell, 5, 2, 3, 4, device)
    out, _ = rnn_layer(cell, p["input"], None, p["weight_ih"], p["weight_hh"], *p["biases"], backend=backend)
    weights = [p["weight_ih"], p["weight_hh"], *p["biases"]]
    first = torch.autograd.grad(out.pow(2).sum(), weights, retain_graph=True)
    second = torch.autograd.grad(out.pow(2).sum(), weights)
    assert_all_close(first, second, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lower_precision_close_to_float64(device_backend, cell, dtype):
    device, backend = device_backend
    p = layer_args(cell, 8, 4, 6, 64, device, dtype=dtype, requires_grad=False)
    out, state = rnn_layer(cell, p["input"], p["states"], p["weight_ih"], p["weight_hh"], *p["biases"], backend=backend)
    exact = {k: (tuple(t.double() for t in v) if isinstance(v, tuple) else v.double()) for k, v in p.items()}
    ref, ref_state = rnn_layer(cell, exact["input"], exact["states"], exact["weight_ih"], exact["weight_hh"],
                               *exact["biases"], backend="python")  # the same rounded inputs, in float64
    assert out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}[dtype]
    for g, w in zip((out, *state), (ref, *ref_state)):
        assert_close(g.double(), w, rtol=tol, atol=tol)


def test_float32_gradients_close_to_python(device_backend, cell, full_float32):
    device, backend = device_backend
    p = layer_args(cell, 20, 8, 16, 128, device, dtype=torch.float32)
    up = upstream_like(cell, 20, 8, 128, device, torch.float32)
    assert_all_close(run_layer(cell, p, backend, up), run_layer(cell, p, "python", up), rtol=1e-4, atol=1e-4)


def test_float32_with_lengths_and_non_finite_padding_close_to_python(device_backend, cell, full_float32):
    # Sizes that send the CPU's weight gradients to oneDNN, from the loop's transposed h_{t-1} and input
    # (zeros for the padding, even where the input is NaN there).
    device, backend = device_backend
    T, B, I, H = 12, 9, 16, 96
    p = layer_args(cell, T, B, I, H, device, dtype=torch.float32)
    with torch.no_grad():
        p["input"][5:, 2] = float("nan")
    lengths = torch.tensor([12, 7, 5, 0, 12, 1, 9, 12, 3])
    up = upstream_like(cell, T, B, H, device, torch.float32)
    got = run_layer(cell, p, backend, up, lengths)
    assert all(torch.isfinite(g).all() for g in got)
    assert_all_close(got, run_layer(cell, p, "python", up, lengths), rtol=1e-4, atol=1e-4)


def test_autocast_runs_in_the_autocast_dtype(device_backend, cell):
    device, backend = device_backend
    p = layer_args(cell, 3, 2, 4, 5, device, dtype=torch.float32)
    with torch.autocast(device, dtype=torch.bfloat16):
        out, state = rnn_layer(cell, p["input"], None, p["weight_ih"], p["weight_hh"], *p["biases"], backend=backend)
    assert out.dtype == torch.bfloat16 and state[0].dtype == torch.bfloat16
    out.float().sum().backward()
    assert p["weight_hh"].grad.dtype == torch.float32 and torch.isfinite(p["weight_hh"].grad).all()
    # float64 is left alone, as autocast leaves it for torch.nn.Linear and torch.nn.LSTM (it was cast to bfloat16)
    p = layer_args(cell, 3, 2, 4, 5, device, dtype=torch.float64, requires_grad=False)
    args = (p["input"], None, p["weight_ih"], p["weight_hh"], *p["biases"])
    with torch.autocast(device, dtype=torch.bfloat16):
        out, state = rnn_layer(cell, *args, backend=backend)
    assert out.dtype == torch.float64 and state[0].dtype == torch.float64
    assert torch.equal(out, rnn_layer(cell, *args, backend=backend)[0])


def test_non_finite_inputs_propagate_as_in_python(device_backend, cell):
    device, backend = device_backend
    p = layer_args(cell, 4, 3, 5, 6, device, dtype=torch.float32, requires_grad=False)
    x = p["input"].clone()
    x[1, 0, 2] = float("nan")
    x[2, 1, 0] = float("inf")
    got = rnn_layer(cell, x, None, p["weight_ih"], p["weight_hh"], *p["biases"], backend=backend)[0]
    want = rnn_layer(cell, x, None, p["weight_ih"], p["weight_hh"], *p["biases"], backend="python")[0]
    assert torch.equal(torch.isnan(got), torch.isnan(want))  # NaN stays NaN, never a plausible number
    assert torch.isnan(got[1:, 0]).all() and torch.isfinite(got[:, 2]).all()
    assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-5, atol=1e-5)


def test_outputs_are_bitwise_identical_from_run_to_run(device_backend, cell):
    device, backend = device_backend
    p = layer_args(cell, 33, 10, 7, 64, device, dtype=torch.float32)
    up = upstream_like(cell, 33, 10, 64, device, torch.float32)
    first, second = run_layer(cell, p, backend, up), run_layer(cell, p, backend, up)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def _op_library() -> Path:
    """The file of the loaded op library: the installed module, or the just-in-time build."""
    module = sys.modules.get("lltm_train._C")
    if module is not None:
        return Path(module.__file__)
    return Path(next(p for p in torch.ops.loaded_libraries if "lltm" in Path(p).name))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_the_cpu_loop_splits_its_rows_over_threads_and_its_results_do_not_depend_on_how_many(cell, dtype):
    # Without -fopenmp ATen's parallel_for (a header template) compiles to a serial loop: until 2026-12-02
    # the CPU recurrence ran on one thread, unnoticed. An OpenMP build calls GOMP_parallel.
    assert b"GOMP_parallel" in _op_library().read_bytes()
    T, B, I, H = 9, 37, 5, 72  # 37 rows: blocks of 37, 19 + 18 and 13 + 13 + 11; H: a narrower last panel
    p = layer_args(cell, T, B, I, H, dtype=dtype)
    up = upstream_like(cell, T, B, H, dtype=dtype)
    lengths = torch.randint(0, T + 1, (B,))
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(run_layer(cell, p, "cpp", up, lengths))
    finally:
        torch.set_num_threads(threads)
    states = 1 + len(cell.states)
    for other in results[1:]:
        if dtype == torch.float32:  # brgemm computes a row alike in any block of rows: bitwise equal
            assert all(torch.equal(a, b) for a, b in zip(results[0][:states], other[:states]))
        # MKL's float64 GEMMs (per step, and the weight gradients') round by the block's size and threads
        assert_all_close(other, results[0], **(F64 if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)))


def test_the_cpu_ops_run_under_inference_mode(cell):
    # The time loop runs on OpenMP's threads, which do not inherit the caller's inference mode: ATen in-place
    # ops there on the op's own (inference) outputs raised "Inplace update to inference tensor".
    p = layer_args(cell, 4, 6, 3, 5, requires_grad=False)
    want = getattr(torch.ops.lltm, cell.forward_op)(*forward_args(cell, p))
    n = cell.op_states
    c0 = op_states(cell, p["states"])[1:]  # the cells with a c state: c0
    upstream = [torch.randn_like(t) for t in want[:1 + n]]
    args = (*upstream, p["input"], p["states"][0], *c0, p["weight_ih"], p["weight_hh"], want[0], *want[1 + n:], None)
    want_grads = getattr(torch.ops.lltm, cell.backward_op)(*args)
    with torch.inference_mode():
        got = getattr(torch.ops.lltm, cell.forward_op)(*forward_args(cell, p))
        got_grads = getattr(torch.ops.lltm, cell.backward_op)(*args)
    assert all(torch.equal(a, b) for a, b in zip((*got, *got_grads), (*want, *want_grads)))
