"""One training run from a composed config: build the data, task, callbacks, logger and Trainer (:func:`build`),
then fit (:func:`train`)."""

from __future__ import annotations

import datetime
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from . import run_files
from .backends import resolve_backend
from .callbacks import Throughput
from .callbacks.stop import signals_handled
from .checkpoints import check_data_settings, check_fits, resolve_checkpoint, slurm_requeued
from .config import ConfigError, check_cell_backend, check_config, max_time_seconds
from .data import SequenceDataModule
from .host_memory import keep_freed_memory
from .ops.cells import CELLS
from .run_lock import run_dir_lock
from .strategies import DDPStrategy
from .tasks import RecurrentTask
from .tasks.budget import unfinished_schedule
from .tb_views import describe_run, end_run, metric_tags

log = logging.getLogger("lltm_train")
info = rank_zero_only(log.info)  # once, not once per DDP process
warn = rank_zero_only(log.warning)


def _check_kind(cfg: DictConfig, datamodule: SequenceDataModule) -> None:
    """The model group's task must train on the kind of data the data set poses."""
    task_class, kind = get_class(cfg.model._target_), datamodule.problem.kind
    if kind not in getattr(task_class, "kinds", (kind,)):
        raise ConfigError(f"model: {task_class.__name__} trains on {' or '.join(task_class.kinds)} data, but "
                          f"{type(datamodule).__name__} poses {kind}; leave model= to the data set's default")


