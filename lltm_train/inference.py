"""Trained models outside training: a checkpoint loaded with any backend on any device, its vocabulary,
and text sampled from a character language model."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from .checkpoints import read_checkpoint
from .config import ConfigError
from .run_files import config_record, run_dir_of
from .tasks import RecurrentTask
from .tasks.resume import CHECKPOINT_KEY


def _task_class(ckpt: dict, path: Path) -> type[RecurrentTask]:
    """The LightningModule class that wrote ``ckpt``: recorded in it, or (older checkpoints) in the config
    of the run directory it lies in (``<run>/checkpoints/x.ckpt`` -> ``<run>/.hydra/config.yaml``)."""
    name = (ckpt.get(CHECKPOINT_KEY) or {}).get("task")
    if name is None:
        config = config_record(run_dir_of(path))
        if not config.is_file():
            raise ConfigError(f"{path}: the checkpoint does not say which task wrote it and there is no {config}")
        name = OmegaConf.load(config).model._target_
    cls = get_class(name)
    if not (isinstance(cls, type) and issubclass(cls, RecurrentTask)):
        raise ConfigError(f"{path}: {name} is not an lltm-train task")
    return cls


def load_task(path: str | Path, backend: str = "auto", device: str | torch.device = "cpu") -> tuple[RecurrentTask, dict]:
    """The task (LightningModule) saved in a checkpoint, in eval mode on ``device``, with its recurrent layers on
    ``backend`` whatever the backend it was trained with (every backend of a cell has the same parameters); a
    checkpoint of a compiled model (``model.compile=true``) loads uncompiled. Also returns the checkpoint.

    Raises:
        ConfigError: an unreadable checkpoint (one line naming it) or one not written by lltm-train.
        ValueError: an unknown backend, or one that cannot run on ``device``; a device other than cpu or cuda,
            or cuda where none is visible.
    """
    try:
        device = torch.device(device)
    except RuntimeError:  # torch's message lists every device type it knows
        raise ValueError(f"--device {device}: not a device; use cpu or cuda (cuda:N for the N-th GPU)") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: the commands run on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is visible (torch {torch.__version__}"
                         f"{', a CPU build' if torch.version.cuda is None else ''}); use --device cpu")
    path = Path(path)
    ckpt = read_checkpoint(path)
    cls = _task_class(ckpt, path)
    hparams = dict(ckpt.get("hyper_parameters") or {})
    hparams.update(backend=backend, compile=False)
    task = cls(**hparams)
    task.load_state_dict(ckpt["state_dict"])
    task.trained_steps = int(ckpt.get("global_step", 0))
    return task.to(device).eval(), ckpt


def vocabulary(ckpt: dict) -> list[str] | None:
    """A text model's characters, in token id order, as its data module saved them (None for other data)."""
    for value in ckpt.values():
        if isinstance(value, dict) and isinstance(value.get("vocab"), list) and value["vocab"]:
            return list(value["vocab"])
    return None


def encode_prompt(prompt: str, vocab: list[str]) -> list[int]:
    """Token ids of ``prompt``. ValueError naming the characters the vocabulary lacks (never dropped)."""
    index = {ch: i for i, ch in enumerate(vocab)}
    unknown = sorted({ch for ch in prompt if ch not in index})
    if unknown:
        raise ValueError(f"the prompt has characters the model never saw: {', '.join(repr(c) for c in unknown)} "
                         f"(its vocabulary has {len(vocab)} characters)")
    if not prompt:
        raise ValueError("the prompt is empty; give at least one character")
    return [index[ch] for ch in prompt]


@torch.no_grad()
def sample(net: torch.nn.Module, prompt: list[int], length: int, temperature: float = 1.0, top_k: int | None = None,
           seed: int = 0) -> list[int]:
    """``length`` token ids sampled after ``prompt`` from a :class:`~lltm_train.models.CharLM`-like ``net``
    (``forward(tokens (T, B), state) -> (logits (T, B, V), state)``): :func:`sample_tokens` as a list."""
    return list(sample_tokens(net, prompt, length, temperature, top_k, seed))


def sample_tokens(net: torch.nn.Module, prompt: list[int], length: int, temperature: float = 1.0,
                  top_k: int | None = None, seed: int = 0) -> Iterator[int]:
    """The ``length`` token ids of :func:`sample`, each as soon as it is drawn (lltm-generate prints them so). The
    prompt is read once; then each step feeds one token and carries the state. Each token is drawn with
    :func:`torch.multinomial` from softmax(logits / temperature), restricted to the ``top_k`` most likely when
    given, with a CPU generator seeded with ``seed``. The logits are shifted by their maximum before the division,
    so a temperature small enough to overflow them (1e-300) is greedy decoding rather than NaN.

    Raises (at the call, before any token):
        ValueError: temperature not a finite number > 0 (inf would draw uniformly), top_k < 1, length < 0, a seed
            outside [-2**63, 2**64).
    """
    if not 0 < temperature < math.inf:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if not -2**63 <= seed < 2**64:  # torch.Generator's range
        raise ValueError(f"seed must be in [-2**63, 2**64), got {seed}")
    return _sampled(net, prompt, length, temperature, top_k, torch.Generator().manual_seed(seed))


def _sampled(net: torch.nn.Module, prompt: list[int], length: int, temperature: float, top_k: int | None,
             generator: torch.Generator) -> Iterator[int]:
    device = next(net.parameters()).device
    logits, state = net(torch.tensor(prompt, device=device)[:, None], None)
    for i in range(length):
        last = logits[-1, 0].double().cpu()  # double: 1e-300 is a temperature, not 0
        last = (last - last.max()) / temperature
        if top_k is not None and top_k < last.numel():
            cutoff = torch.topk(last, top_k).values[-1]
            last = last.masked_fill(last < cutoff, float("-inf"))
        token = int(torch.multinomial(torch.softmax(last, -1), 1, generator=generator))
        yield token
        if i + 1 < length:  # (no step for a token that is not drawn)
            logits, state = net(torch.tensor([[token]], device=device), state)
