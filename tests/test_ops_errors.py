"""Bad input to the functional API and the raw ops gives a clear error, never a crash or a wrong answer."""

from __future__ import annotations

import logging

import pytest
import torch

import lltm_train
import lltm_train.backends as backends
from lltm_train.functional import lltm_cell, lltm_layer


def params(T=3, B=2, I=4, H=5, dtype=torch.float32, device="cpu"):
    kw = dict(dtype=dtype, device=device)
    return [torch.randn(T, B, I, **kw), (torch.zeros(B, H, **kw), torch.zeros(B, H, **kw)),
            torch.randn(3 * H, I, **kw), torch.randn(3 * H, H, **kw), torch.randn(3 * H, **kw)]


def replaced(args, index, value):
    args = list(args)
    args[index] = value
    return args


BAD = [
    ("2-D input", lambda a: replaced(a, 0, a[0][0]), ValueError, r"expected input of shape \(T, B, input_size\), got \(2, 4\)"),
    ("length 0", lambda a: replaced(a, 0, a[0][:0]), ValueError, "T >= 1"),
    ("weight_ih columns", lambda a: replaced(a, 2, a[2][:, :3]), ValueError, r"expected weight_ih of shape \(15, 4\)"),
    ("weight_hh not 3H x H", lambda a: replaced(a, 3, a[3][:14]), ValueError, r"weight_hh of shape \(3 \* hidden_size, hidden_size\)"),
    ("bias length", lambda a: replaced(a, 4, a[4][:5]), ValueError, r"expected bias of shape \(15,\)"),
    ("h batch", lambda a: replaced(a, 1, (a[1][0][:1], a[1][1])), ValueError, r"expected h of shape \(2, 5\)"),
    ("hx not a pair", lambda a: replaced(a, 1, a[1][0]), TypeError, "hx must be a tuple"),
    ("integer input", lambda a: replaced(a, 0, a[0].long()), TypeError, "floating-point input"),
    ("mixed dtypes", lambda a: replaced(a, 2, a[2].double()), TypeError, "weight_ih has dtype torch.float64 but input has torch.float32"),
    ("mixed devices", lambda a: replaced(a, 3, a[3].to("meta")), ValueError, "weight_hh is on meta but input is on cpu"),
    ("not a tensor", lambda a: replaced(a, 2, a[2].tolist()), TypeError, "weight_ih must be a torch.Tensor"),
]


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("case, mutate, exc, message", BAD, ids=[b[0] for b in BAD])
def test_bad_layer_input_raises_clear_error(backend, case, mutate, exc, message):
    with pytest.raises(exc, match=message):
        lltm_layer(*mutate(params()), backend=backend)


BAD_LENGTHS = [
    (torch.tensor([3, 1, 1]), r"lengths must be an int64 CPU tensor of shape \(2,\), got torch.int64 \(3,\)"),
    (torch.tensor([3, 4]), r"every length must be in \[0, T = 3\], got 3 to 4"),
    (torch.tensor([3.0, 1.0]), "lengths must be an int64 CPU tensor of shape .* got torch.float32"),
    ([3, 1], "got list"),
]


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("bad, message", BAD_LENGTHS, ids=["size", "range", "dtype", "list"])
def test_bad_lengths_raise_clear_error(backend, bad, message):
    x, hx, w_ih, w_hh, b = params()
    with pytest.raises(ValueError, match=message):
        lltm_layer(x, hx, w_ih, w_hh, b, lengths=bad, backend=backend)