def _check_run(cfg: DictConfig, trainer: L.Trainer, task: RecurrentTask) -> None:
    """Settings that Lightning or PyTorch would only reject part-way through a run."""
    optimizer = task.optimizer_factory(task.parameters())  # rejects, e.g., a negative learning rate
    if task.scheduler_factory is not None:
        task.scheduler_factory(optimizer, total_steps=lambda: 100)
    warmup, steps = OmegaConf.select(cfg, "model.scheduler.warmup_steps"), cfg.trainer.get("max_steps")
    if isinstance(warmup, int) and isinstance(steps, int) and 0 < steps <= warmup:
        warn(f"model.scheduler.warmup_steps={warmup} is not below trainer.max_steps={steps}: the whole run stays in "
             f"the warm-up, its learning rate at most {steps / warmup:.0%} of the peak")
    if str(cfg.trainer.get("precision")) == "16-true":  # (Lightning reads a bare 16 as 16-mixed)
        raise ConfigError("trainer.precision=16-true keeps the weights and AdamW's state in float16, which overflows at "
                          "the first step; use 16-mixed or bf16-mixed")
    every = cfg.trainer.get("log_every_n_steps")  # (val_check_interval: check_config)
    if every is not None and not every > 0:
        raise ConfigError(f"trainer.log_every_n_steps must be positive, got {every}")
    limit = cfg.trainer.get("limit_train_batches")
    if not isinstance(limit, bool) and isinstance(limit, (int, float)) and limit == 0:
        raise ConfigError("trainer.limit_train_batches=0 would train nothing")
    clip = cfg.trainer.get("gradient_clip_val")
    if clip is not None and not clip >= 0:  # a negative norm bound would flip every gradient
        raise ConfigError(f"trainer.gradient_clip_val must be >= 0 (0 or null: no clipping), got {clip}")
    accumulate = cfg.trainer.get("accumulate_grad_batches")
    if accumulate is not None and (isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1):
        raise ConfigError("trainer.accumulate_grad_batches must be a whole number of batches >= 1 (1: no "
                          f"accumulation), got {accumulate}")
    if cfg.trainer.get("max_steps") == 0:
        raise ConfigError("trainer.max_steps=0 would train nothing; give a positive number, or -1 for no limit")
    if cfg.trainer.get("max_epochs") == 0:
        raise ConfigError("trainer.max_epochs=0 would train nothing; give a positive number, or -1 for no limit "
                          "(lltm-evaluate evaluates a checkpoint)")
    if trainer.max_steps == -1 and trainer.max_epochs in (None, -1) and not cfg.trainer.get("max_time"):
        rank_zero_only(log.warning)(
            "lltm-train: warning: no trainer.max_steps, trainer.max_epochs or trainer.max_time: this run trains "
            "until it is stopped (Ctrl-C or SIGTERM saves a checkpoint), at its peak learning rate")
    output_dir = Path(cfg.paths.output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        # a file of this process's own (DDP's processes check at once: with one shared name one removed another's)
        with tempfile.NamedTemporaryFile(dir=output_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write the run directory {output_dir}: {exc}") from None
    if not all(isinstance(c, L.Callback) for c in trainer.callbacks):
        bad = next(c for c in trainer.callbacks if not isinstance(c, L.Callback))
        raise ConfigError(f"callbacks: {type(bad).__module__}.{type(bad).__qualname__} is not a Lightning Callback")


def _check_processes(cfg: DictConfig, trainer: L.Trainer, datamodule: SequenceDataModule) -> None:
    """Multi-process settings that would otherwise hang, crash part-way or lose the run's state."""
    strategy = cfg.trainer.get("strategy")
    if isinstance(strategy, str) and any(word in strategy for word in ("spawn", "fork", "notebook")):
        raise ConfigError(f"trainer.strategy={strategy}: the process that starts the others keeps a stale copy of the "
                          "training state and would write it over the run's last checkpoint; use trainer.strategy=ddp")
    nodes = cfg.trainer.get("num_nodes") or 1
    if isinstance(nodes, int) and nodes > 1 and not {"SLURM_NTASKS", "TORCHELASTIC_RUN_ID", "NODE_RANK"} & set(os.environ):
        raise ConfigError(f"trainer.num_nodes={nodes}: no cluster environment starts the other nodes' processes (this "
                          "one would wait for them); run through SLURM (hydra/launcher=slurm) or torchrun")
    if trainer.world_size > 1 and "SUBMITIT_LOCAL_JOB_ID" in os.environ and "SUBMITIT_LOCAL_NTASKS" in os.environ \
            and int(os.environ["SUBMITIT_LOCAL_NTASKS"]) < trainer.world_size:
        raise ConfigError("hydra/launcher=local runs one process a job: Lightning cannot start DDP's other processes "
                          "from submitit's worker; use trainer.devices=1, or the basic launcher for DDP jobs")
    for split in ("val_set", "test_set"):
        data = getattr(datamodule, split, None)
        if trainer.world_size > 1 and data is not None and 0 < len(data) < trainer.world_size:
            raise ConfigError(f"the {split.split('_')[0]} split has {len(data)} sample(s), fewer than the "
                              f"{trainer.world_size} processes that share it; use fewer devices or a larger split")


def _logger_resume_args(logger_cfg: DictConfig, resumed_step: int | None) -> dict:
    """A resumed run's TensorBoard writer hides what the killed run logged after its checkpoint (steps
    from ``resumed_step`` on, which the resumed run logs again): each curve then has one point a step.
    Lightning's CSV logger would delete the earlier file: a resumed run writes a file of its own
    (``csv/resumed_step<N>/metrics.csv``), which lltm-report reads after the first."""
    if resumed_step is None:
        return {}
    target = get_class(logger_cfg._target_)
    if target is TensorBoardLogger:
        return {"purge_step": resumed_step}
    if target is CSVLogger:
        return {"version": run_files.resumed_csv_version(resumed_step)}
    return {}


def _batches_per_step(trainer_cfg: DictConfig) -> dict:
    """``trainer.val_check_interval`` counts optimiser steps, as checkpoints and logs do; Lightning counts
    batches, which differ under gradient accumulation."""
    interval, accumulate = trainer_cfg.get("val_check_interval"), trainer_cfg.get("accumulate_grad_batches") or 1
    if isinstance(interval, int) and not isinstance(interval, bool) and isinstance(accumulate, int) and accumulate > 1:
        return {"val_check_interval": interval * accumulate}
    return {}


def _max_time(trainer_cfg: DictConfig) -> dict:
    """``trainer.max_time``, checked (:func:`lltm_train.config.max_time_seconds`) and given to Lightning as a
    timedelta."""
    seconds = max_time_seconds(trainer_cfg.get("max_time"))
    return {} if seconds is None else {"max_time": datetime.timedelta(seconds=seconds)}


def _strategy(trainer_cfg: DictConfig) -> dict:
    """``trainer.strategy=ddp``, and ``auto`` with more than one device or node, is
    :class:`lltm_train.strategies.DDPStrategy` (Lightning's, with the model wrapped on the training stream);
    any other name, or a ``_target_`` node, goes to Lightning as it is."""
    strategy, devices, nodes = (trainer_cfg.get(k) for k in ("strategy", "devices", "num_nodes"))
    several = (isinstance(devices, int) and devices > 1) or (isinstance(nodes, int) and nodes > 1)
    if not (strategy == "ddp" or (strategy == "auto" and several)):
        return {}
    # DDP's static graph fails an internal assertion under no_sync, which gradient accumulation uses
    return {"strategy": DDPStrategy(static_graph=(trainer_cfg.get("accumulate_grad_batches") or 1) == 1)}


@dataclass(frozen=True)
class Built:
    """A run made from a config by :func:`build`, ready to fit: ``built.trainer.fit(built.task,
    datamodule=built.datamodule, ckpt_path=built.ckpt_path)``.

    Attributes:
        datamodule: the data set, set up for fitting.
        task: the model group's LightningModule, sized for the data set.
        trainer: the Lightning Trainer, with the callbacks, the logger, the strategy and the time budget.
        callbacks: the config's callbacks given to the Trainer (``cfg.callbacks``; the learning-rate monitor
            left out when there is no logger).
        backend_used: the backend the cells run on (``backend=auto`` resolved for the Trainer's device).
        ckpt_path: the checkpoint the run resumes from (``ckpt_path``, ``last`` resolved), or None.
    """

    datamodule: SequenceDataModule
    task: RecurrentTask
    trainer: L.Trainer
    callbacks: tuple[L.Callback, ...]
    backend_used: str
    ckpt_path: str | None


_GLOBAL_BATCH = "global batch (dataset.batch_size x processes)"


def _data_settings(cfg: DictConfig, world_size: int) -> dict:
    """The settings that decide a run's batches, as checkpoints keep them: the dataset group's (its batch size as
    the global batch: a DDP run's checkpoint resumes on one process with the same global batch) and the seed."""
    settings = {f"dataset.{k}": v for k, v in OmegaConf.to_container(cfg.dataset, resolve=True).items()}
    if isinstance(settings.get("dataset.batch_size"), int):
        settings[_GLOBAL_BATCH] = settings.pop("dataset.batch_size") * world_size
    return {**settings, "seed": cfg.seed}


def build(cfg: DictConfig) -> Built:
    """Everything before training: checks the config and builds the data, the task, the callbacks, the logger
    and the Trainer. Any error here is a configuration error, reported before a step runs (:func:`train`
    reports each as a :class:`~lltm_train.config.ConfigError`)."""
    check_config(cfg)
    if HydraConfig.initialized():
        check_cell_backend(cfg, HydraConfig.get().runtime.choices.get("cell_backend"))
    torch.set_float32_matmul_precision(cfg.float32_matmul_precision)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule: SequenceDataModule = instantiate(cfg.dataset)
    datamodule.setup("fit")
    _check_kind(cfg, datamodule)
    spec = datamodule.problem  # the model group's LightningModule, given the data set's sizes:
    stateful = {"stateful": True} if spec.stateful else {}  # only token data sets are read as streams
    task: RecurrentTask = instantiate(cfg.model)(spec.input_size, spec.output_size, baseline_loss=spec.baseline_loss, **stateful)
    callbacks = [instantiate(node) for node in (cfg.callbacks or {}).values() if node]
    ckpt = resolve_checkpoint(cfg.ckpt_path, run_files.checkpoint_dir(cfg.paths.output_dir), requeued=slurm_requeued(),
                              sweep_job=(HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN)
                              or os.environ.get(run_files.SWEEP_JOB) == "1")
    resumed_step, saved_data = check_fits(ckpt, task, datamodule) if ckpt is not None else (None, {})
    if cfg.logger and str(cfg.logger.get("_target_", "")).endswith("MLFlowLogger"):
        try:
            import mlflow  # noqa: F401
        except ImportError:
            raise ConfigError("logger=mlflow needs the mlflow package: pip install '.[mlflow]' (the project's extra), "
                              "or pip install mlflow") from None
    logger = instantiate(cfg.logger, **_logger_resume_args(cfg.logger, resumed_step)) if cfg.logger else False
    if logger is not False and not isinstance(logger, Logger):
        raise ConfigError(f"logger: {type(logger).__module__}.{type(logger).__qualname__} is not a Lightning logger")
    if not logger:  # the learning-rate monitor has nothing to write to
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger, **_batches_per_step(cfg.trainer),
                                     **_strategy(cfg.trainer), **_max_time(cfg.trainer))
    datamodule.settings = _data_settings(cfg, trainer.world_size)
    if ckpt is not None:
        check_data_settings(ckpt, saved_data, datamodule.settings)
    _check_run(cfg, trainer, task)
    _check_processes(cfg, trainer, datamodule)
    if cfg.backend == "cuda" and not torch.cuda.is_available():
        raise ConfigError("backend=cuda needs a CUDA device and none is visible (torch.cuda.is_available() is False); "
                          "use backend=auto or backend=cpp")
    cell = cfg.model.get("cell", "lltm")
    try:
        backend_used = resolve_backend(cfg.backend, trainer.strategy.root_device.type, cell)
    except ValueError as exc:
        raise ConfigError(f"backend={cfg.backend}: {exc} (set trainer.accelerator to match)") from None
    if trainer.strategy.root_device.type == "cpu":  # each step's large tensors reuse resident pages
        keep_freed_memory()
    return Built(datamodule, task, trainer, tuple(callbacks), backend_used, ckpt)


def _save_final_state(trainer: L.Trainer, checkpoint_dir: Path) -> None:
    """Writes last.ckpt when training ends, which may be after the last periodic checkpoint.

    Lightning's own state at the end of fit says that the epoch is over (also when max_steps ended it part
    way) and that its step counter for loggers has moved on once more; a resume with a larger max_steps
    would then start a new epoch and log the last step twice. The file is written as a periodic checkpoint
    is, at the end of the last step (on_train_batch_end): its epoch under way, its last batch not yet
    completed. Lightning resumes from that as from any such checkpoint (at an epoch's end too).
    """
    if trainer.interrupted or not trainer.state.finished or trainer.fast_dev_run:
        return
    ckpt = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    loop = ckpt["loops"]["fit_loop"]
    if loop["epoch_progress"]["current"]["completed"] > loop["epoch_progress"]["current"]["started"] - 1:
        for counts in (loop["epoch_progress"]["current"], loop["epoch_progress"]["total"]):
            counts["processed"] -= 1
            counts["completed"] -= 1
        ckpt["epoch"] -= 1
    batches = loop["epoch_loop.batch_progress"]
    if batches["current"]["completed"] == batches["current"]["processed"]:
        for counts in (batches["current"], batches["total"]):
            counts["completed"] -= 1
    loop["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1
    trainer.strategy.save_checkpoint(ckpt, checkpoint_dir / run_files.LAST_CHECKPOINT)
    trainer.strategy.barrier("lltm_train_final_checkpoint")


def _needs_final_validation(trainer: L.Trainer, task: RecurrentTask) -> bool:
    """True when training stopped between validations, so the run would end without a final figure."""
    return (not trainer.interrupted and trainer.state.finished and not trainer.fast_dev_run
            and trainer.limit_val_batches != 0 and task.last_validated_step != trainer.global_step)


def train(cfg: DictConfig) -> dict[str, float]:
    """Runs one job; returns the final callback metrics (e.g. ``val/loss``) as floats. Raises ConfigError
    (before training) where another run is training in the same run folder."""
    with run_dir_lock(cfg.paths.output_dir):
        return _train(cfg)


def _train(cfg: DictConfig) -> dict[str, float]:
    try:
        built = build(cfg)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything failing before training is a bad setting
        message = str(exc.__cause__ or exc).strip().splitlines()
        raise ConfigError(f"{type(exc.__cause__ or exc).__name__}: {' '.join(line.strip() for line in message)}") from exc
    datamodule, task, trainer, backend_used, ckpt = (built.datamodule, built.task, built.trainer, built.backend_used,
                                                     built.ckpt_path)
    output_dir = Path(cfg.paths.output_dir)
    names = task.logged_metrics(datamodule.problem)
    tags = metric_tags(names, bool(cfg.test), trainer.strategy.root_device.type == "cuda")
    optimized = cfg.get("optimized_metric")
    if optimized and optimized not in tags:
        hint = " (test/ metrics need test=true)" if optimized.startswith("test/") and not cfg.test else ""
        raise ConfigError(f"optimized_metric={optimized}: {type(task).__name__} logs {', '.join(tags)}{hint}")
    params = {**OmegaConf.to_container(cfg, resolve=True), "backend_used": backend_used,
              "num_parameters": task.num_parameters()}
    tensorboards = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)] if trainer.is_global_zero else []
    for logger in trainer.loggers:
        logger.log_hyperparams(params)
    for logger in tensorboards:  # the HPARAMS tab's row of this run, and the custom-scalars page
        describe_run(logger, params, tags, names)
    backend = f"backend {backend_used}" if backend_used != "torch" else f"backend torch ({CELLS[cfg.model.cell].torch_label})"
    heads = cfg.model.get("num_heads", 1)
    cell = f"{cfg.model.cell} cell" + (f", {heads} heads" if heads != 1 else "")
    info(f"lltm-train: {type(task).__name__} ({cell}, {task.num_parameters():,} parameters) on "
         f"{type(datamodule).__name__}, {backend} on {trainer.strategy.root_device}; run directory "
         f"{output_dir}" + (f"; resuming {ckpt}" if ckpt else "") + "".join(
             f"; metrics in {path}" for path in _csv_files(trainer)))
    try:
        with signals_handled(trainer):  # a signal after fit's training too (the final validation, the test)
            _fit_and_test(cfg, datamodule, task, trainer, ckpt, output_dir)
    except Exception:
        for logger in tensorboards:
            end_run(logger, success=False)
        raise
    finally:
        _record_divergence(task, trainer, output_dir)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for logger in tensorboards:
        end_run(logger, success=not trainer.interrupted)
        logger.finalize("success")  # the Trainer closed its writer already: flush and close this one
    _report(trainer, metrics, output_dir)
    return metrics


