"""The compiled backends against the python oracle: values, gradients, registrations, odd inputs."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from lltm_train.functional import lltm_cell, lltm_layer

F64 = dict(rtol=1e-10, atol=1e-10)
SIZES = [(1, 1, 1, 1), (5, 3, 7, 5), (3, 4, 10, 129), (17, 2, 3, 8)]  # (T, B, input_size, hidden_size)


def make(T, B, I, H, device, dtype=torch.float64, bias=True, requires_grad=True):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, dtype=dtype, device=device) * scale).requires_grad_(requires_grad)

    return dict(
        input=rnd(T, B, I),
        h0=rnd(B, H, scale=0.5),
        c0=rnd(B, H),
        weight_ih=rnd(3 * H, I, scale=I**-0.5),
        weight_hh=rnd(3 * H, H, scale=H**-0.5),
        bias=rnd(3 * H) if bias else None,
    )


def run_layer(p, backend, upstream):
    out, (h_n, c_n) = lltm_layer(p["input"], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    leaves = [t for t in p.values() if t is not None]
    loss = (out * upstream[0]).sum() + (h_n * upstream[1]).sum() + (c_n * upstream[2]).sum()
    return (out, h_n, c_n, *torch.autograd.grad(loss, leaves))


def run_cell(p, backend, upstream):
    h1, c1 = lltm_cell(p["input"][0], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    leaves = [t for t in p.values() if t is not None]
    loss = (h1 * upstream[1]).sum() + (c1 * upstream[2]).sum()
    return (h1, c1, *torch.autograd.grad(loss, leaves))


def upstream_like(T, B, H, device, dtype=torch.float64):
    return [torch.randn(T, B, H, dtype=dtype, device=device), torch.randn(B, H, dtype=dtype, device=device),
            torch.randn(B, H, dtype=dtype, device=device)]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "T{}B{}I{}H{}".format(*s))
def test_layer_and_cell_match_python_float64(device_backend, sizes, bias):
    device, backend = device_backend
    p = make(*sizes, device, bias=bias)
    up = upstream_like(sizes[0], sizes[1], sizes[3], device)
    for run in (run_layer, run_cell):
        got, want = run(p, backend, up), run(p, "python", up)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert_close(g, w, **F64)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_gradcheck_float64(device_backend, bias):
    device, backend = device_backend
    p = make(4, 3, 5, 6, device, bias=bias)
    args = tuple(t for t in p.values() if t is not None)

    def layer(x, h0, c0, w_ih, w_hh, b=None):
        out, (h_n, c_n) = lltm_layer(x, (h0, c0), w_ih, w_hh, b, backend=backend)
        return out, h_n, c_n

    def cell(x, h0, c0, w_ih, w_hh, b=None):
        return lltm_cell(x[0], (h0, c0), w_ih, w_hh, b, backend=backend)

    assert torch.autograd.gradcheck(layer, args)
    assert torch.autograd.gradcheck(cell, args)


def forward_args(name, p):
    x = p["input"] if name == "layer_forward" else p["input"][0]
    return (x, p["h0"], p["c0"], p["weight_ih"], p["weight_hh"], p["bias"])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_opcheck_every_op(device_backend, bias):
    device, _ = device_backend
    p = make(3, 2, 4, 5, device, bias=bias)
    ops = torch.ops.lltm
    for dtype_args in (p, {k: (v.detach() if v is not None else None) for k, v in p.items()}):
        torch.library.opcheck(ops.layer_forward.default, forward_args("layer_forward", dtype_args))
        torch.library.opcheck(ops.cell_forward.default, forward_args("cell_forward", dtype_args))
    d = {k: (v.detach() if v is not None else None) for k, v in p.items()}
    out, h_n, c_n, cells, gates = ops.layer_forward(*forward_args("layer_forward", d))
    torch.library.opcheck(
        ops.layer_backward.default,
        (torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n), d["input"], d["h0"],
         d["weight_ih"], d["weight_hh"], out, cells, gates),
    )
    h1, c1, g1 = ops.cell_forward(*forward_args("cell_forward", d))
    torch.library.opcheck(
        ops.cell_backward.default,
        (torch.randn_like(h1), torch.randn_like(c1), d["input"][0], d["h0"], d["weight_ih"], d["weight_hh"], c1, g1),
    )


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
    leaves = (x, h0, c0, w_ih, w_hh, b)
    results = {}
    for be in (backend, "python"):
        out, (h_n, c_n) = lltm_layer(x, (h0, c0), w_ih, w_hh, b, backend=be)
        # sum() hands the backward an expanded (stride 0) gradient
        loss = out.sum() + h_n.sum() + (c_n * 2).sum()
        results[be] = (out, h_n, c_n, *torch.autograd.grad(loss, leaves))
        h1, c1 = lltm_cell(x[0], (h0, c0), w_ih, w_hh, b, backend=be)
        results[be] += (h1, c1, *torch.autograd.grad(h1.sum() + c1.sum(), leaves))
    for g, w in zip(results[backend], results["python"]):
        assert_close(g, w, **F64)


def test_batch_zero_gives_empty_outputs(device_backend):
    device, backend = device_backend
    p = make(4, 0, 3, 5, device)
    out, (h_n, c_n) = lltm_layer(p["input"], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    assert out.shape == (4, 0, 5) and h_n.shape == (0, 5) and c_n.shape == (0, 5)
    (out.sum() + h_n.sum()).backward()
    assert p["weight_hh"].grad.shape == (15, 5) and torch.all(p["weight_hh"].grad == 0)
    h1, c1 = lltm_cell(p["input"][0], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    assert h1.shape == (0, 5) and c1.shape == (0, 5)


def test_unused_outputs_get_no_gradient_work(device_backend):
    """Backward with only h_n used (output and c_n unused) matches the oracle."""
    device, backend = device_backend
    p = make(5, 2, 3, 4, device)
    grads = {}
    for be in (backend, "python"):
        _, (h_n, _) = lltm_layer(p["input"], None, p["weight_ih"], p["weight_hh"], p["bias"], backend=be)
        grads[be] = torch.autograd.grad(h_n.sum(), [p["input"], p["weight_hh"]])
    for g, w in zip(grads[backend], grads["python"]):
        assert_close(g, w, **F64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lower_precision_close_to_float64(device_backend, dtype):
    device, backend = device_backend
    p64 = make(8, 4, 6, 10, device, requires_grad=False)
    p = {k: v.to(dtype) for k, v in p64.items()}
    exact = {k: v.double() for k, v in p.items()}  # the same rounded inputs, computed in float64
    out, (h_n, c_n) = lltm_layer(p["input"], (p["h0"], p["c0"]), p["weight_ih"], p["weight_hh"], p["bias"], backend=backend)
    ref, (h_ref, c_ref) = lltm_layer(exact["input"], (exact["h0"], exact["c0"]), exact["weight_ih"],
                                     exact["weight_hh"], exact["bias"], backend="python")
    assert out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}[dtype]
    for g, w in ((out, ref), (h_n, h_ref), (c_n, c_ref)):
        assert_close(g.double(), w, rtol=tol, atol=tol)


def test_float32_gradients_close_to_python(device_backend):
    device, backend = device_backend
    p = make(20, 8, 16, 32, device, dtype=torch.float32)
    up = upstream_like(20, 8, 32, device, torch.float32)
    for g, w in zip(run_layer(p, backend, up), run_layer(p, "python", up)):
        assert_close(g, w, rtol=1e-4, atol=1e-4)


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