@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_lengths_changed_in_place_before_the_backward(backend):
    """The python backend's gradients are those of the lengths the forward ran (its masks are built then); cpp
    refuses, as autograd refuses any saved input changed in place (it kept the tensor and gave the gradients of
    the new lengths: 0.59 off)."""
    x, hx, w_ih, w_hh, b = (t.double().requires_grad_() if isinstance(t, torch.Tensor) else t for t in params(T=5))
    grads = []
    for change in (False, True):
        lengths = torch.tensor([5, 2])
        out, (h, _) = lltm_layer(x, None, w_ih, w_hh, b, lengths=lengths, backend=backend)
        if change:
            lengths.fill_(5)
        if change and backend == "cpp":
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                torch.autograd.grad(out.sum() + h.sum(), [x, w_ih, w_hh])
            return
        grads.append(torch.autograd.grad(out.sum() + h.sum(), [x, w_ih, w_hh]))
    for before, after in zip(*grads):
        torch.testing.assert_close(before, after, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_bad_cell_input_raises_clear_error(backend):
    x, hx, w_ih, w_hh, b = params()
    with pytest.raises(ValueError, match=r"expected input of shape \(B, input_size\)"):
        lltm_cell(x, hx, w_ih, w_hh, b, backend=backend)
    with pytest.raises(TypeError, match="floating-point input"):
        lltm_cell(x[0].int(), hx, w_ih, w_hh, b, backend=backend)


def test_raw_ops_check_their_arguments():
    assert lltm_train.ops.load()
    x, (h, c), w_ih, w_hh, b = params()
    with pytest.raises(RuntimeError, match=r"lltm.layer_forward: expected weight_ih of shape"):
        torch.ops.lltm.layer_forward(x, h, c, w_ih[:, :2], w_hh, b, None)
    with pytest.raises(RuntimeError, match="all tensors must share one dtype"):
        torch.ops.lltm.layer_forward(x, h.double(), c, w_ih, w_hh, b, None)
    with pytest.raises(RuntimeError, match="T >= 1"):
        torch.ops.lltm.layer_forward(x[:0], h, c, w_ih, w_hh, b, None)
    with pytest.raises(RuntimeError, match=r"lengths\[1\] = 9 is outside \[0, T = 3\]"):
        torch.ops.lltm.layer_forward(x, h, c, w_ih, w_hh, b, torch.tensor([1, 9]))
    with pytest.raises(RuntimeError, match="expected lengths as an int64 tensor on the CPU"):
        torch.ops.lltm.layer_forward(x, h, c, w_ih, w_hh, b, torch.tensor([1, 2], dtype=torch.int32))
    out, h_n, c_n, cells, activations = torch.ops.lltm.layer_forward(x, h, c, w_ih, w_hh, b, None)
    with pytest.raises(RuntimeError, match="expected grad_output of shape"):
        torch.ops.lltm.layer_backward(out[:1], h_n, c_n, x, h, c, w_ih, w_hh, out, cells, activations, None)
    with pytest.raises(RuntimeError, match="expected activations of shape"):
        torch.ops.lltm.layer_backward(out, h_n, c_n, x, h, c, w_ih, w_hh, out, cells, activations[:, :, :3], None)
    with pytest.raises(RuntimeError, match=r"expected zoneout of shape \(T, B, 2 \* hidden_size\)"):
        torch.ops.lltm.layer_forward(x, h, c, w_ih, w_hh, b, None, True, torch.zeros(x.shape[0], x.shape[1], 5))
    with pytest.raises(RuntimeError, match="zoneout has dtype Double but input has dtype Float"):
        torch.ops.lltm.layer_forward(x, h, c, w_ih, w_hh, b, None, True, torch.zeros(*x.shape[:2], 2 * h.shape[1]).double())


def test_unknown_backend_and_wrong_device():
    args = params()
    with pytest.raises(ValueError, match="unknown backend 'cudnn'; choose one of auto, python, cpp, cuda, torch"):
        lltm_layer(*args, backend="cudnn")
    with pytest.raises(ValueError, match="'cuda' runs on CUDA tensors, but the tensors are on cpu; use backend='cpp'"):
        lltm_layer(*args, backend="cuda")
    meta = params(device="meta")
    with pytest.raises(ValueError, match="'cpp' runs on CPU tensors, but the tensors are on meta"):
        lltm_layer(*meta, backend="cpp")


def test_unbuilt_backend_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(backends, "_available", [])
    monkeypatch.setattr(backends.ops, "load", lambda: False)
    monkeypatch.setattr(backends.ops, "load_error", lambda: "OSError: no compiler")
    with pytest.raises(RuntimeError, match="backend 'cpp' is not available: the compiled extension could not be loaded \\(OSError: no compiler\\)"):
        lltm_layer(*params(), backend="cpp")


def test_auto_says_once_which_backend_it_chose(monkeypatch, caplog):
    monkeypatch.setattr(backends, "_announced", set())
    with caplog.at_level(logging.INFO, logger="lltm_train"):
        for _ in range(3):
            lltm_layer(*params(), backend="auto")
    chosen = [r.getMessage() for r in caplog.records if "backend 'auto'" in r.getMessage()]
    assert chosen == ["backend 'auto' runs 'cpp' for cpu tensors"]


def test_auto_falls_back_to_python_and_says_why(monkeypatch, caplog):
    monkeypatch.setattr(backends, "_announced", set())
    monkeypatch.setattr(backends, "_available", [])
    monkeypatch.setattr(backends.ops, "load", lambda: False)
    monkeypatch.setattr(backends.ops, "load_error", lambda: "RuntimeError: no ninja")
    with caplog.at_level(logging.INFO, logger="lltm_train"):
        out, _ = lltm_layer(*params(), backend="auto")
    assert out.shape == (3, 2, 5)
    assert "runs 'python' for cpu tensors (the compiled extension could not be loaded (RuntimeError: no ninja)" in caplog.text


def test_unsupported_derivatives_raise_instead_of_returning_zeros():
    x, hx, w_ih, w_hh, b = params(dtype=torch.float64)
    x.requires_grad_()
    w_ih.requires_grad_()
    out, _ = lltm_layer(x, hx, w_ih, w_hh, b, backend="cpp")
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)  # first order with a graph: fine
    with pytest.raises(NotImplementedError, match="no second derivative .* use backend='python'"):
        torch.autograd.grad((gx**2).sum(), w_ih)
    h1, _ = lltm_cell(x[0], hx, w_ih, w_hh, b, backend="cpp")
    (gx,) = torch.autograd.grad(h1.sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="no second derivative"):
        torch.autograd.grad((gx**2).sum(), w_ih)
    with pytest.raises(NotImplementedError, match="forward-mode AD .* use backend='python'"):
        torch.func.jvp(lambda t: lltm_layer(t, hx, w_ih.detach(), w_hh, b, backend="cpp")[0], (x.detach(),), (torch.ones_like(x),))
    # the python backend has both
    tangent = torch.func.jvp(lambda t: lltm_layer(t, hx, w_ih.detach(), w_hh, b, backend="python")[0], (x.detach(),),
                             (torch.ones_like(x),))[1]
    assert tangent.abs().sum() > 0
    # torch.func's reverse mode cannot enter a C++ autograd function: our message, not PyTorch's generic one
    with pytest.raises(NotImplementedError, match="torch.func's grad, vjp and jacrev cannot enter the cpp backend"):
        torch.func.grad(lambda t: lltm_layer(t, hx, w_ih.detach(), w_hh, b, backend="cpp")[0].sum())(x.detach())
    grad = torch.func.grad(lambda t: lltm_layer(t, hx, w_ih.detach(), w_hh, b, backend="python")[0].sum())(x.detach())
    torch.testing.assert_close(grad, torch.autograd.grad(lltm_layer(x, hx, w_ih, w_hh, b, backend="cpp")[0].sum(), x)[0])
    # vmap runs the op once per slice (PyTorch's fallback), with or without grad
    xs = torch.randn(3, *x.shape, dtype=x.dtype)
    batched = torch.vmap(lambda t: lltm_layer(t, hx, w_ih, w_hh, b, backend="cpp")[0])(xs)
    torch.testing.assert_close(batched[1], lltm_layer(xs[1], hx, w_ih, w_hh, b, backend="cpp")[0])