def _fit_and_test(cfg: DictConfig, datamodule, task: RecurrentTask, trainer: L.Trainer, ckpt: str | None,
                  output_dir: Path) -> None:
    with warnings.catch_warnings():
        if ckpt is not None:  # a resume writes into its own checkpoints: Lightning's warning says nothing new
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt)
    if ckpt is not None and task.clock.this_run(trainer.global_step)[0] == 0 and not trainer.interrupted:
        # A resume with nothing left to train (max_steps reached, the time budget spent): its checkpoint and
        # curves stay as the run left them (rewriting last.ckpt would move the loggers' step back once more).
        info(f"lltm-train: nothing left to train at step {trainer.global_step} (raise trainer.max_steps or "
             "trainer.max_time to go on); the checkpoint and the logs are unchanged")
    else:
        _save_final_state(trainer, run_files.checkpoint_dir(output_dir))
        if not trainer.interrupted and trainer.state.finished and not trainer.fast_dev_run and task.scheduler_factory:
            note = unfinished_schedule(trainer, task.clock)
            if note:
                log.warning(note)
        if _needs_final_validation(trainer, task):
            task.final_validation = True
            try:
                trainer.validate(task, datamodule=datamodule, verbose=False)
            finally:
                task.final_validation = False
    if cfg.test:
        # The best checkpoint of this run, if it is still on disk; else the weights at the end of training.
        # (A resume from another run's file inherits that run's best path: never this run's to test.)
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        own = run_files.checkpoint_dir(output_dir).resolve()
        if best and (not Path(best).is_file() or Path(best).resolve().parent != own):
            where = "is gone" if not Path(best).is_file() else f"is not this run's (it is in {Path(best).parent})"
            log.warning(f"lltm-train: the best checkpoint {best} {where}; testing the final weights")
            best = ""
        trainer.test(task, datamodule=datamodule, ckpt_path=best or None)


