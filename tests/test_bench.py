"""lltm-bench: the scaling sweep, the best-dtype table, the inference figures and the check before timing (the
figures themselves live in BENCHMARKS.md and benchmarks/log/)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from lltm_train.bench import common, main, training as bench_training
from lltm_train.bench.best import format_table
from lltm_train.bench.common import baseline_label
from lltm_train.bench.sweep import growth_exponent, saved_for_backward_mib
from lltm_train.host_memory import ENVIRONMENT, glibc_version
from lltm_train.ops.cells import CELLS


@pytest.mark.parametrize("power", [0.5, 1.0, 2.0])
def test_growth_exponent_is_the_power_of_a_power_law(power):
    xs = [1, 2, 4, 8, 16, 32]
    # the lower half is off the law (launch overhead): the fit reads the upper half only
    ys = [100.0, 100.0, 100.0] + [3.0 * x**power for x in xs[3:]]
    assert growth_exponent(xs, ys) == pytest.approx(power, rel=1e-9)


def test_saved_for_backward_counts_each_storage_once():
    a = torch.randn(256, 1024, requires_grad=True)  # 1 MiB
    b = torch.randn(256, 1024, requires_grad=True)
    # a * b saves both factors; (a * b) * a saves a again (counted once) and the 1 MiB product
    assert saved_for_backward_mib(lambda: ((a * b) * a).sum().backward()) == pytest.approx(3.0)


def test_a_sweep_of_one_size_says_the_exponent_needs_two(capsys):
    main(["--device", "cpu", "--sweep", "B", "--values", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "cpp k: two sizes needed" in out and "nan" not in out  # it printed k=nan


def test_a_sweep_writes_its_figures_and_plot(tmp_path, capsys):
    main(["--device", "cpu", "--sweep", "B", "--values", "1,2,4", "--repeats", "1", "--plot", str(tmp_path),
          "--json", str(tmp_path / "sweep.json")])
    result = json.loads((tmp_path / "sweep.json").read_text())["results"]
    assert [p["B"] for p in result["points"]] == [1, 2, 4]
    assert all(p["T"] == 64 and p["hidden_size"] == 128 for p in result["points"])  # the CPU base size
    for point in result["points"]:
        assert set(point["tokens_per_s"]) == {"nn.LSTM", "python", "cpp"}
        assert point["check_rel_err"] < 1e-3
        for label, seconds in point["seconds"].items():
            assert point["tokens_per_s"][label] == pytest.approx(point["T"] * point["B"] / seconds)
        # the LLTM keeps 3 gates to the LSTM's 4: less to save for the backward, and more with a larger batch
        assert 0 < point["memory_mib"]["cpp"] < point["memory_mib"]["nn.LSTM"]
    memory = [p["memory_mib"]["cpp"] for p in result["points"]]
    assert memory == sorted(memory)
    assert set(result["time_exponent"]) == {"nn.LSTM", "python", "cpp"}
    assert (tmp_path / "scaling_cpu_B.png").stat().st_size > 10_000
    assert "time ~ B^k" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--plot", "x"], "--values and --plot go with --sweep"),
    (["--sweep", "T", "--values", "8,x"], "--values: comma-separated whole numbers"),
    (["--sweep", "H", "--values", "0"], "--values: distinct sizes of at least 1"),
    (["--sweep", "Q"], "invalid choice: 'Q'"),
    (["--sweep", "T", "--values", "8,8"], "--values: distinct sizes of at least 1"),
    (["--sweep", "T", "--values", ""], "--values: comma-separated whole numbers"),
    (["--sweep", "T", "--dtype", "bfloat16"], "--sweep times float32 layers: it does not go with --jit"),
    (["--sweep", "T", "--training"], "--sweep times float32 layers"),
    (["--sweep", "T", "--plot", "/proc/forbidden"], "--plot: cannot write into /proc/forbidden"),
    (["--training", "--steps", "49"], "--steps at least 50"),
    (["--inference", "--steps", "100"], "--steps goes with --training"),  # it was ignored
    (["--configs", ""], "unknown config ''"),  # the steady pace needs a second logging window
])
def test_bad_sweep_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_sizes_that_do_not_fit_in_memory_end_the_sweep_and_keep_the_points_measured(tmp_path, capsys):
    main(["--device", "cpu", "--sweep", "B", "--values", "10000000000000,2", "--repeats", "1",  # given in any order
          "--json", str(tmp_path / "sweep.json"), "--plot", str(tmp_path)])
    result = json.loads((tmp_path / "sweep.json").read_text())["results"]
    assert [p["B"] for p in result["points"]] == [2]
    assert "B=10000000000000: out of memory" in capsys.readouterr().out
    assert (tmp_path / "scaling_cpu_B.png").is_file()


def test_the_best_dtype_table_credits_each_contender_with_its_fastest_dtype():
    def row(cell, baseline, theirs, ours):
        best = lambda d: list(max(((v, k) for k, v in d.items())))  # noqa: E731
        return {"config": "gpu-S", "cell": cell, "backend": "cuda", "baseline": baseline,
                "tokens_per_s": {baseline: theirs, "cuda": ours}, "best": {baseline: best(theirs), "cuda": best(ours)},
                "ratio_best": max(ours.values()) / max(theirs.values()),
                "peak_mib": {baseline: {d: 200.0 for d in theirs}, "cuda": {d: 50.0 for d in ours}}}

    rows = [row("lltm", "nn.LSTM", {"float32": 6e6, "float16": 7.5e6}, {"float32": 10e6, "bfloat16": 10.5e6}),
            row("gru", "nn.GRU", {"float32": 10e6, "float16": 7e6}, {"float32": 9e6, "bfloat16": 11e6})]
    table = format_table(rows)
    assert "| gpu-S | lltm | 7.50 (nn.LSTM, float16) | 10.50 (bfloat16) | 1.40x | 50 / 200 |" in table
    assert "| gpu-S | gru | 10.00 (nn.GRU, float32) | 11.00 (bfloat16) | 1.10x | 50 / 200 |" in table
    # the LLTM against the faster of nn.LSTM's and nn.GRU's bests: nn.GRU in float32 here
    assert "gpu-S: lltm / the best of nn.LSTM and nn.GRU (nn.GRU, float32, 10.00 M) 1.05x" in table


@pytest.mark.parametrize("argv", [["--dtype", "best", "--training"], ["--dtype", "best", "--jit"],
                                  ["--dtype", "best", "--configs", "cpu-S,seed-cell"]])
def test_best_dtype_goes_with_layers_only(argv, capsys):
    """Said before any timing starts."""
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", *argv])
    assert exit_.value.code == 2 and "--dtype best times" in capsys.readouterr().err


def test_inference_figures_name_each_forward(tmp_path, capsys, monkeypatch):
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)  # the settings that would leave malloc alone
    out = tmp_path / "inference.json"
    main(["--device", "cpu", "--inference", "--configs", "cpu-S", "--cells", "lltm,gru", "--repeats", "1",
          "--json", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert [(r["config"], r["cell"]) for r in rows] == [("cpu-S", "lltm"), ("cpu-S", "gru")]
    # every contender ran with the malloc settings of a CPU training run (glibc only), and the file says so
    assert json.loads(out.read_text())["machine"]["keep_freed_memory"] is (glibc_version() is not None)
    for r, baseline in zip(rows, ("nn.LSTM", "nn.GRU")):
        tps = r["tokens_per_s"]
        assert set(tps) == {"cpp training", "cpp no_grad", f"{baseline} no_grad"} and min(tps.values()) > 0
        assert r["no_grad_vs_training"] == tps["cpp no_grad"] / tps["cpp training"]
    assert "cpu-S  gru (T=128, B=32, I=64, H=128): cpp training" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--inference", "--training"], ["--inference", "--dtype", "best"],
                                  ["--inference", "--configs", "seed-cell"],
                                  ["--inference", "--sweep", "T", "--configs", "cpu-S"]])
def test_inference_goes_with_layers_in_one_dtype(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", *argv])
    assert exit_.value.code == 2 and "--inference times" in capsys.readouterr().err


def test_each_cell_is_timed_against_its_main_baselines_torch_nn_layer():
    assert {name: baseline_label(CELLS[name]) for name in ("lltm", "lstm", "gru")} == \
        {"lltm": "nn.LSTM", "lstm": "nn.LSTM", "gru": "nn.GRU"}


def test_the_training_contenders_come_from_the_cell_registry():
    """On a GPU every cell on cuda, each followed by PyTorch's where it has the cell; on a CPU the LLTM and its
    main baseline."""
    cuda = bench_training.CONTENDERS["cuda"]
    assert cuda[:5] == [("lltm", "cuda"), ("lstm", "cuda"), ("lstm", "torch"), ("gru", "cuda"), ("gru", "torch")]
    assert cuda == [(name, backend) for name, spec in CELLS.items()
                    for backend in ("cuda", *(["torch"] if spec.has_torch else []))]
    assert bench_training.CONTENDERS["cpu"] == [("lltm", "cpp"), ("lstm", "cpp"), ("lstm", "torch")]


def test_training_figures_are_medians_of_alternated_runs(monkeypatch, capsys):
    calls, paces = [], iter([5.0, 1.0, 9.0, 2.0, 3.0, 4.0, 7.0, 6.0, 8.0, 1.0, 2.0, 3.0] * 3)

    def run(cell, backend, device, steps, *overrides):
        calls.append((cell, overrides))
        return next(paces)

    monkeypatch.setattr(bench_training, "CONTENDERS", {"cuda": [("lltm", "cuda"), ("lstm", "torch")]})
    monkeypatch.setattr(bench_training, "lltm_train_tokens_per_s", run)
    monkeypatch.setattr(bench_training, "bare_loop_tokens_per_s", lambda *a: 10.0)
    rows = bench_training.run_training(torch.device("cuda"), steps=50, repeats=3)["rows"]
    # plain, eager step, bf16-mixed, compile, then again: each round has every variant
    lltm = [overrides for cell, overrides in calls if cell == "lltm"]
    assert lltm == [(), ("model.cuda_graph=false",), ("trainer.precision=bf16-mixed",), ("model.compile=true",)] * 3
    assert rows[0]["runs"] == {"lltm_train": [5.0, 3.0, 8.0], "eager step": [1.0, 4.0, 1.0],
                               "bf16-mixed": [9.0, 7.0, 2.0], "compile": [2.0, 6.0, 3.0]}
    assert (rows[0]["lltm_train"], rows[0]["eager step"], rows[0]["bf16-mixed"], rows[0]["compile"]) == (5.0, 1.0, 7.0, 3.0)
    assert rows[0]["lltm_train_vs_bare"] == 0.5
    # the cuDNN baseline runs as a user runs it: no variants, three plain runs
    assert [overrides for cell, overrides in calls if cell == "lstm"] == [()] * 3
    assert rows[1]["lltm_train"] == 5.0 and rows[1]["runs"] == {"lltm_train": [5.0, 1.0, 9.0]}
    assert "bf16-mixed 7 (1.40x), compile 3 (0.60x) (medians of 3 alternated runs)" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_check_before_timing_falls_back_to_float64_and_stops_a_wrong_backend(monkeypatch, dtype):
    """float32 within 1e-3 of python passes as it is; beyond that (TF32 in a cell whose derivative is a step) and
    in 16-bit dtypes, the error against float64 decides: within 4x python's passes, beyond stops the bench."""
    figures = {}

    def fake(*args, against_float64=None, **layout):
        return figures["float64" if against_float64 or dtype != torch.float32 else "float32"]

    monkeypatch.setattr(common, "check_against_python", fake)
    args = ("gpu-S", 8, 2, 3, 4, "cpu", dtype, "cpp", CELLS["rnn_relu"])
    if dtype == torch.float32:
        figures.update(float32=5e-4, float64=100.0)
        assert common.checked_against_python(*args) == 5e-4
    figures.update(float32=3e-3, float64=2.5)
    assert common.checked_against_python(*args) == 2.5
    figures.update(float32=3e-3, float64=9.0)
    with pytest.raises(SystemExit, match=r"cpp differs from python on gpu-S \(rnn_relu, .*\): .*error against "
                                         r"float64 9.00x python's > 4x"):
        common.checked_against_python(*args)