def test_raw_ops_refuse_mixed_meta_and_cpu_tensors():
    """The dispatcher sends calls mixing meta and CPU tensors to the fake kernel: it must refuse them."""
    assert lltm_train.ops.load()
    x, (h, c), w_ih, w_hh, b = params()
    with pytest.raises(RuntimeError, match="all tensors must be on one device"):
        torch.ops.lltm.layer_forward(x, h, c, w_ih, w_hh.to("meta"), None, None)
    with pytest.raises(RuntimeError, match=r"expected input of shape \(T, B, input_size\)"):
        torch.ops.lltm.layer_forward(*(t.to("meta") for t in (x[0], h, c, w_ih, w_hh)), None, None)


def test_float8_and_scalar_weights_are_clear_errors():
    x, hx, w_ih, w_hh, b = params()
    with pytest.raises(TypeError, match="floating-point input"):
        lltm_layer(x.to(torch.float8_e4m3fn), hx, w_ih, w_hh, b, backend="python")
    with pytest.raises(ValueError, match="expected weight_hh of shape"):
        lltm_layer(x, None, w_ih, torch.tensor(1.0), b)


def test_raw_op_refuses_float8_and_lengths_off_the_cpu():
    assert lltm_train.ops.load()
    x, (h, c), w_ih, w_hh, b = params()
    f8 = [t.to(torch.float8_e4m3fn) for t in (x, h, c, w_ih, w_hh)]
    with pytest.raises(RuntimeError, match="expected a floating-point input .* got Float8_e4m3fn"):
        torch.ops.lltm.layer_forward(*f8, None, None)
    with pytest.raises(RuntimeError, match="expected lengths as an int64 tensor on the CPU, got one on meta"):
        torch.ops.lltm.layer_forward(x, h, c, w_ih, w_hh, b, torch.tensor([1, 2], device="meta"))


