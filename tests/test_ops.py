"""The compiled backends against the python oracle: values, gradients, registrations, odd inputs.

Each test runs on the CPU (``cpp``) and, on a GPU machine, on CUDA (``cuda``: persistent kernels for
hidden sizes 64, 128 and 256 in float32/16-bit and 512 in 16-bit, the stepped path otherwise, float64
included).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from lltm_train.functional import lltm_cell, lltm_layer

F64 = dict(rtol=1e-10, atol=1e-10)
SIZES = [(1, 1, 1, 1), (5, 3, 7, 5), (3, 4, 10, 129), (17, 2, 3, 8), (4, 9, 6, 64)]  # (T, B, input_size, hidden_size)


def make(T, B, I, H, device, dtype=torch.float64, bias=True, requires_grad=True):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, dtype=dtype, device=device) * scale).requires_grad_(requires_grad)

    return dict(input=rnd(T, B, I), h0=rnd(B, H, scale=0.5), c0=rnd(B, H), weight_ih=rnd(3 * H, I, scale=I**-0.5),
                weight_hh=rnd(3 * H, H, scale=H**-0.5), bias=rnd(3 * H) if bias else None)


def leaves(p):
    return [t for t in p.values() if t is not None]


def run_layer(p, backend, upstream, lengths=None):
    out, (h_n, c_n) = lltm_layer(p["input"], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"],
                                 lengths=lengths, backend=backend)
    loss = (out * upstream[0]).sum() + (h_n * upstream[1]).sum() + (c_n * upstream[2]).sum()
    return (out, h_n, c_n, *torch.autograd.grad(loss, leaves(p)))


def run_cell(p, backend, upstream):
    h1, c1 = lltm_cell(p["input"][0], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    loss = (h1 * upstream[1]).sum() + (c1 * upstream[2]).sum()
    return (h1, c1, *torch.autograd.grad(loss, leaves(p)))


def upstream_like(T, B, H, device, dtype=torch.float64):
    return [torch.randn(T, B, H, dtype=dtype, device=device), torch.randn(B, H, dtype=dtype, device=device),
            torch.randn(B, H, dtype=dtype, device=device)]


def assert_all_close(got, want, **tol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert_close(g, w, **tol)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "T{}B{}I{}H{}".format(*s))
def test_layer_and_cell_match_python_float64(device_backend, sizes, bias):
    device, backend = device_backend
    p = make(*sizes, device, bias=bias)
    up = upstream_like(sizes[0], sizes[1], sizes[3], device)
    assert_all_close(run_layer(p, backend, up), run_layer(p, "python", up), **F64)
    assert_all_close(run_cell(p, backend, up), run_cell(p, "python", up), **F64)


def test_variable_lengths_match_python_and_stop_each_row(device_backend):
    device, backend = device_backend
    T, B, H = 7, 5, 6
    p = make(T, B, 4, H, device)
    up = upstream_like(T, B, H, device)
    lengths = torch.tensor([7, 3, 0, 5, 1])
    got = run_layer(p, backend, up, lengths)
    assert_all_close(got, run_layer(p, "python", up, lengths), **F64)
    out, h_n, c_n = got[:3]
    assert torch.all(out[3:, 1] == 0) and torch.all(out[:, 2] == 0)  # finished rows output zeros
    assert_close(h_n[2], p["h0"][2]) and assert_close(c_n[2], p["c0"][2])  # length 0 keeps the initial state
    alone, (h_1, _) = lltm_layer(p["input"][:3, 1:2], (p["h0"][1:2], p["c0"][1:2]), p["weight_ih"], p["weight_hh"],
                                 p["bias"], backend=backend)
    assert_close(h_n[1], h_1[0], **F64)  # the state after the row's own last step
    assert_close(out[:3, 1], alone[:, 0], **F64)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_gradcheck_float64(device_backend, bias):
    device, backend = device_backend
    p = make(4, 3, 5, 6, device, bias=bias)

    def layer(x, h0, c0, w_ih, w_hh, b=None, lengths=None):
        out, (h_n, c_n) = lltm_layer(x, (h0, c0), w_ih, w_hh, b, lengths=lengths, backend=backend)
        return out, h_n, c_n

    def cell(x, h0, c0, w_ih, w_hh, b=None):
        return lltm_cell(x[0], (h0, c0), w_ih, w_hh, b, backend=backend)

    assert torch.autograd.gradcheck(layer, tuple(leaves(p)))
    assert torch.autograd.gradcheck(lambda *a: layer(*a, lengths=torch.tensor([4, 0, 2])), tuple(leaves(p)))
    assert torch.autograd.gradcheck(cell, tuple(leaves(p)))


def forward_args(p, lengths=None):
    return (p["input"], p["h0"], p["c0"], p["weight_ih"], p["weight_hh"], p["bias"], lengths)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_opcheck_both_ops(device_backend, bias):
    device, _ = device_backend
    p = make(3, 2, 4, 5, device, bias=bias)
    detached = {k: (v.detach() if v is not None else None) for k, v in p.items()}
    for lengths in (None, torch.tensor([3, 1])):
        for args in (forward_args(p, lengths), forward_args(detached, lengths)):  # with and without autograd
            torch.library.opcheck(torch.ops.lltm.layer_forward.default, args)
    d = detached
    out, h_n, c_n, cells, activations = torch.ops.lltm.layer_forward(*forward_args(d))
    common = (d["input"], d["h0"], d["weight_ih"], d["weight_hh"], out, cells, activations)
    torch.library.opcheck(torch.ops.lltm.layer_backward.default,
                          (torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n), *common, None))
    torch.library.opcheck(torch.ops.lltm.layer_backward.default, (None, torch.randn_like(h_n), None, *common,
                                                                  torch.tensor([2, 3])))


def test_noncontiguous_and_expanded_inputs(device_backend):
    device, backend = device_backend
    T, B, I, H = 6, 3, 5, 7
    kw = dict(dtype=torch.float64, device=device)
    x = torch.randn(B, T, I, **kw).transpose(0, 1).requires_grad_()  # time-major view of batch-first data
    h0 = torch.randn(1, H, **kw).expand(B, H).requires_grad_()  # stride 0
    c0 = torch.randn(H, B, **kw).t().requires_grad_()  # transposed
    w_ih = torch.randn(I, 3 * H, **kw).t().requires_grad_()
    w_hh = torch.randn(3 * H, 2 * H, **kw)[:, ::2].requires_grad_()  # strided columns
    b = torch.randn(1, **kw).expand(3 * H).requires_grad_()
    inputs = (x, h0, c0, w_ih, w_hh, b)
    results = {}
    for be in (backend, "python"):
        out, (h_n, c_n) = lltm_layer(x, (h0, c0), w_ih, w_hh, b, backend=be)
        # sum() hands the backward an expanded (stride 0) gradient
        results[be] = (out, h_n, c_n, *torch.autograd.grad(out.sum() + h_n.sum() + (c_n * 2).sum(), inputs))
        h1, c1 = lltm_cell(x[0], (h0, c0), w_ih, w_hh, b, backend=be)
        results[be] += (h1, c1, *torch.autograd.grad(h1.sum() + c1.sum(), inputs))
    assert_all_close(results[backend], results["python"], **F64)


def test_batch_one_and_zero(device_backend):
    device, backend = device_backend
    p = make(4, 1, 3, 5, device)
    up = upstream_like(4, 1, 5, device)
    assert_all_close(run_layer(p, backend, up), run_layer(p, "python", up), **F64)
    p = make(4, 0, 3, 5, device)
    out, (h_n, c_n) = lltm_layer(p["input"], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    assert out.shape == (4, 0, 5) and h_n.shape == (0, 5) and c_n.shape == (0, 5)
    (out.sum() + h_n.sum()).backward()
    assert p["weight_hh"].grad.shape == (15, 5) and torch.all(p["weight_hh"].grad == 0)
    assert torch.all(p["bias"].grad == 0)


def test_unused_outputs_get_no_gradient_work(device_backend):
    """Backward from h_n alone: right gradients, and no zero-filled gradient buffers for the unused outputs."""
    device, backend = device_backend
    p = make(5, 2, 3, 4, device)
    grads = {}
    for be in (backend, "python"):
        _, (h_n, _) = lltm_layer(p["input"], None, p["weight_ih"], p["weight_hh"], p["bias"], backend=be)
        with torch.profiler.profile(record_shapes=True) as prof:
            grads[be] = torch.autograd.grad(h_n.sum(), [p["input"], p["weight_hh"]])
        if be != "python":
            assert "lltm::layer_backward" in {e.name for e in prof.events()}
            fills = [(e.name, e.input_shapes) for e in prof.events() if e.name in ("aten::zeros", "aten::fill_", "aten::zero_")]
            big = [f for f in fills if any(math.prod(s) >= 5 * 2 * 4 for s in f[1] if s)]  # (T, B, H) or more
            assert not big, big
    assert_all_close(grads[backend], grads["python"], **F64)


def test_backward_twice_with_retain_graph(device_backend):
    device, backend = device_backend
    p = make(5, 2, 3, 4, device)
    out, _ = lltm_layer(p["input"], None, p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    first = torch.autograd.grad(out.pow(2).sum(), leaves(p)[3:], retain_graph=True)
    second = torch.autograd.grad(out.pow(2).sum(), leaves(p)[3:])
    assert_all_close(first, second, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lower_precision_close_to_float64(device_backend, dtype):
    device, backend = device_backend
    p64 = make(8, 4, 6, 64, device, requires_grad=False)
    p = {k: v.to(dtype) for k, v in p64.items()}
    exact = {k: v.double() for k, v in p.items()}  # the same rounded inputs, computed in float64
    out, (h_n, c_n) = lltm_layer(p["input"], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    ref, (h_ref, c_ref) = lltm_layer(exact["input"], (exact["h0"], exact["c0"]), exact["weight_ih"],
                                     exact["weight_hh"], exact["bias"], backend="python")
    assert out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}[dtype]
    for g, w in ((out, ref), (h_n, h_ref), (c_n, c_ref)):
        assert_close(g.double(), w, rtol=tol, atol=tol)


def test_float32_gradients_close_to_python(device_backend, full_float32):
    device, backend = device_backend
    p = make(20, 8, 16, 128, device, dtype=torch.float32)
    up = upstream_like(20, 8, 128, device, torch.float32)
    assert_all_close(run_layer(p, backend, up), run_layer(p, "python", up), rtol=1e-4, atol=1e-4)


def test_autocast_runs_in_the_autocast_dtype(device_backend):
    device, backend = device_backend
    p = make(3, 2, 4, 5, device, dtype=torch.float32)
    with torch.autocast(device, dtype=torch.bfloat16):
        out, (h_n, _) = lltm_layer(p["input"], None, p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    assert out.dtype == torch.bfloat16 and h_n.dtype == torch.bfloat16
    out.float().sum().backward()
    assert p["weight_hh"].grad.dtype == torch.float32 and torch.isfinite(p["weight_hh"].grad).all()


def test_non_finite_inputs_propagate_as_in_python(device_backend):
    device, backend = device_backend
    p = make(4, 3, 5, 6, device, dtype=torch.float32, requires_grad=False)
    x = p["input"].clone()
    x[1, 0, 2] = float("nan")
    x[2, 1, 0] = float("inf")
    got = lltm_layer(x, None, p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)[0]
    want = lltm_layer(x, None, p["weight_ih"], p["weight_hh"], p["bias"], backend="python")[0]
    assert torch.equal(torch.isnan(got), torch.isnan(want))  # NaN stays NaN, never a plausible number
    assert torch.isnan(got[1:, 0]).all() and torch.isfinite(got[:, 2]).all()
    assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-5, atol=1e-5)


def test_outputs_are_bitwise_identical_from_run_to_run(device_backend):
    device, backend = device_backend
    p = make(33, 10, 7, 64, device, dtype=torch.float32)
    up = upstream_like(33, 10, 64, device, torch.float32)
    first, second = run_layer(p, backend, up), run_layer(p, backend, up)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
