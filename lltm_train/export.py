"""``lltm-export``: a trained text model as a file that runs without lltm-train's training code.

Formats (``--format``):

- ``aoti`` (the default from torch 2.13): ``torch.export`` of the model compiled by AOTInductor into a package (``.pt2``) for the
  device at hand, T and B dynamic (1 to 100,000 each). Python: ``torch._inductor.aoti_load_package`` (after
  ``import lltm_train``, which registers the ops); C++: ``torch::inductor::AOTIModelPackageLoader`` with the op
  library loaded (``examples/cpp``). The vocabulary and the state's size are inside, as the package's metadata
  ``vocab.json`` and ``config.json``.
- ``exported``: a ``torch.export`` ExportedProgram (``.pt2``, ``torch.export.load``), T and B dynamic as for
  ``aoti``; ``import lltm_train`` makes its ops known. The same two files are inside as extra files.
- ``torchscript`` (the default before torch 2.13; deprecated from 2.13, which deprecates torch.jit):
  ``torch.jit.trace`` of the model, for TorchScript in Python or C++ (``torch::jit::load``), with the op library
  loaded. T and B may vary. The same two files are inside as extra files. It stays while torch has torch.jit.
  (Before 2.13 AOTInductor is not the default: torch 2.11's loader crashed, SIGSEGV in ``_load_aoti``, on these
  packages, seen on the H200 image with torch 2.11+cu130 on 2026-12-04.)

Every format has one interface, by the state of the model's cell: ``(tokens (T, B) int64, h0 (L, B, H),
c0 (L, B, H)) -> (logits (T, B, V), h_n, c_n)`` for the cells with a c state (LLTM, LSTM), ``(tokens, h0) ->
(logits, h_n)`` for the others (GRU, RNN); float32, zeros for a fresh state. The vocabulary goes beside the file as
``<OUT>.vocab.json`` (a list of characters in token-id order). After writing, the file is loaded in a fresh
Python process and its outputs are compared with the checkpoint's eager model on the same input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from .console import help_text, quiet_upstream_warnings
from .nn import RecurrentLayers

FORMATS = ("aoti", "exported", "torchscript")


# torch 2.13 deprecates torch.jit: AOTInductor from there on; TorchScript before (see the module's docstring)
JIT_DEPRECATED = torch.__version__ >= (2, 13)
DEFAULT_FORMAT = "aoti" if JIT_DEPRECATED else "torchscript"
SUFFIXES = {"aoti": ".pt2", "exported": ".pt2", "torchscript": ".pt"}
MAX_DIM = 100_000
TORCHSCRIPT_DEPRECATED = ("--format torchscript is deprecated: torch.jit is deprecated upstream since torch 2.13; the "
                          "default, --format aoti (torch.export + AOTInductor, a .pt2 package), replaces it")


def checked_states(net: nn.Module, tokens: Tensor, **states: Tensor) -> tuple[Tensor, ...]:
    """Each state checked by ``lltm::check_state`` against (num_layers, B, hidden_size), B the tokens' (T, B) second
    size, and copied. Inside the exported graph, so every format checks: AOTInductor's compiled code does not check
    its inputs' shapes (a wrong one was read out of bounds), and a traced TorchScript file ignored extra layers.

    Raises:
        RuntimeError: a state of another shape, naming it (``h0``, ``c0``, ...) and the shape expected.
    """
    rnn = net.rnn
    return tuple(torch.ops.lltm.check_state(state, tokens, rnn.num_layers, rnn.hidden_size, name)
                 for name, state in states.items())


class TokenModel(nn.Module):
    """A :class:`~lltm_train.models.CharLM` whose cell has an (h, c) state (LLTM, LSTM), with that state as two
    plain tensors: what the exported files take and return."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, tokens: Tensor, h0: Tensor, c0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits, (h, c) = self.net(tokens, checked_states(self.net, tokens, h0=h0, c0=c0))
        return logits, h, c


class TokenModelH(nn.Module):
    """As :class:`TokenModel`, for a cell whose state is h alone (GRU, RNN)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, tokens: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
        logits, h = self.net(tokens, checked_states(self.net, tokens, h0=h0)[0])
        return logits, h


class TokenModelSLSTM(nn.Module):
    """As :class:`TokenModel`, for the sLSTM's state (h, c, n, m)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, tokens: Tensor, h0: Tensor, c0: Tensor, n0: Tensor,
                m0: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        logits, (h, c, n, m) = self.net(tokens, checked_states(self.net, tokens, h0=h0, c0=c0, n0=n0, m0=m0))
        return logits, h, c, n, m


def token_model(net: nn.Module) -> nn.Module:
    """The exported interface of a character model: :class:`TokenModel`, :class:`TokenModelH` for a cell whose
    state is h alone (GRU, RNN), :class:`TokenModelSLSTM` for the sLSTM's four states."""
    rnn = net.rnn
    states = len(rnn.cell.states) if isinstance(rnn, RecurrentLayers) else 2 if isinstance(rnn, nn.LSTM) else 1
    return {1: TokenModelH, 2: TokenModel, 4: TokenModelSLSTM}[states](net)