def test_compile_fullgraph_with_lengths():
    torch._dynamo.reset()
    x, _, w_ih, w_hh, b = params(dtype=torch.float64)

    def f(x, lengths):
        out, (h_n, _) = lltm_layer(x, None, w_ih, w_hh, b, lengths=lengths, backend="cpp")
        return out.sum() + h_n.sum()

    lengths = torch.tensor([3, 1])
    assert torch.compile(f, fullgraph=True, backend="aot_eager")(x, lengths).item() == pytest.approx(f(x, lengths).item())


@pytest.mark.parametrize("backend", ["python", "cpp", "torch"])
@pytest.mark.parametrize("bad", [[9, 1], [-2, 1]], ids=["above T", "negative"])
def test_compiled_call_with_lengths_out_of_range_raises(backend, bad):
    """Under torch.compile the lengths are data, not read while tracing: the compiled code checks them when it
    runs (the python and torch backends have no op of their own to do it)."""
    from lltm_train.functional import lstm_layer

    torch._dynamo.reset()
    x, w_ih, w_hh = torch.randn(3, 2, 4, dtype=torch.float64), torch.randn(20, 4, dtype=torch.float64), \
        torch.randn(20, 5, dtype=torch.float64)
    f = torch.compile(lambda x, lengths: lstm_layer(x, None, w_ih, w_hh, lengths=lengths, backend=backend)[0],
                      fullgraph=backend != "torch", backend="aot_eager")  # (torch's kernels run eagerly)
    assert f(x, torch.tensor([3, 1])).shape == (3, 2, 5)
    with pytest.raises(RuntimeError, match="length"):
        f(x, torch.tensor(bad))