def _fake_flashrnn(monkeypatch, fail: bool):
    """A stand-in for FlashRNN's ``flashrnn(Wx, R, b, function, backend, dtype)`` (not a dependency here): outputs
    (S, B, T, NH, DH) from Wx, or the error its kernels give when they do not build."""
    import importlib.machinery
    import types

    calls = []

    def flashrnn(Wx, R, b, function, backend, dtype):
        calls.append((tuple(Wx.shape), tuple(R.shape), tuple(b.shape), function, backend, dtype))
        if fail:
            raise RuntimeError("Error building extension 'flashrnn_fused'\nmore lines")
        return torch.tanh(Wx.sum(2) + b.sum(0) + R.sum((0, 3))[..., :Wx.shape[-1]]).unsqueeze(0), None

    module = types.ModuleType("flashrnn")
    module.flashrnn = flashrnn
    module.__spec__ = importlib.machinery.ModuleSpec("flashrnn", None)
    monkeypatch.setitem(sys.modules, "flashrnn", module)
    monkeypatch.setitem(common.CONFIGS, "tiny", (8, 4, 6, 12))
    return calls


@pytest.mark.parametrize("fail", [False, True], ids=["runs", "fails"])
def test_flashrnn_is_a_contender_where_installed_with_the_heads(tmp_path, capsys, monkeypatch, fail):
    calls = _fake_flashrnn(monkeypatch, fail)
    out = tmp_path / "layers.json"
    main(["--device", "cpu", "--configs", "tiny", "--cells", "lstm,gru,lltm", "--num-heads", "3", "--repeats", "1",
          "--json", str(out)])
    rows = {r["cell"]: r for r in json.loads(out.read_text())["results"]}
    # its layout: Wx (B, T, G, NH, DH), R (G, NH, DH, DH), its GRU's 4 bias blocks; the vanilla loop on a CPU
    assert calls[0] == ((4, 8, 4, 3, 4), (4, 3, 4, 4), (4, 3, 4), "lstm", "vanilla", "float32")
    assert any(c[3] == "gru" and c[2] == (4, 3, 4) for c in calls)
    assert all(r["num_heads"] == 3 for r in rows.values())
    assert "FlashRNN vanilla" not in rows["lltm"]["tokens_per_s"]  # it has no LLTM
    printed = capsys.readouterr().out
    for cell in ("lstm", "gru"):
        if fail:
            assert "ratio_vs_peer" not in rows[cell]
            assert rows[cell]["failed"] == {"FlashRNN vanilla": "RuntimeError: Error building extension 'flashrnn_fused'"}
        else:
            tps = rows[cell]["tokens_per_s"]
            assert rows[cell]["ratio_vs_peer"] == tps["cpp"] / tps["FlashRNN vanilla"]
    assert ("FlashRNN vanilla failed (RuntimeError" in printed) is fail
    assert "tiny lstm (T=8, B=4, I=6, H=12, 3 heads)" in printed


