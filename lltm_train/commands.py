"""``lltm-generate`` (text from a character model's checkpoint) and ``lltm-evaluate`` (a checkpoint's
test-split metrics): trained models used without training."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .config import ConfigError
from .console import NoTips, help_text
from .run_files import config_record, run_dir_of


def _fail(prog: str, exc: BaseException) -> None:
    print(f"{prog}: error: {exc}", file=sys.stderr)
    sys.exit(2)


def _dataset_setting(config: Path):
    """The ``dataset`` node of a run's config file, or a ConfigError in one line (a file that is not YAML, or
    holds no ``dataset``)."""
    from omegaconf import DictConfig, OmegaConf

    try:
        cfg = OmegaConf.load(config)
    except Exception as exc:  # noqa: BLE001 - yaml's and OmegaConf's errors, a binary file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"{config} is not a run config in YAML ({type(exc).__name__}: {first}); give a run's "
                          ".hydra/config.yaml with --config") from None
    if not isinstance(cfg, DictConfig) or "dataset" not in cfg:
        raise ConfigError(f"{config} has no dataset setting: give a run's .hydra/config.yaml with --config")
    return cfg.dataset


def generate_main(argv: list[str] | None = None) -> None:
    """Samples text after a prompt from a text model's checkpoint (any backend, any device)."""
    from .inference import encode_prompt, load_task, sample_tokens, vocabulary

    parser = argparse.ArgumentParser(prog="lltm-generate", description=help_text(generate_main.__doc__))
    parser.add_argument("checkpoint", help="a text model's checkpoint, e.g. outputs/.../checkpoints/last.ckpt")
    parser.add_argument("--prompt", default="\n", help="text to start from (every character must be in the vocabulary)")
    parser.add_argument("--length", type=int, default=500, help="characters to generate")
    parser.add_argument("--temperature", type=float, default=0.8, help="softmax temperature (> 0)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest characters only")
    parser.add_argument("--seed", type=int, default=0, help="the sampling's random seed (the same seed, the same text)")
    parser.add_argument("--backend", default="auto", help="auto, python, cpp, cuda, or torch (models of a cell PyTorch has: lstm, gru, rnn, rnn_relu)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    a = parser.parse_args(argv)
    try:
        task, ckpt = load_task(a.checkpoint, a.backend, a.device)
        vocab = vocabulary(ckpt)
        if vocab is None:
            raise ConfigError(f"{a.checkpoint} is not a text model's checkpoint (it has no vocabulary)")
        tokens = sample_tokens(task.net, encode_prompt(a.prompt, vocab), a.length, a.temperature, a.top_k, a.seed)
        sys.stdout.write(a.prompt)
        for token in tokens:  # each character as it is drawn (a long text shows as it grows)
            sys.stdout.write(vocab[token])
            if vocab[token] == "\n":
                sys.stdout.flush()
    except (ConfigError, ValueError, RuntimeError) as exc:
        _fail("lltm-generate", exc)
    sys.stdout.write("\n")


def evaluate_main(argv: list[str] | None = None) -> None:
    """Evaluates a checkpoint on the test split of the data set it was trained on (read from its run's
    ``.hydra/config.yaml``), with any backend, on any device, and prints the metrics."""
    import lightning as L
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from .console import quiet_upstream_warnings
    from .inference import load_task

    quiet_upstream_warnings()
    parser = argparse.ArgumentParser(prog="lltm-evaluate", description=help_text(evaluate_main.__doc__))
    parser.add_argument("checkpoint", help="a checkpoint of a training run, e.g. outputs/.../checkpoints/last.ckpt")
    parser.add_argument("--split", choices=("test", "val"), default="test")
    parser.add_argument("--backend", default="auto", help="auto, python, cpp, cuda, or torch (models of a cell PyTorch has: lstm, gru, rnn, rnn_relu)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--config", default=None, help="the run's config (default: <run>/.hydra/config.yaml)")
    a = parser.parse_args(argv)
    try:
        task, ckpt = load_task(a.checkpoint, a.backend, a.device)
        config = Path(a.config) if a.config else config_record(run_dir_of(a.checkpoint))
        if not config.is_file():
            raise ConfigError(f"no run config at {config}: give --config <run>/.hydra/config.yaml")
        try:
            datamodule = instantiate(_dataset_setting(config))
        except InstantiationException as exc:  # e.g. a text file moved since training
            cause = exc.__cause__ or exc
            raise ConfigError(f"the data set of {config} cannot be built ({type(cause).__name__}: {cause}); move the "
                              "data back, or give a config that finds it with --config") from None
        datamodule.setup("test")
        for key, value in ckpt.items():  # the data module's saved state (a text's vocabulary)
            if key == type(datamodule).__qualname__ and isinstance(value, dict):
                datamodule.load_state_dict(value)
        for handler in logging.getLogger("lightning.pytorch").handlers:  # Lightning's own console handler, here
            handler.addFilter(NoTips())  # (lltm-train's goes through its logging config, which filters the same)
        trainer = L.Trainer(accelerator="gpu" if str(a.device).startswith("cuda") else "cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        run = trainer.test if a.split == "test" else trainer.validate
        [metrics] = run(task, datamodule=datamodule, verbose=False)
    except (ConfigError, ValueError, RuntimeError, FileNotFoundError) as exc:
        _fail("lltm-evaluate", exc)
    print(f"lltm-evaluate: {a.checkpoint} on the {a.split} split: "
          + ", ".join(f"{k}={v:.6g}" for k, v in sorted(metrics.items())))


if __name__ == "__main__":  # python -m lltm_train.commands generate|evaluate ...
    {"generate": generate_main, "evaluate": evaluate_main}[sys.argv[1]](sys.argv[2:])