def _record_divergence(task: RecurrentTask, trainer: L.Trainer, output_dir: Path) -> None:
    """``diverged.txt`` in the run's folder when the run diverged (model.divergence): one line, the reason,
    which lltm-report and a sweep's summary read."""
    if task.diverged and trainer.is_global_zero:
        (output_dir / run_files.DIVERGED).write_text(f"{task.diverged} (model.divergence={task.divergence})\n")


def _csv_files(trainer: L.Trainer) -> list[Path]:
    """The files that the run's CSV loggers (logger=csv) write the metrics to."""
    return [Path(lg.log_dir) / "metrics.csv" for lg in trainer.loggers if isinstance(lg, CSVLogger)]


def _report(trainer: L.Trainer, metrics: dict[str, float], output_dir: Path) -> None:
    """Adds the peak CUDA memory to ``metrics`` and prints the run's closing lines."""
    throughput = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
    average = throughput.average_tokens_per_s if throughput else None
    if throughput and "memory/peak_cuda_mib" in throughput.last_figures:
        metrics["memory/peak_cuda_mib"] = throughput.last_figures["memory/peak_cuda_mib"]
    shown = ("train/loss", "memory/peak_cuda_mib", "val/", "test/")
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    figures = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(shown))
    info("lltm-train: done" + (f". {figures}" if figures else " (no step trained, nothing measured)")
         + (f"\n  training throughput: {average:,.0f} tokens/s (average over the run)" if average else "")
         + (f"\n  best checkpoint: {best}" if best else "")
         + (f"\n  TensorBoard: tensorboard --logdir {output_dir}"
            if any(isinstance(lg, TensorBoardLogger) for lg in trainer.loggers) else "")
         + "".join(f"\n  CSV metrics: {path}" for path in _csv_files(trainer))
         + (f"\n  MLflow: mlflow ui --backend-store-uri sqlite:///{output_dir / run_files.MLFLOW_DB}"
            if any(isinstance(lg, MLFlowLogger) for lg in trainer.loggers) else ""))