@pytest.mark.parametrize("backend", ["python", "cpp", "torch"])
def test_bad_input_to_the_lstm_and_gru_is_named(backend):
    from lltm_train.functional import gru_layer, lstm_layer

    x, h, c = torch.randn(3, 2, 4), torch.zeros(2, 5), torch.zeros(2, 5)
    w = {"lstm": (torch.randn(20, 4), torch.randn(20, 5)), "gru": (torch.randn(15, 4), torch.randn(15, 5))}
    with pytest.raises(ValueError, match=r"lstm_layer: expected weight_ih of shape \(20, 4\)"):
        lstm_layer(x, (h, c), w["lstm"][0][:, :3], w["lstm"][1], backend=backend)
    with pytest.raises(ValueError, match=r"weight_hh of shape \(4 \* hidden_size, hidden_size\)"):
        lstm_layer(x, (h, c), w["lstm"][0], w["lstm"][1][:15], backend=backend)
    with pytest.raises(ValueError, match=r"gru_layer: expected bias_hh of shape \(15,\)"):
        gru_layer(x, h, *w["gru"], torch.zeros(15), torch.zeros(12), backend=backend)
    with pytest.raises(TypeError, match="gru_layer: hx must be a tensor h or None, got tuple"):
        gru_layer(x, (h, c), *w["gru"], backend=backend)
    with pytest.raises(TypeError, match=r"lstm_layer: hx must be a tuple \(h, c\)"):
        lstm_layer(x, h, *w["lstm"], backend=backend)
    with pytest.raises(TypeError, match="bias_ih has dtype torch.float64 but input has torch.float32"):
        gru_layer(x, h, *w["gru"], torch.zeros(15, dtype=torch.float64), backend=backend)


def test_raw_lstm_and_gru_ops_check_their_arguments():
    assert lltm_train.ops.load()
    x, h = torch.randn(3, 2, 4), torch.zeros(2, 5)
    with pytest.raises(RuntimeError, match=r"lltm.lstm_layer_forward: expected weight_ih of shape \(4 \* hidden_size, "
                                           r"input_size\) = \[20, 4\]"):
        torch.ops.lltm.lstm_layer_forward(x, h, h, torch.randn(20, 3), torch.randn(20, 5), None, None, None)
    with pytest.raises(RuntimeError, match=r"lltm.gru_layer_forward: expected bias_hh of shape \(3 \* hidden_size\)"):
        torch.ops.lltm.gru_layer_forward(x, h, torch.randn(15, 4), torch.randn(15, 5), None, torch.zeros(14), None)
    with pytest.raises(RuntimeError, match=r"lengths\[0\] = 4 is outside \[0, T = 3\]"):
        torch.ops.lltm.gru_layer_forward(x, h, torch.randn(15, 4), torch.randn(15, 5), None, None, torch.tensor([4, 1]))
    out, h_n, act = torch.ops.lltm.gru_layer_forward(x, h, torch.randn(15, 4), torch.randn(15, 5), None, None, None)
    with pytest.raises(RuntimeError, match="expected activations of shape"):
        torch.ops.lltm.gru_layer_backward(out, None, x, h, torch.randn(15, 4), torch.randn(15, 5), out, act[:, :, :15], None)
    with pytest.raises(RuntimeError, match=r"lltm.lstm_layer_backward: expected c0 of shape"):
        torch.ops.lltm.lstm_layer_backward(None, None, None, x, h, h[:1], torch.randn(20, 4), torch.randn(20, 5),
                                           out, out, torch.zeros(3, 2, 20), None)


def test_the_torch_backend_is_for_the_lstm_and_gru_only():
    with pytest.raises(ValueError, match="PyTorch has no LLTM"):
        lltm_layer(*params(), backend="torch")
    with pytest.raises(ValueError, match="PyTorch has no LLTM"):
        lltm_train.backends.resolve_backend("torch", "cpu", "lltm")
    assert lltm_train.backends.resolve_backend("torch", "cpu", "gru") == "torch"
