"""The ops inside PyTorch's machinery: torch.compile, TorchScript, and the just-in-time build."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import lltm_train
from conftest import layer_args
from lltm_train.functional import rnn_layer
from lltm_train.ops import _extension
from lltm_train.ops.cells import GRU, LLTM, LSTM


def _params(cell, device, T=5, B=3, I=4, H=6, dtype=torch.float32):
    p = layer_args(cell, T, B, I, H, device, dtype=dtype)
    return (p["input"], p["weight_ih"], p["weight_hh"], *p["biases"])


def test_torch_compile_fullgraph_matches_eager(device_backend, cell):
    device, backend = device_backend
    torch._dynamo.reset()
    args = _params(cell, device)

    def f(x, *weights):
        out, state = rnn_layer(cell, x, None, *weights, backend=backend)
        return out.sum() + state[0].pow(2).sum() + state[-1].sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    eager_loss = f(*args)
    eager_grads = torch.autograd.grad(eager_loss, args)
    loss = compiled(*args)
    grads = torch.autograd.grad(loss, args)
    assert_close(loss, eager_loss)
    for g, e in zip(grads, eager_grads):
        assert_close(g, e)


def test_torch_compile_inductor_runs_the_custom_op(device_backend, cell):
    device, backend = device_backend
    torch._dynamo.reset()
    x, *weights = _params(cell, device)

    @torch.compile(fullgraph=True)
    def f(x):
        out, _ = rnn_layer(cell, torch.tanh(x), None, *weights, backend=backend)
        return out * 2

    want = rnn_layer(cell, torch.tanh(x), None, *weights, backend="python")[0] * 2
    assert_close(f(x), want, rtol=1e-5, atol=1e-5)


class RawLayer(torch.nn.Module):
    """What a TorchScript user writes: the registered op called through torch.ops."""

    def forward(self, x: torch.Tensor, h: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b: torch.Tensor):
        out, h_n, c_n, cells, activations = torch.ops.lltm.layer_forward(x, h, h, w_ih, w_hh, b, None)
        return out, h_n, c_n


class RawGRU(torch.nn.Module):
    def forward(self, x: torch.Tensor, h: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
                b_hh: torch.Tensor):
        out, h_n, activations = torch.ops.lltm.gru_layer_forward(x, h, w_ih, w_hh, b_ih, b_hh, None)
        return out, h_n


class RawLSTM(torch.nn.Module):
    def forward(self, x: torch.Tensor, h: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
                b_hh: torch.Tensor):
        out, h_n, c_n, cells, activations = torch.ops.lltm.lstm_layer_forward(x, h, h, w_ih, w_hh, b_ih, b_hh, None)
        return out, h_n, c_n


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # TorchScript is deprecated upstream, still supported
@pytest.mark.parametrize("module, cell", [(RawLayer, LLTM), (RawLSTM, LSTM), (RawGRU, GRU)], ids=["lltm", "lstm", "gru"])
def test_torchscript_script_and_trace_round_trip(tmp_path, module, cell):
    assert lltm_train.ops.load()
    x, w_ih, w_hh, *biases = (t.detach() for t in _params(cell, "cpu"))
    h = torch.zeros(3, 6)
    args = (x, h, w_ih, w_hh, *biases)
    want = module()(*args)
    for scripted, name in ((torch.jit.script(module()), "scripted.pt"), (torch.jit.trace(module(), args), "traced.pt")):
        torch.jit.save(scripted, str(tmp_path / name))
        loaded = torch.jit.load(str(tmp_path / name))
        assert f"lltm::{cell.forward_op}" in str(loaded.inlined_graph)
        for got, w in zip(loaded(*args), want):
            assert_close(got, w)
    state = (h, h) if cell.has_cell_state else (h,)
    assert_close(want[0], rnn_layer(cell, x, state, w_ih, w_hh, *biases, backend="python")[0])


def test_jit_build_takes_a_lock_and_clears_a_stale_one(tmp_path, monkeypatch):
    """A build killed mid-way leaves cpp_extension's lock file behind; the next build must not hang on it."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(_extension, "_ROOT", tmp_path)
    monkeypatch.setattr(_extension, "_CSRC", tmp_path / "csrc")
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "lltm.cpp").write_text("// stand-in")
    build_dir = _extension._build_dir(with_cuda=False)
    build_dir.mkdir(parents=True)
    (build_dir / "lock").write_text("")  # what a killed build leaves
    calls = []

    def fake_load(**kwargs):
        assert not (build_dir / "lock").exists()
        calls.append(kwargs)

    monkeypatch.setattr(_extension, "_cuda_build_possible", lambda: False)
    monkeypatch.setattr(cpp_extension, "load", fake_load)
    _extension._build_just_in_time()
    assert len(calls) == 1
    assert calls[0]["build_directory"] == str(build_dir)
    assert calls[0]["is_python_module"] is False
    assert [p.rsplit("/", 1)[-1] for p in calls[0]["sources"]] == ["lltm.cpp", "lltm_autograd.cpp", "lltm_cpu.cpp"]


def test_jit_build_is_announced_only_when_something_needs_compiling(tmp_path, monkeypatch, capsys):
    """Loading an up-to-date JIT build must not claim to compile (and ask the user to wait) every run."""
    import os

    from torch.utils import cpp_extension

    monkeypatch.setattr(_extension, "_ROOT", tmp_path)
    monkeypatch.setattr(_extension, "_CSRC", tmp_path / "csrc")
    (tmp_path / "csrc").mkdir()
    source = tmp_path / "csrc" / "lltm.cpp"
    source.write_text("// stand-in")
    build_dir = _extension._build_dir(with_cuda=False)
    built = build_dir / "lltm_train_C.so"

    def fake_load(**kwargs):
        built.write_text("")  # what a build leaves

    monkeypatch.setattr(_extension, "_cuda_build_possible", lambda: False)
    monkeypatch.setattr(cpp_extension, "load", fake_load)
    _extension._build_just_in_time()
    assert "compiling the C++ extension" in capsys.readouterr().err
    _extension._build_just_in_time()
    assert "compiling" not in capsys.readouterr().err
    os.utime(source, (built.stat().st_mtime + 10,) * 2)  # a source edited after the build
    _extension._build_just_in_time()
    assert "compiling the C++ extension" in capsys.readouterr().err


def test_missing_sources_and_module_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(_extension, "_CSRC", tmp_path / "nothing-here")
    with pytest.raises(RuntimeError, match="pip install --no-build-isolation"):
        _extension._build_just_in_time()


def test_setup_and_the_jit_build_compile_the_same_sources():
    """setup.py and CMakeLists.txt read the JIT build's source and flag lists (so the builds cannot drift
    apart), and those lists name every source file in csrc/ exactly once."""
    from pathlib import Path

    from lltm_train.ops import _build

    root = Path(_extension.__file__).resolve().parents[2]
    assert "_build.py" in (root / "setup.py").read_text() and "_build.py" in (root / "CMakeLists.txt").read_text()
    assert "PYTHON_SOURCES" in (root / "setup.py").read_text()  # the Python module's init: setup.py's build only
    listed = [*_build.CPP_SOURCES, *_build.CUDA_SOURCES, *_build.PYTHON_SOURCES]
    on_disk = sorted(p.name for p in (root / "csrc").iterdir() if p.suffix in (".cpp", ".cu"))
    assert sorted(listed) == on_disk