def num_states(model: nn.Module) -> int:
    return {TokenModelH: 1, TokenModelSLSTM: 4}.get(type(model), 2)


def example_inputs(model: nn.Module, T: int = 5, B: int = 3, seed: int = 0) -> tuple[Tensor, ...]:
    """Random tokens and a random state for ``model`` (a :func:`token_model`), on its device."""
    net = model.net
    g = torch.Generator().manual_seed(seed)
    L, H, V = net.rnn.num_layers, net.rnn.hidden_size, net.embedding.num_embeddings
    device = net.head.weight.device
    state = [torch.randn(L, B, H, generator=g).to(device) for _ in range(num_states(model))]
    return (torch.randint(0, V, (T, B), generator=g).to(device), *state)


def metadata(model: nn.Module, vocab: list[str] | None) -> dict[str, str]:
    """What a program needs besides the file to sample from it (``examples/cpp`` reads them): ``vocab.json``, the
    vocabulary as a JSON list, and ``config.json``, the state's size (``num_layers``, ``hidden_size``, and
    ``states``: 2 for (h, c), 1 for h alone, 4 for the sLSTM's (h, c, n, m)). The package metadata of ``aoti``, the extra files of the others."""
    rnn = model.net.rnn
    return {"vocab.json": json.dumps(vocab or [], ensure_ascii=False),
            "config.json": json.dumps({"num_layers": rnn.num_layers, "hidden_size": rnn.hidden_size,
                                       "states": num_states(model)})}


def export(model: nn.Module, fmt: str, out: Path, vocab: list[str] | None) -> Path:
    """Writes ``model`` to ``out`` in format ``fmt`` (and ``<out>.vocab.json``); returns ``out``.

    Raises:
        ValueError: ``out`` is a directory, or it or its vocabulary file cannot be written (checked first:
            nothing is left behind), or ``fmt`` is ``torchscript`` and this torch has no ``torch.jit.trace``.
    """
    model = model.eval()
    args = example_inputs(model)
    _check_writable(out, fmt)
    _check_writable(Path(f"{out}.vocab.json"), fmt)
    extra = metadata(model, vocab)
    with torch.no_grad(), warnings.catch_warnings():
        quiet_upstream_warnings()  # torch's pytree deprecation, which AOTInductor's packaging reports too
        if fmt == "torchscript":
            if not hasattr(torch.jit, "trace"):
                raise ValueError(f"--format torchscript: torch {torch.__version__} has no torch.jit.trace; use --format aoti")
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the Python API's shape checks become
            traced = torch.jit.trace(model, args, check_trace=False)  # constants: the ops check again
            torch.jit.save(traced, str(out), _extra_files=extra)
            _write_vocab(out, vocab)
            return out
        T, B = torch.export.Dim("T", min=1, max=MAX_DIM), torch.export.Dim("B", min=1, max=MAX_DIM)
        # torch.nn.LSTM's attributes set while tracing (backend torch): a multi-line warning before the error below
        warnings.filterwarnings("ignore", message=r"(?s).*were assigned during export")
        try:
            program = torch.export.export(model, args, dynamic_shapes=({0: T, 1: B}, *({1: B} for _ in args[1:])))
        except Exception as exc:  # torch._dynamo.exc.UserError: a loop over time in Python fixes T
            if "Constraints violated" not in str(exc):
                raise
            raise ValueError("torch.export cannot keep this model's sequence length and batch size free: the python "
                             "backend's loop over time (and PyTorch's own layer, backend torch) fix them; export with "
                             "--backend cpp or cuda (one op per layer)") from None
        if fmt == "exported":
            torch.export.save(program, str(out), extra_files=extra)
        else:
            torch._inductor.aoti_compile_and_package(program, package_path=str(out),
                                                     inductor_configs={"aot_inductor.metadata": extra})
    _write_vocab(out, vocab)
    return out


def _check_writable(path: Path, fmt: str = DEFAULT_FORMAT) -> None:
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give the file to write, e.g. {path / ('model' + SUFFIXES[fmt])}")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink()


