"""Trained models outside training: checkpoints loaded on any backend, text generation, evaluation, and the
AOTInductor (the default) / torch.export / TorchScript (deprecated) files of lltm-export, each reloaded in a
fresh process."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import pytest
import torch
from omegaconf import OmegaConf

from conftest import CUDA_READY, CUDA_SKIP_REASON
from helpers import make_cfg
from lltm_train.export import (DEFAULT_FORMAT, JIT_DEPRECATED, TokenModel, TokenModelH, check_in_fresh_process,
                               example_inputs, export, metadata, num_states, token_model)
from lltm_train.inference import encode_prompt, load_task, sample, sample_tokens, vocabulary
from lltm_train.ops.cells import CELLS
from lltm_train.train import train


def _train_text_model(out, *overrides):
    text = out / "text.txt"
    text.write_text("the quick brown fox jumps over a lazy dog. " * 100)
    cfg = make_cfg(out, "dataset=text", f"dataset.path={text}", "dataset.seq_len=16", "model.num_layers=2",
                   "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.num_sanity_val_steps=0", *overrides)
    train(cfg)
    (out / ".hydra").mkdir()
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")  # as the command line's run writes it
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small character model (LLTM, 2 layers) trained for a few steps."""
    return _train_text_model(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module", params=["lstm", "gru"])
def cell_checkpoint(request, tmp_path_factory):
    """The same with the fused LSTM or GRU (trained on its torch.nn baseline for the LSTM: the file moves; the GRU with
    two heads). The other cells export through the same two interfaces, by whether their state has a c (TokenModel)
    or not."""
    backend = "torch" if request.param == "lstm" else "cpp"
    heads = ["model.num_heads=2"] if request.param == "gru" else []
    return _train_text_model(tmp_path_factory.mktemp(request.param), f"model.cell={request.param}", f"backend={backend}",
                             *heads)


@pytest.fixture(scope="module")
def aoti_package(checkpoint, tmp_path_factory):
    """``lltm-export CKPT model.pt2`` with the default format (aoti), run as the command: the one AOTInductor
    compile of the default suite (15-35 s on 2 cores), shared by the tests that read the package."""
    if not JIT_DEPRECATED:
        pytest.skip(f"torch {torch.__version__} < 2.13: lltm-export's default is torchscript (torch 2.11's AOTInductor "
                    "loader crashed on these packages, SIGSEGV in _load_aoti: lltm_train/export.py)")
    path = tmp_path_factory.mktemp("aoti") / "model.pt2"
    done = subprocess.run([sys.executable, "-m", "lltm_train.export", str(checkpoint), str(path)], capture_output=True,
                          text=True, timeout=600)
    return path, done


def test_a_checkpoint_loads_on_every_backend_with_the_same_outputs(checkpoint):
    vocab_size = load_task(checkpoint, "python")[0].net.embedding.num_embeddings
    tokens = torch.randint(0, vocab_size, (9, 3))
    outputs = {b: load_task(checkpoint, b)[0].net(tokens)[0] for b in ("python", "cpp")}
    torch.testing.assert_close(outputs["cpp"], outputs["python"], rtol=1e-5, atol=1e-5)
    task, ckpt = load_task(checkpoint, "python")
    assert not task.training and vocabulary(ckpt) == sorted(set(checkpoint.parent.parent.joinpath("text.txt").read_text()))


def test_sampling_carries_the_state_instead_of_rereading_the_text(checkpoint):
    task, ckpt = load_task(checkpoint, "cpp")
    prompt = encode_prompt("ab c", vocabulary(ckpt))
    ids = sample(task.net, prompt, 30, temperature=0.9, top_k=5, seed=7)
    assert ids == sample(task.net, prompt, 30, temperature=0.9, top_k=5, seed=7)  # a seed fixes the text
    assert ids != sample(task.net, prompt, 30, temperature=0.9, top_k=5, seed=8)

    class Rereading(torch.nn.Module):  # the whole text again at each step: what carrying the state must equal
        def __init__(self, net):
            super().__init__()
            self.net, self.seen = net, []

        def forward(self, tokens, state):
            self.seen += tokens[:, 0].tolist()
            return self.net(torch.tensor(self.seen)[:, None])[0], None

    assert ids == sample(Rereading(task.net), prompt, 30, temperature=0.9, top_k=5, seed=7)
    top1 = sample(task.net, prompt, 10, top_k=1)
    assert top1 == sample(task.net, prompt, 10, top_k=1, seed=99)  # top-1 is greedy, whatever the seed


def test_sampling_yields_each_token_as_it_is_drawn_and_refuses_bad_settings():
    """lltm-generate prints each character as it is drawn (a --length of 1e8 printed nothing for hours); settings
    that cannot sample are refused before the first step: an infinite temperature (it drew uniformly) and a seed
    beyond torch.Generator's range (torch's "Overflow when unpacking long long" named no setting)."""
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias, self.calls = torch.nn.Parameter(torch.arange(5.0)), 0

        def forward(self, tokens, state):
            self.calls += 1
            return self.bias.expand(tokens.shape[0], 1, 5), state

    net = Counting()
    first = next(sample_tokens(net, [0], 10**12, seed=3))
    assert net.calls == 1 and first == sample(net, [0], 1, seed=3)[0]
    net.calls = 0
    assert len(sample(net, [0], 4)) == 4 and net.calls == 4  # the prompt, then one step for each token but the last
    for setting, message in (({"temperature": math.inf}, "temperature must be a finite number > 0, got inf"),
                             ({"temperature": math.nan}, "temperature must be a finite number > 0, got nan"),
                             ({"seed": 2**70}, r"seed must be in \[-2\*\*63, 2\*\*64\), got 1180591620717411303424"),
                             ({"top_k": 0}, "top_k must be >= 1")):
        with pytest.raises(ValueError, match=message):
            sample_tokens(net, [0], 5, **setting)


def test_unknown_prompt_characters_are_named(checkpoint):
    vocab = vocabulary(load_task(checkpoint, "python")[1])
    with pytest.raises(ValueError, match=r"'X', 'Z'"):
        encode_prompt("aXbZ", vocab)
    result = subprocess.run([sys.executable, "-m", "lltm_train.commands", "generate", str(checkpoint), "--prompt", "aX"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "'X'" in result.stderr


def test_generate_and_evaluate_commands(checkpoint):
    run = lambda *a: subprocess.run([sys.executable, "-m", "lltm_train.commands", *a], capture_output=True, text=True, timeout=300)
    first = run("generate", str(checkpoint), "--prompt", "ab", "--length", "25", "--seed", "3", "--backend", "cpp")
    again = run("generate", str(checkpoint), "--prompt", "ab", "--length", "25", "--seed", "3", "--backend", "python")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout == again.stdout and len(first.stdout) == 2 + 25 + 1
    evaluated = {b: run("evaluate", str(checkpoint), "--backend", b) for b in ("cpp", "python")}
    assert all(r.returncode == 0 for r in evaluated.values()), evaluated["cpp"].stderr[-2000:]
    assert not any("Tip:" in r.stderr for r in evaluated.values())  # Lightning's advertisements, as in lltm-train
    figures = {b: dict(kv.split("=") for kv in r.stdout.strip().split(": ")[-1].split(", ")) for b, r in evaluated.items()}
    assert set(figures["cpp"]) == {"test/acc", "test/bpc", "test/loss", "test/perplexity"}
    assert all(abs(float(figures["cpp"][k]) - float(figures["python"][k])) < 1e-4 for k in figures["cpp"])


def test_evaluate_with_a_config_that_is_not_a_run_config_says_so_in_one_line(checkpoint, tmp_path):
    (tmp_path / "other.yaml").write_text("model:\n  hidden_size: 8\n")
    (tmp_path / "binary.log").write_bytes(b"\x00\x01\xff\xfe: [")
    for config, message in (("other.yaml", "has no dataset setting"), ("binary.log", "is not a run config in YAML")):
        result = subprocess.run([sys.executable, "-m", "lltm_train.commands", "evaluate", str(checkpoint), "--config",
                                 str(tmp_path / config)], capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_default_format_is_an_aoti_package_with_the_models_outputs(checkpoint, aoti_package):
    """lltm-export's default is aoti (torch.jit is deprecated since torch 2.13): a .pt2 package that the command
    reloaded in a fresh process; loaded here, it gives the eager model's outputs at other T and B (down to the
    1 x 1 steps of sampling), and its metadata holds the vocabulary and the state's size (examples/cpp reads them)."""
    path, done = aoti_package
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {path} (aoti)" in done.stdout and "it matches the checkpoint's model" in done.stdout
    assert not done.stderr.strip(), done.stderr[-3000:]  # no warnings, no upstream noise
    task, ckpt = load_task(checkpoint, "cpp")
    model = TokenModel(task.net)
    assert json.loads((path.parent / "model.pt2.vocab.json").read_text()) == vocabulary(ckpt)
    package = torch._inductor.aoti_load_package(str(path))
    info = package.get_metadata()
    assert {k: info[k] for k in ("vocab.json", "config.json")} == metadata(model, vocabulary(ckpt))
    assert json.loads(info["config.json"]) == {"num_layers": 2, "hidden_size": task.net.rnn.hidden_size, "states": 2}
    for T, B in ((1, 1), (11, 4)):
        args = example_inputs(model, T, B, seed=T)
        with torch.no_grad():
            for got, want in zip(package(*args), model(*args)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_states_are_checked(package, model)


def assert_states_are_checked(loaded, model: torch.nn.Module, match: str = "state {}: expected shape") -> None:
    """A loaded file refuses a state of any other shape than (num_layers, B, hidden_size), naming it (the AOTInductor
    package read a wrong one out of bounds, silently; TorchScript ignored extra layers), and reads a non-contiguous
    one by its strides."""
    tokens, *states = example_inputs(model, T=3, B=4)
    L, B, H = states[0].shape
    for shape in ((1, 1, 1), (L, B, H - 1), (L, B, H + 1), (L, B - 1, H), (L, B + 1, H), (L + 1, B, H), (B, H)):
        for i in range(len(states)):
            bad = list(states)
            bad[i] = torch.zeros(shape)
            with pytest.raises((RuntimeError, AssertionError), match=match.format(['h0', 'c0', 'n0', 'm0'][i])):
                loaded(tokens, *bad)
    strided = [s.transpose(0, 1).contiguous().transpose(0, 1) for s in states]  # (L, B, H) with strides of (B, L, H)
    assert not strided[0].is_contiguous()
    with torch.no_grad():
        for got, want in zip(loaded(tokens, *strided), model(tokens, *states)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["torchscript", "exported"])  # aoti: the test above (one compile a session)
def test_each_format_reloads_in_a_fresh_process_with_the_models_outputs(checkpoint, tmp_path, fmt):
    """The fresh process imports lltm_train and nothing else of the training code; its inputs have another
    T and B than the ones the file was made with."""
    task, ckpt = load_task(checkpoint, "cpp")
    model = TokenModel(task.net)
    path = export(model, fmt, tmp_path / f"model.{fmt}.pt2", vocabulary(ckpt))
    assert check_in_fresh_process(model, fmt, path, T=11, B=4) < 1e-5
    assert (tmp_path / f"model.{fmt}.pt2.vocab.json").is_file()
    if fmt == "torchscript":
        assert_states_are_checked(torch.jit.load(str(path)), model)
    else:  # torch.export's own guards come first
        assert_states_are_checked(torch.export.load(str(path)).module(), model, match=r"Guard failed: .*\b{}\b")


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_every_cell_has_the_interface_of_its_state(cell, backend):
    """TokenModel (h and c) for the cells with a c state, TokenModelH (h alone) for the others, fused or torch.nn's."""
    from lltm_train.models import CharLM

    if backend == "torch" and not CELLS[cell].has_torch:
        pytest.skip(f"PyTorch has no {CELLS[cell].title}")
    model = token_model(CharLM(7, 5, 3, num_layers=2, cell=cell, backend=backend))
    assert num_states(model) == len(CELLS[cell].states)
    assert isinstance(model, TokenModel if len(CELLS[cell].states) == 2 else TokenModelH) or cell == "slstm"
    logits, *state = model(*example_inputs(model, T=4, B=2))
    assert logits.shape == (4, 2, 7) and [s.shape for s in state] == [(2, 2, 5)] * len(CELLS[cell].states)


@pytest.mark.parametrize("fmt", ["torchscript", "exported"])
def test_lstm_and_gru_models_export_and_reload(cell_checkpoint, tmp_path, fmt):
    """An LSTM model (trained on torch.nn.LSTM) exports through the fused cell; the files of a cell whose state
    is h alone (the GRU here) take and return h alone."""
    task, ckpt = load_task(cell_checkpoint, "cpp")
    assert task.net.rnn.num_heads == (2 if task.hparams["cell"] == "gru" else 1)
    model = token_model(task.net)
    h_only = not CELLS[task.hparams["cell"]].has_cell_state
    assert isinstance(model, TokenModelH if h_only else TokenModel) and len(example_inputs(model)) == (2 if h_only else 3)
    path = export(model, fmt, tmp_path / f"model.{fmt}.pt2", vocabulary(ckpt))
    assert check_in_fresh_process(model, fmt, path, T=11, B=4) < 1e-5


def test_pytorchs_own_layer_is_refused_in_one_line_without_torchs_warning(cell_checkpoint, tmp_path):
    """backend torch (torch.nn.LSTM) fixes T and B under torch.export: refused in one line, without the
    multi-line warning torch.export gave first about the attributes torch.nn.LSTM sets while traced."""
    task, ckpt = load_task(cell_checkpoint, "cpp")
    if task.hparams["cell"] != "lstm":
        pytest.skip("the LSTM model (the GRU's has heads, which torch.nn has not)")
    task, ckpt = load_task(cell_checkpoint, "torch")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="export with --backend cpp or cuda"):
            export(token_model(task.net), "exported", tmp_path / "m.pt2", vocabulary(ckpt))
    assert not [w for w in seen if "were assigned during export" in str(w.message)]


@pytest.mark.parametrize("fmt", ["torchscript", "exported"])  # aoti's metadata: test_the_default_format_is_...
def test_each_file_holds_its_vocabulary_and_state_size(checkpoint, tmp_path, fmt):
    task, ckpt = load_task(checkpoint, "cpp")
    model = TokenModel(task.net)
    path = export(model, fmt, tmp_path / f"m.{fmt}", vocabulary(ckpt))
    files = {"vocab.json": "", "config.json": ""}
    if fmt == "torchscript":
        torch.jit.load(str(path), _extra_files=files)
    else:
        torch.export.load(str(path), extra_files=files)
    files = {k: v.decode() if isinstance(v, bytes) else v for k, v in files.items()}  # TorchScript's are bytes
    assert files == metadata(model, vocabulary(ckpt)) and json.loads(files["vocab.json"]) == vocabulary(ckpt)
    assert example_inputs(model)[0].dtype == torch.int64


def _cmake() -> str:
    import os
    import shutil

    found = shutil.which("cmake", path=os.path.dirname(sys.executable)) or shutil.which("cmake")
    if found is None:  # the dev extra installs it from PyPI (pip install -e .[dev])
        pytest.fail("cmake is not installed: pip install cmake")
    return found


@pytest.mark.slow  # a CMake build (70-120 s on 2 cores) and more AOTInductor compiles (the GRU's, the sLSTM's)
def test_the_cmake_op_library_and_the_cpp_generator_match_python(checkpoint, aoti_package, tmp_path):
    """examples/cpp builds liblltm_ops.so (the repository's CMakeLists.txt) and lltm-generate-cpp against the
    installed torch. The library alone gives torch.ops.lltm.* to a Python without lltm_train; the C++
    program samples from lltm-export's AOTInductor package (the default format; AOTIModelPackageLoader) exactly
    the text lltm-generate samples from the checkpoint, and from the deprecated TorchScript file too."""
    from pathlib import Path

    from lltm_train.functional import lltm_layer

    root = Path(__file__).resolve().parents[1]
    build = tmp_path / "build"
    configure = subprocess.run([_cmake(), "-S", str(root / "examples" / "cpp"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                                f"-DPython3_EXECUTABLE={sys.executable}"], capture_output=True, text=True)
    assert configure.returncode == 0, configure.stdout[-2000:] + configure.stderr[-2000:]
    made = subprocess.run([_cmake(), "--build", str(build), "-j2"], capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-2000:]

    library = build / "lltm_ops" / "liblltm_ops.so"
    args = [torch.randn(6, 3, 5), torch.randn(3, 4), torch.randn(3, 4), torch.randn(12, 5), torch.randn(12, 4), torch.randn(12)]
    torch.save(args, tmp_path / "args.pt")
    code = ("import sys, torch; torch.ops.load_library(sys.argv[1]); a = torch.load(sys.argv[2]); "
            "torch.save(torch.ops.lltm.layer_forward(*a, None)[:3], sys.argv[3]); "
            "assert 'lltm_train' not in sys.modules")
    alone = subprocess.run([sys.executable, "-c", code, str(library), str(tmp_path / "args.pt"), str(tmp_path / "out.pt")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-2000:]
    x, h0, c0, w_ih, w_hh, b = args
    want = lltm_layer(x, (h0, c0), w_ih, w_hh, b, backend="python")
    for got, expected in zip(torch.load(tmp_path / "out.pt"), (want[0], *want[1])):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    package, exported = aoti_package
    assert exported.returncode == 0, exported.stderr[-2000:]
    generate_cpp = lambda model, *options: subprocess.run([str(build / "lltm-generate-cpp"), str(model), *options],
                                                          capture_output=True, text=True, timeout=300)
    options = ["--prompt", "the ", "--length", "80", "--temperature", "0.9", "--top-k", "6", "--seed", "11"]
    cpp = generate_cpp(package, *options)
    assert cpp.returncode == 0, cpp.stderr[-2000:]
    python = subprocess.run([sys.executable, "-m", "lltm_train.commands", "generate", str(checkpoint), *options, "--backend", "cpp"],
                            capture_output=True, text=True)
    assert python.returncode == 0, python.stderr[-2000:]
    assert cpp.stdout == python.stdout and len(cpp.stdout) == 4 + 80 + 1
    unknown = generate_cpp(package, "--prompt", "the Q")
    assert unknown.returncode == 2 and "'Q'" in unknown.stderr

    # the deprecated TorchScript file, while torch has torch.jit
    task, ckpt = load_task(checkpoint, "cpp")
    traced = export(TokenModel(task.net), "torchscript", tmp_path / "model.pt", vocabulary(ckpt))
    cpp = generate_cpp(traced, *options)
    assert cpp.returncode == 0 and cpp.stdout == python.stdout, cpp.stderr[-2000:]
    # a .pt2 that is not an AOTInductor package (--format exported): one line
    program = export(TokenModel(task.net), "exported", tmp_path / "program.pt2", vocabulary(ckpt))
    wrong = generate_cpp(program, *options)
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1 and "AOTInductor" in wrong.stderr, wrong.stderr

    # a GRU model, whose state is h alone, and an sLSTM model, whose state is (h, c, n, m)
    for cell in ("gru", "slstm"):
        (tmp_path / cell).mkdir()
        cell_ckpt = _train_text_model(tmp_path / cell, f"model.cell={cell}")
        task, ckpt = load_task(cell_ckpt, "cpp")
        model = export(token_model(task.net), "aoti", tmp_path / f"{cell}.pt2", vocabulary(ckpt))
        cpp = generate_cpp(model, *options)
        python = subprocess.run([sys.executable, "-m", "lltm_train.commands", "generate", str(cell_ckpt), *options,
                                 "--backend", "cpp"], capture_output=True, text=True)
        assert cpp.returncode == 0 and python.returncode == 0, cpp.stderr[-2000:] + python.stderr[-2000:]
        assert cpp.stdout == python.stdout and len(cpp.stdout) == 4 + 80 + 1, cell


def test_a_compiled_models_checkpoint_loads_uncompiled(tmp_path):
    """model.compile=true trains a torch.compile'd network; its checkpoint has the plain parameter names and
    loads into an uncompiled model with the same outputs."""
    cfg = make_cfg(tmp_path, "dataset=copy", "dataset.delay=4", "dataset.length=3", "dataset.train_size=64", "dataset.val_size=16",
                   "dataset.test_size=16", "dataset.batch_size=16", "model.compile=true", "trainer.max_steps=2",
                   "trainer.val_check_interval=2", "trainer.num_sanity_val_steps=0", "backend=cpp")
    train(cfg)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert not any("_orig_mod" in k for k in torch.load(ckpt, weights_only=False)["state_dict"])
    task, _ = load_task(ckpt, "python")
    assert task.hparams["compile"] is False and getattr(task.net, "_compiled_call_impl", None) is None
    tokens = torch.randint(0, task.net.embedding.num_embeddings, (6, 2))
    torch.testing.assert_close(task.net(tokens)[0], load_task(ckpt, "cpp")[0].net(tokens)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)
def test_a_checkpoint_moves_between_the_gpu_and_the_cpu(tmp_path):
    """Trained with backend=cuda on the GPU: resumed with cpp on the CPU, and generating with cpp on the CPU
    gives what cuda on the GPU gives; trained on the CPU: resumed with cuda on the GPU."""
    common = ["dataset=copy", "dataset.delay=4", "dataset.length=3", "dataset.train_size=64", "dataset.val_size=16", "dataset.test_size=16",
              "dataset.batch_size=16", "trainer.val_check_interval=2", "trainer.num_sanity_val_steps=0",
              "float32_matmul_precision=highest"]
    gpu = tmp_path / "gpu"
    train(make_cfg(gpu, *common, "backend=cuda", "trainer.accelerator=gpu", "trainer.max_steps=2"))
    ckpt = gpu / "checkpoints" / "last.ckpt"
    on_cpu = load_task(ckpt, "cpp", "cpu")[0]
    tokens = torch.randint(0, on_cpu.net.embedding.num_embeddings, (6, 3))
    on_gpu = load_task(ckpt, "cuda", "cuda")[0].net(tokens.cuda())[0].cpu()
    torch.testing.assert_close(on_cpu.net(tokens)[0], on_gpu, rtol=1e-4, atol=1e-5)
    metrics = train(make_cfg(gpu, *common, "backend=cpp", "trainer.accelerator=cpu", "trainer.max_steps=4", f"ckpt_path={ckpt}"))
    assert torch.load(ckpt, weights_only=False)["global_step"] == 4 and math.isfinite(metrics["val/loss"])
    metrics = train(make_cfg(gpu, *common, "backend=cuda", "trainer.accelerator=gpu", "trainer.max_steps=6", f"ckpt_path={ckpt}"))
    assert torch.load(ckpt, weights_only=False)["global_step"] == 6


# Runs command lines as `python -m MODULE ARGS` runs each (runpy, as __main__), one after the other in one Python
# process, each one's stdout and stderr caught at the file descriptors: one interpreter start and one import of
# torch and Lightning (4-6 s on 2 cores) instead of one per line.
_COMMAND_LINES = r"""
import json, os, runpy, sys, tempfile, traceback, warnings
import lltm_train.commands, lltm_train.export, lltm_train.inference
lines, report = json.loads(sys.argv[1]), sys.argv[2]
results = {}
for name, (module, *args) in lines.items():
    sys.stdout.flush(); sys.stderr.flush()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        code = 0
        try:
            with warnings.catch_warnings():  # a warning shown once is shown again for each line
                warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)  # runpy's
                sys.argv = [module, *args]
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc(); code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2); os.close(saved[0]); os.close(saved[1])
        out.seek(0); err.seek(0)
        results[name] = {"code": code, "stdout": out.read(), "stderr": err.read()}
with open(report, "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def command_lines(checkpoint, tmp_path_factory):
    """The command lines of the two tests below, run in one Python process (``_COMMAND_LINES``): a dict of
    name -> (``code``, ``stdout``, ``stderr``, ``dir``: where its files went), and ``imports``: what importing
    the commands printed on stderr."""
    d = tmp_path_factory.mktemp("lines")
    (d / "adir").mkdir()
    ckpt = str(checkpoint)
    lines = {"to_dir": ["lltm_train.export", ckpt, str(d / "adir")],
             "unwritable": ["lltm_train.export", ckpt, "/proc/nope/m.pt2"],
             "pt_name": ["lltm_train.export", ckpt, str(d / "m.pt"), "--format", "aoti"],  # aoti writes .pt2
             "exported_name": ["lltm_train.export", ckpt, str(d / "e.pt"), "--format", "exported"],  # so does exported
             "generate_tpu": ["lltm_train.commands", "generate", ckpt, "--device", "tpu"],
             "generate_meta": ["lltm_train.commands", "generate", ckpt, "--device", "meta"],
             "torchscript": ["lltm_train.export", ckpt, str(d / "ts.pt"), "--format", "torchscript"],
             "exported_python": ["lltm_train.export", ckpt, str(d / "py.pt2"), "--format", "exported", "--backend",
                                 "python"]}
    if not torch.cuda.is_available():
        lines |= {"generate_cuda": ["lltm_train.commands", "generate", ckpt, "--device", "cuda"],
                  "evaluate_cuda": ["lltm_train.commands", "evaluate", ckpt, "--device", "cuda"],
                  "export_cuda": ["lltm_train.export", ckpt, str(d / "m.pt2"), "--device", "cuda"]}
    done = subprocess.run([sys.executable, "-c", _COMMAND_LINES, json.dumps(lines), str(d / "report.json")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {name: {**r, "dir": d} for name, r in json.loads((d / "report.json").read_text()).items()}
    return {**results, "imports": done.stderr}


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_hostile_command_lines_get_one_line_each(command_lines):
    """The commands' errors are one line with status 2: a CUDA device on a machine without one, an export
    to a directory, to an unwritable place or to a name that is not a .pt2 for the default format or exported
    (nothing left behind). (A text moved since training: the test below.)"""
    assert not _lines(command_lines["imports"]), command_lines["imports"][-2000:]
    errors = {k: r for k, r in command_lines.items() if k not in ("imports", "torchscript")}
    for name, r in errors.items():
        assert r["code"] == 2 and len(_lines(r["stderr"])) == 1 and "Traceback" not in r["stderr"], (name, r["stderr"][-2000:])
        assert r["stderr"].startswith(("lltm-export: error: ", "lltm-generate: error: ", "lltm-evaluate: error: ")), name
    if not torch.cuda.is_available():
        assert all("--device cuda: no CUDA device is visible" in errors[k]["stderr"]
                   for k in ("generate_cuda", "evaluate_cuda", "export_cuda"))
    d = errors["to_dir"]["dir"]
    assert "adir is a directory; give the file to write, e.g. " in errors["to_dir"]["stderr"]
    assert "cannot write /proc/nope/m.pt2" in errors["unwritable"]["stderr"]
    assert f"is a .pt2 file: name it {d / 'm.pt2'} (or give --format torchscript" in errors["pt_name"]["stderr"]
    assert f"(--format exported) is a .pt2 file: name it {d / 'e.pt2'}" in errors["exported_name"]["stderr"]
    assert "--device tpu: not a device; use cpu or cuda" in errors["generate_tpu"]["stderr"]  # (torch's list of types)
    assert "--device meta: the commands run on cpu or cuda" in errors["generate_meta"]["stderr"]
    assert "export with --backend cpp or cuda (one op per layer)" in errors["exported_python"]["stderr"]
    left = {p.name for p in d.iterdir()} - {"adir", "report.json", "ts.pt", "ts.pt.vocab.json"}
    assert not left and not any((d / "adir").iterdir()), left


def test_torchscript_is_deprecated_in_one_line_and_still_exports(command_lines):
    """--format torchscript (torch.jit is deprecated since torch 2.13) says so in one warning line, not torch's
    own warnings or a traceback, and still writes a file that matches the checkpoint."""
    r = command_lines["torchscript"]
    assert r["code"] == 0, r["stderr"][-2000:]
    if JIT_DEPRECATED:
        [warning] = _lines(r["stderr"])
        assert warning.startswith("lltm-export: warning: --format torchscript is deprecated") and "torch 2.13" in warning
    else:  # before torch 2.13 it is the default, and nothing is deprecated
        assert not _lines(r["stderr"]), r["stderr"][-2000:]
    assert "(torchscript); reloaded in a fresh process, it matches the checkpoint's model" in r["stdout"]
    assert (r["dir"] / "ts.pt").is_file() and (r["dir"] / "ts.pt.vocab.json").is_file()


def test_the_help_names_the_default_and_the_deprecated_format(capsys, monkeypatch, tmp_path):
    """In-process (no checkpoint is read): --help says aoti is the default and torchscript deprecated; without a C++
    compiler, aoti is refused in one line naming --format exported."""
    from lltm_train import config
    from lltm_train.export import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0 and f"the default here: {DEFAULT_FORMAT} (aoti from torch 2.13, torchscript before)" in text
    assert DEFAULT_FORMAT == ("aoti" if torch.__version__ >= (2, 13) else "torchscript")
    assert "torchscript: torch.jit.trace (.pt), DEPRECATED from torch 2.13, which deprecates torch.jit" in text
    monkeypatch.setattr(config, "missing_compiler", lambda: "no C++ compiler found")
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "no.ckpt"), str(tmp_path / "m.pt2"), "--format", "aoti"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(_lines(err)) == 1 and "(no C++ compiler found)" in err and "--format exported" in err
    assert not any(tmp_path.iterdir())


def test_a_moved_text_and_the_step_of_a_checkpoints_sample(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over a lazy dog. " * 100)
    cfg = make_cfg(tmp_path, "dataset=text", f"dataset.path={text}", "dataset.seq_len=16", "trainer.max_steps=7",
                   "trainer.val_check_interval=7", "trainer.num_sanity_val_steps=0", "trainer.log_every_n_steps=50")
    metrics = train(cfg)
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    # the run's final training loss (step 7), not the one of step 0, the last logging step's (log every 50)
    first = train(make_cfg(tmp_path / "one", "dataset=text", f"dataset.path={text}", "dataset.seq_len=16",
                           "trainer.max_steps=1", "trainer.val_check_interval=1", "trainer.num_sanity_val_steps=0"))
    assert metrics["train/loss"] != pytest.approx(first["train/loss"], rel=1e-6)
    evaluated = subprocess.run([sys.executable, "-m", "lltm_train.commands", "evaluate", str(ckpt), "--split", "val"],
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0 and "--- sample at step 7 ---" in evaluated.stdout, evaluated.stderr[-2000:]
    text.rename(tmp_path / "moved.txt")
    moved = subprocess.run([sys.executable, "-m", "lltm_train.commands", "evaluate", str(ckpt)], capture_output=True,
                           text=True, timeout=300)
    assert moved.returncode == 2 and "Traceback" not in moved.stderr
    assert "cannot be built (FileNotFoundError: TextDataModule: no such text file" in moved.stderr



def test_a_vanishing_temperature_is_greedy_decoding(checkpoint):
    task, ckpt = load_task(checkpoint, "cpp")
    prompt = encode_prompt("the ", vocabulary(ckpt))
    greedy = sample(task.net, prompt, 20, temperature=1e-300, seed=1)
    assert greedy == sample(task.net, prompt, 20, temperature=1e-300, seed=2) == sample(task.net, prompt, 20, top_k=1)
