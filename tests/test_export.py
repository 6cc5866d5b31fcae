"""Trained models outside training: checkpoints loaded on any backend, text generation, evaluation, and the
TorchScript / torch.export / AOTInductor files of lltm-export, each reloaded in a fresh process."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from conftest import CUDA_READY, CUDA_SKIP_REASON
from helpers import make_cfg
from lltm_train.export import TokenModel, TokenModelH, check_in_fresh_process, example_inputs, export, token_model
from lltm_train.inference import encode_prompt, load_task, sample, vocabulary
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
    """The same with the fused LSTM or GRU (trained on its torch.nn baseline for the LSTM: the file moves). The
    other cells export through the same two interfaces, by whether their state has a c (TokenModel) or not."""
    backend = "torch" if request.param == "lstm" else "cpp"
    return _train_text_model(tmp_path_factory.mktemp(request.param), f"model.cell={request.param}", f"backend={backend}")


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
    figures = {b: dict(kv.split("=") for kv in r.stdout.strip().split(": ")[-1].split(", ")) for b, r in evaluated.items()}
    assert set(figures["cpp"]) == {"test/acc", "test/bpc", "test/loss", "test/perplexity"}
    assert all(abs(float(figures["cpp"][k]) - float(figures["python"][k])) < 1e-4 for k in figures["cpp"])


@pytest.mark.parametrize("fmt", ["torchscript", "exported", pytest.param("aoti", marks=pytest.mark.slow)])
def test_each_format_reloads_in_a_fresh_process_with_the_models_outputs(checkpoint, tmp_path, fmt):
    """The fresh process imports lltm_train and nothing else of the training code; its inputs have another
    T and B than the ones the file was made with."""
    task, ckpt = load_task(checkpoint, "cpp")
    model = TokenModel(task.net)
    path = export(model, fmt, tmp_path / f"model.{fmt}.pt2", vocabulary(ckpt))
    assert check_in_fresh_process(model, fmt, path, T=11, B=4) < 1e-5
    assert (tmp_path / f"model.{fmt}.pt2.vocab.json").is_file()


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_every_cell_has_the_interface_of_its_state(cell, backend):
    """TokenModel (h and c) for the cells with a c state, TokenModelH (h alone) for the others, fused or torch.nn's."""
    from lltm_train.models import CharLM

    if backend == "torch" and not CELLS[cell].has_torch:
        pytest.skip(f"PyTorch has no {CELLS[cell].title}")
    model = token_model(CharLM(7, 5, 3, num_layers=2, cell=cell, backend=backend))
    assert isinstance(model, TokenModel if CELLS[cell].has_cell_state else TokenModelH)
    logits, *state = model(*example_inputs(model, T=4, B=2))
    assert logits.shape == (4, 2, 7) and [s.shape for s in state] == [(2, 2, 5)] * len(CELLS[cell].states)


@pytest.mark.parametrize("fmt", ["torchscript", "exported"])
def test_lstm_and_gru_models_export_and_reload(cell_checkpoint, tmp_path, fmt):
    """An LSTM model (trained on torch.nn.LSTM) exports through the fused cell; the files of a cell whose state
    is h alone (the GRU here) take and return h alone."""
    task, ckpt = load_task(cell_checkpoint, "cpp")
    model = token_model(task.net)
    h_only = not CELLS[task.hparams["cell"]].has_cell_state
    assert isinstance(model, TokenModelH if h_only else TokenModel) and len(example_inputs(model)) == (2 if h_only else 3)
    path = export(model, fmt, tmp_path / f"model.{fmt}.pt2", vocabulary(ckpt))
    assert check_in_fresh_process(model, fmt, path, T=11, B=4) < 1e-5


def test_torchscript_file_holds_its_vocabulary(checkpoint, tmp_path):
    import json

    task, ckpt = load_task(checkpoint, "cpp")
    path = export(TokenModel(task.net), "torchscript", tmp_path / "m.pt", vocabulary(ckpt))
    files = {"vocab.json": ""}
    torch.jit.load(str(path), _extra_files=files)
    assert json.loads(files["vocab.json"]) == vocabulary(ckpt)
    assert example_inputs(TokenModel(task.net))[0].dtype == torch.int64