def _write_vocab(out: Path, vocab: list[str] | None) -> None:
    if vocab is not None:
        Path(f"{out}.vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))


_RELOAD = """
import sys, torch
import lltm_train  # registers the lltm ops
fmt, path, inputs, result = sys.argv[1:]
args = torch.load(inputs)
if fmt == "torchscript":
    model = torch.jit.load(path)
elif fmt == "exported":
    model = torch.export.load(path).module()
else:
    model = torch._inductor.aoti_load_package(path)
with torch.no_grad():
    torch.save([t.cpu() for t in model(*args)], result)
"""


def check_in_fresh_process(model: nn.Module, fmt: str, path: Path, T: int = 7, B: int = 2) -> float:
    """Runs the written file in a new Python process on inputs of another shape than the traced ones and
    returns the largest absolute difference from ``model``'s outputs. RuntimeError if that process fails."""
    args = example_inputs(model, T, B, seed=1)
    with torch.no_grad():
        want = [t.cpu() for t in model(*args)]
    with tempfile.TemporaryDirectory() as tmp:
        inputs, result = Path(tmp, "inputs.pt"), Path(tmp, "result.pt")
        torch.save(list(args), inputs)
        done = subprocess.run([sys.executable, "-c", _RELOAD, fmt, str(path), str(inputs), str(result)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
            last = " | ".join(done.stderr.strip().splitlines()[-3:]) or "nothing on stderr"
            hint = "; this torch's AOTInductor loader crashed: give --format exported" if fmt == "aoti" and done.returncode < 0 else ""
            raise RuntimeError(f"loading {path} in a fresh process failed ({how}): {last}{hint}")
        got = torch.load(result)
    return max(float((g - w).abs().max()) for g, w in zip(got, want))


def main(argv: list[str] | None = None) -> None:
    from .config import ConfigError, missing_compiler
    from .inference import load_task, vocabulary

    parser = argparse.ArgumentParser(prog="lltm-export", description=help_text(__doc__.split("\n\n")[0]))
    parser.add_argument("checkpoint", help="a checkpoint of a text (or copy) model, e.g. outputs/.../checkpoints/last.ckpt")
    parser.add_argument("out", help="the file to write (.pt2 for aoti and exported)")
    parser.add_argument("--format", choices=FORMATS, default=DEFAULT_FORMAT,
                        help=f"the default here: {DEFAULT_FORMAT} (aoti from torch 2.13, torchscript before). aoti: "
                        "torch.export + AOTInductor, a .pt2 package compiled for this machine (needs a C++ compiler), for "
                        "Python and C++ (examples/cpp); exported: a torch.export program (.pt2); torchscript: "
                        "torch.jit.trace (.pt), DEPRECATED from torch 2.13, which deprecates torch.jit (the format stays "
                        "while torch has it)")
    parser.add_argument("--backend", default="auto", help="the backend the file runs: auto, python, cpp, cuda (or torch "
                        "for a cell PyTorch has: lstm, gru, rnn, rnn_relu)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    a = parser.parse_args(argv)
    if a.format == "torchscript" and JIT_DEPRECATED:
        print(f"lltm-export: warning: {TORCHSCRIPT_DEPRECATED}", file=sys.stderr)
    try:
        out = Path(a.out)
        _check_writable(out, a.format)  # before the checkpoint is read: a wrong name fails at once
        if a.format == "aoti":
            if out.suffix != ".pt2":
                name = out.with_suffix(".pt2") if out.suffix == ".pt" else f"{out}.pt2"
                default = ", the default" if DEFAULT_FORMAT == "aoti" else ""
                raise ValueError(f"an AOTInductor package (--format aoti{default}) is a .pt2 file: name it {name}"
                                 + (" (or give --format torchscript, deprecated, for a TorchScript file)" if out.suffix == ".pt" else ""))
            missing = missing_compiler()
            if missing:
                raise ConfigError(f"--format aoti: AOTInductor compiles the model with a C++ compiler ({missing}); install "
                                  "g++ (or name one in CXX), or give --format exported (torch.export, no compiler)")
        elif a.format == "exported" and out.suffix != ".pt2":  # torch.export.save only warns, and writes it
            raise ValueError(f"a torch.export program (--format exported) is a .pt2 file: name it "
                             f"{out.with_suffix('.pt2') if out.suffix else f'{out}.pt2'}")
        task, ckpt = load_task(a.checkpoint, a.backend, a.device)
        if not hasattr(task.net, "embedding"):
            raise ConfigError("lltm-export takes token models (the text data sets, copy)")
        model = token_model(task.net)
        what = ": torch.export, then AOTInductor's C++ compile (tens of seconds)" if a.format == "aoti" else ""
        print(f"lltm-export: writing {out} ({a.format}{what}), then checking it in a fresh process", flush=True)
        with warnings.catch_warnings():  # torch's own "torch.jit.trace is deprecated": the warning above says it once
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
            out = export(model, a.format, out, vocabulary(ckpt))
        error = check_in_fresh_process(model, a.format, out)
    except (ConfigError, ValueError, RuntimeError, FileNotFoundError) as exc:
        print(f"lltm-export: error: {exc}", file=sys.stderr)
        sys.exit(2)
    tolerance = 1e-4 if task.hparams.get("backend") != "python" else 1e-5
    status = "matches" if error <= tolerance else "DIFFERS FROM"
    print(f"lltm-export: wrote {out} ({a.format}); reloaded in a fresh process, it {status} the checkpoint's "
          f"model (largest difference {error:.2e})")
    if error > tolerance:
        sys.exit(1)


if __name__ == "__main__":
    main()