def test_flashrnn_in_the_best_dtype_table(capsys, monkeypatch):
    _fake_flashrnn(monkeypatch, False)
    main(["--device", "cpu", "--configs", "tiny", "--cells", "lstm", "--dtype", "best", "--repeats", "1"])
    assert "tiny: lstm / FlashRNN vanilla's best (" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--num-heads", "3", "--configs", "cpu-S"], "--num-heads 3 does not divide the hidden size of cpu-S (128)"),
    (["--num-heads", "0"], "--num-heads must be at least 1"),
    (["--num-heads", "2", "--training"], "--num-heads goes with the layer figures"),
])
def test_bad_num_heads_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_stacks_time_the_modules_against_torch_nn_with_the_same_layers(tmp_path, capsys, monkeypatch):
    """--num-layers and --bidirectional: ours as lltm_train.nn's module (checked against its python backend
    first), PyTorch's layer with the same stack, and no FlashRNN (one layer only)."""
    _fake_flashrnn(monkeypatch, False)
    out = tmp_path / "stacks.json"
    main(["--device", "cpu", "--configs", "tiny", "--cells", "lstm,gru", "--num-layers", "2", "--bidirectional",
          "--repeats", "1", "--json", str(out)])
    rows = {r["cell"]: r for r in json.loads(out.read_text())["results"]}
    for cell, rival in (("lstm", "nn.LSTM"), ("gru", "nn.GRU")):
        row = rows[cell]
        assert (row["num_layers"], row["bidirectional"]) == (2, True)
        assert set(row["tokens_per_s"]) == {rival, "python", "cpp"} and row["check_rel_err"] < 1e-5
    assert "tiny lstm (T=8, B=4, I=6, H=12, 2 layers, bidirectional)" in capsys.readouterr().out


