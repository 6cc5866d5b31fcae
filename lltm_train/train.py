"""One training run from a composed config: build the data, task, callbacks, logger and Trainer, then fit."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate, to_absolute_path
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from .backends import resolve_backend
from .callbacks import Throughput
from .config import ConfigError, check_config
from .data import SequenceDataModule, TaskSpec
from .tasks import ClassificationTask, LanguageModelTask, LLTMTask, RegressionTask

log = logging.getLogger("lltm_train")
info = rank_zero_only(log.info)  # once, not once per DDP process


def build_task(cfg: DictConfig, spec: TaskSpec) -> LLTMTask:
    """The LightningModule for the data set's kind of task, with the ``model`` group's settings."""
    m = cfg.model
    common = dict(hidden_size=m.hidden_size, num_layers=m.num_layers, dropout=m.dropout, backend=cfg.backend.name,
                  optimizer=instantiate(m.optimizer), scheduler=instantiate(m.scheduler) if m.scheduler else None,
                  compile=m.compile, baseline_loss=spec.baseline_loss)
    if spec.kind == "tokens":
        if m.bidirectional:
            raise ConfigError("model.bidirectional=true cannot be used to predict the next token (it would read the "
                              "future); use it with a sequence-level data set")
        return LanguageModelTask(spec.input_size, spec.output_size, embedding_dim=m.embedding_dim,
                                 sample_length=m.sample_length, sample_temperature=m.sample_temperature, **common)
    task = ClassificationTask if spec.kind == "classification" else RegressionTask
    return task(spec.input_size, spec.output_size, bidirectional=m.bidirectional, **common)


def resolve_checkpoint(ckpt_path: str | None, checkpoint_dir: Path) -> str | None:
    """The checkpoint to resume from; refuses to start afresh over an earlier run's checkpoints."""
    existing = sorted(checkpoint_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    if ckpt_path is None:
        if existing:
            raise ConfigError(f"{checkpoint_dir} holds checkpoints of an earlier run: resume it with ckpt_path=last, "
                              "or leave hydra.run.dir to its default for a new run")
        return None
    if ckpt_path == "last":
        if not existing:
            raise ConfigError(f"ckpt_path=last: no checkpoint in {checkpoint_dir}; name the run to resume with "
                              "hydra.run.dir=<its directory, e.g. outputs/shakespeare/2026-11-29_16-00-00>")
        return str(existing[-1])
    path = Path(to_absolute_path(ckpt_path))
    if not path.is_file():
        raise ConfigError(f"ckpt_path: no such checkpoint file: {path}")
    return str(path)


def check_checkpoint_fits(path: str, task: LLTMTask, datamodule: SequenceDataModule) -> None:
    """Raises ConfigError unless the checkpoint holds this model's parameters (names and shapes) and data state."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - not a torch file, or pickled objects weights_only refuses
        raise ConfigError(f"ckpt_path: cannot read {path} as a checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise ConfigError(f"ckpt_path: {path} is not a Lightning checkpoint (it has no state_dict)")
    ours, theirs = task.state_dict(), ckpt["state_dict"]
    problems = [f"{k} is {tuple(theirs[k].shape)} there, {tuple(v.shape)} here" for k, v in ours.items()
                if k in theirs and tuple(theirs[k].shape) != tuple(v.shape)]
    problems += [f"{k} is missing there" for k in ours.keys() - theirs.keys()]
    problems += [f"{k} is not in this model" for k in theirs.keys() - ours.keys()]
    if problems:
        raise ConfigError(f"ckpt_path: {path} was written by another model ({'; '.join(sorted(problems)[:3])}); resume with "
                          "the dataset and model settings of the run that wrote it (its .hydra/config.yaml)")
    optimizer = task.optimizer_factory(task.parameters())
    saved = ckpt.get("optimizer_states") or [{}]
    saved_keys = set(next(iter(saved[0].get("param_groups", [])), {})) - {"params", "initial_lr"}  # the latter from the lr schedule
    our_keys = set(optimizer.param_groups[0]) - {"params", "initial_lr"}
    if saved_keys and saved_keys != our_keys:
        raise ConfigError(f"ckpt_path: {path} holds the state of another optimizer (settings {sorted(saved_keys)}); resume with "
                          f"the model.optimizer of the run that wrote it")
    # Data state (a text data set's vocabulary) is saved under the data module's class name; look at all of them,
    # so that a checkpoint of one text does not resume on another one whose characters get the same ids.
    for key, state in ckpt.items():
        if isinstance(state, dict) and "vocab" in state and hasattr(datamodule, "vocab"):
            datamodule.load_state_dict({"vocab": state["vocab"]})  # raises if the vocabulary differs


def _check_run(cfg: DictConfig, trainer: L.Trainer, task: LLTMTask) -> None:
    """Settings that Lightning or PyTorch would only reject part-way through a run."""
    optimizer = task.optimizer_factory(task.parameters())  # rejects, e.g., a negative learning rate
    if task.scheduler_factory is not None:
        task.scheduler_factory(optimizer, total_steps=lambda: 100)
    if str(cfg.trainer.get("precision")) in ("16-true", "16"):
        raise ConfigError("trainer.precision=16-true keeps the weights and AdamW's state in float16, which overflows at "
                          "the first step; use 16-mixed or bf16-mixed")
    for key in ("val_check_interval", "log_every_n_steps"):
        value = cfg.trainer.get(key)
        if value is not None and not value > 0:
            raise ConfigError(f"trainer.{key} must be positive, got {value}")
    output_dir = Path(cfg.paths.output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / ".write-test").touch()
        (output_dir / ".write-test").unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write the run directory {output_dir}: {exc}") from None
    if not all(isinstance(c, L.Callback) for c in trainer.callbacks):
        bad = next(c for c in trainer.callbacks if not isinstance(c, L.Callback))
        raise ConfigError(f"callbacks: {type(bad).__module__}.{type(bad).__qualname__} is not a Lightning Callback")


def _prepare(cfg: DictConfig):
    """Everything before training; any error here is a configuration error, reported before a step runs."""
    check_config(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule: SequenceDataModule = instantiate(cfg.dataset)
    datamodule.setup("fit")
    task = build_task(cfg, datamodule.task)
    callbacks = [instantiate(node) for node in (cfg.callbacks or {}).values() if node]
    logger = instantiate(cfg.logger) if cfg.logger else False
    if logger is not False and not isinstance(logger, Logger):
        raise ConfigError(f"logger: {type(logger).__module__}.{type(logger).__qualname__} is not a Lightning logger")
    if not logger:  # the learning-rate monitor has nothing to write to
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
    _check_run(cfg, trainer, task)
    device = trainer.strategy.root_device.type
    if cfg.backend.name in ("cpp", "cuda") and device != ("cpu" if cfg.backend.name == "cpp" else "cuda"):
        raise ConfigError(f"backend={cfg.backend.name} needs {'a CPU' if cfg.backend.name == 'cpp' else 'a CUDA device'}, "
                          f"but the trainer runs on {device} (set trainer.accelerator, or use backend=auto)")
    backend_used = resolve_backend(cfg.backend.name, device)
    ckpt = resolve_checkpoint(cfg.ckpt_path, Path(cfg.paths.output_dir) / "checkpoints")
    if ckpt is not None:
        check_checkpoint_fits(ckpt, task, datamodule)
    return datamodule, task, trainer, backend_used, ckpt


def _save_final_state(trainer: L.Trainer, checkpoint_dir: Path) -> None:
    """Writes last.ckpt when training ends, which may be after the last periodic checkpoint."""
    if not trainer.interrupted and trainer.state.finished and not trainer.fast_dev_run:
        trainer.save_checkpoint(checkpoint_dir / "last.ckpt", weights_only=False)


def _needs_final_validation(trainer: L.Trainer, task: LLTMTask) -> bool:
    """True when training stopped between validations, so the run would end without a final figure."""
    return (not trainer.interrupted and trainer.state.finished and not trainer.fast_dev_run
            and trainer.limit_val_batches != 0 and task.last_validated_step != trainer.global_step)


def train(cfg: DictConfig) -> dict[str, float]:
    """Runs one job; returns the final callback metrics (e.g. ``val/loss``) as floats."""
    try:
        datamodule, task, trainer, backend_used, ckpt = _prepare(cfg)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything failing before training is a bad setting
        message = str(exc.__cause__ or exc).strip().splitlines()
        raise ConfigError(f"{type(exc.__cause__ or exc).__name__}: {' '.join(line.strip() for line in message)}") from exc
    output_dir = Path(cfg.paths.output_dir)
    for logger in trainer.loggers:
        logger.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), "backend_used": backend_used})
    info(f"lltm-train: {type(task).__name__} on {type(datamodule).__name__}, backend {backend_used} "
                   f"on {trainer.strategy.root_device}; run directory {output_dir}" + (f"; resuming {ckpt}" if ckpt else ""))
    trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt)
    _save_final_state(trainer, output_dir / "checkpoints")
    if _needs_final_validation(trainer, task):
        trainer.validate(task, datamodule=datamodule, verbose=False)
    if cfg.test:
        best = trainer.checkpoint_callback and trainer.checkpoint_callback.best_model_path
        trainer.test(task, datamodule=datamodule, ckpt_path="best" if best else None)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if "val/loss" in metrics:
        for logger in trainer.loggers:  # the figure TensorBoard's hparams view shows beside the config
            logger.log_metrics({"hp_metric": metrics["val/loss"]}, step=trainer.global_step)
    throughput = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
    average = throughput.average_tokens_per_s if throughput else None
    shown = ("train/loss", "memory/peak_cuda_mib", "val/", "test/")
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    info("lltm-train: done. " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(shown))
         + (f"\n  training throughput: {average:,.0f} tokens/s (average over the run)" if average else "")
         + (f"\n  best checkpoint: {best}" if best else "")
         + f"\n  TensorBoard: tensorboard --logdir {output_dir}")
    return metrics