def _cmake() -> str:
    import os
    import shutil

    found = shutil.which("cmake", path=os.path.dirname(sys.executable)) or shutil.which("cmake")
    if found is None:  # the dev extra installs it from PyPI (pip install -e .[dev])
        pytest.fail("cmake is not installed: pip install cmake")
    return found


@pytest.mark.slow  # a CMake build (about 70 s on 2 cores)
def test_the_cmake_op_library_and_the_cpp_generator_match_python(checkpoint, tmp_path):
    """examples/cpp builds liblltm_ops.so (the repository's CMakeLists.txt) and lltm-generate-cpp against the
    installed torch. The library alone gives torch.ops.lltm.* to a Python without lltm_train; the C++
    program samples from the TorchScript export exactly the text lltm-generate samples from the checkpoint."""
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

    task, ckpt = load_task(checkpoint, "cpp")
    model = export(TokenModel(task.net), "torchscript", tmp_path / "model.pt", vocabulary(ckpt))
    options = ["--prompt", "the ", "--length", "80", "--temperature", "0.9", "--top-k", "6", "--seed", "11"]
    cpp = subprocess.run([str(build / "lltm-generate-cpp"), str(model), *options], capture_output=True, text=True)
    assert cpp.returncode == 0, cpp.stderr[-2000:]
    python = subprocess.run([sys.executable, "-m", "lltm_train.commands", "generate", str(checkpoint), *options, "--backend", "cpp"],
                            capture_output=True, text=True)
    assert python.returncode == 0, python.stderr[-2000:]
    assert cpp.stdout == python.stdout and len(cpp.stdout) == 4 + 80 + 1
    unknown = subprocess.run([str(build / "lltm-generate-cpp"), str(model), "--prompt", "the Q"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "'Q'" in unknown.stderr

    # a GRU model: its state is h alone
    (tmp_path / "gru").mkdir()
    gru_ckpt = _train_text_model(tmp_path / "gru", "model.cell=gru")
    task, ckpt = load_task(gru_ckpt, "cpp")
    model = export(token_model(task.net), "torchscript", tmp_path / "gru.pt", vocabulary(ckpt))
    cpp = subprocess.run([str(build / "lltm-generate-cpp"), str(model), *options], capture_output=True, text=True)
    python = subprocess.run([sys.executable, "-m", "lltm_train.commands", "generate", str(gru_ckpt), *options, "--backend", "cpp"],
                            capture_output=True, text=True)
    assert cpp.returncode == 0 and python.returncode == 0, cpp.stderr[-2000:] + python.stderr[-2000:]
    assert cpp.stdout == python.stdout and len(cpp.stdout) == 4 + 80 + 1


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


def test_hostile_command_lines_get_one_line_each(checkpoint, tmp_path):
    """The commands' errors are one line with status 2: a CUDA device on a machine without one, an export
    to a directory or an unwritable place (nothing left behind), a text moved since training."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "lltm_train.commands", *a], capture_output=True, text=True, timeout=300)
    export_cmd = lambda *a: subprocess.run([sys.executable, "-m", "lltm_train.export", *a], capture_output=True, text=True,
                                           timeout=300)
    results = []
    if not torch.cuda.is_available():
        results += [run("generate", str(checkpoint), "--device", "cuda"), run("evaluate", str(checkpoint), "--device", "cuda"),
                    export_cmd(str(checkpoint), str(tmp_path / "m.pt"), "--device", "cuda")]
        assert all("--device cuda: no CUDA device is visible" in r.stderr for r in results)
    (tmp_path / "adir").mkdir()
    to_dir = export_cmd(str(checkpoint), str(tmp_path / "adir"))
    assert "is a directory; give the file to write" in to_dir.stderr and not (tmp_path / "adir.vocab.json").exists()
    unwritable = export_cmd(str(checkpoint), "/proc/nope/m.pt")
    assert "cannot write /proc/nope/m.pt" in unwritable.stderr
    results += [to_dir, unwritable]
    for r in results:
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]


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