def test_the_check_of_a_stack_runs_the_module_and_finds_a_wrong_layer(monkeypatch):
    import lltm_train.nn.rnn as rnn

    args = (6, 3, 5, 8, "cpu", torch.float32, "cpp", CELLS["lstm"])
    assert common.check_against_python(*args, num_layers=2, bidirectional=True) < 1e-5
    real = rnn.rnn_layer

    def off_in_the_second_layer(cell, x, *rest, backend, **kw):  # the second layer's input is 2 x 8 wide
        out, state = real(cell, x, *rest, backend=backend, **kw)
        return (out + 1e-2 if backend == "cpp" and x.shape[-1] == 16 else out), state

    monkeypatch.setattr(rnn, "rnn_layer", off_in_the_second_layer)
    assert common.check_against_python(*args, num_layers=2, bidirectional=True) > 1e-3


@pytest.mark.parametrize("argv, message", [
    (["--num-layers", "0"], "--num-layers must be at least 1"),
    (["--num-layers", "2", "--training"], "--num-layers and --bidirectional go with the layer figures"),
    (["--bidirectional", "--inference", "--configs", "cpu-S"], "--num-layers and --bidirectional go with the layer"),
    (["--bidirectional", "--configs", "seed-cell"], "the seed cell is one step of one layer"),
])
def test_bad_stacks_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
