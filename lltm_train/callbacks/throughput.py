"""Training throughput (tokens/s, samples/s, step time) and peak CUDA memory, for TensorBoard and the progress bar."""

from __future__ import annotations

import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class Throughput(Callback):
    """Logs, every ``log_every_n_steps`` training steps (default: the Trainer's), averaged over those steps:

    - ``throughput/tokens_per_s``: time steps (tokens) processed per second, padding excluded, by all the
      processes of a DDP run together; also ``tok/s`` on the progress bar;
    - ``throughput/tokens_per_s_per_device``: the same divided by the number of processes (devices);
    - ``throughput/samples_per_s``: sequences per second, all processes together;
    - ``throughput/step_ms``: wall time per training step (forward, backward, optimiser, data loading);
    - ``memory/peak_cuda_mib``: peak CUDA memory allocated since the start, MiB (CUDA devices only).

    Lightning's own ThroughputMonitor synchronises the device after every batch; this one only at the end
    of each window, so it does not slow the GPU pipeline down. Time spent in validation is excluded.
    The LightningModule provides ``count(batch) -> (samples, tokens)`` (without a device synchronisation).
    """

    def __init__(self, log_every_n_steps: int | None = None) -> None:
        self.log_every_n_steps = log_every_n_steps
        self.run_tokens, self.run_seconds = 0, 0.0  # over every finished window, for the run's average
        self.first_window: tuple[int, float] | None = None  # (tokens, seconds) of this process's first window
        self.last_figures: dict[str, float] = {}  # the newest window's figures
        self._reset()

    @property
    def average_tokens_per_s(self) -> float | None:
        """Tokens per second over all training steps measured so far in this process (None before the first window)."""
        return self.run_tokens / self.run_seconds if self.run_seconds else None

    @property
    def steady_tokens_per_s(self) -> float | None:
        """Tokens per second over the windows after this process's first (None before the second): the pace
        without the first step's one-time set-up (a CUDA graph's capture, ``torch.compile``'s compilation,
        cuDNN's autotuning), which in a short run can outweigh hundreds of steps."""
        if self.first_window is None or self.run_seconds <= self.first_window[1]:
            return None
        return (self.run_tokens - self.first_window[0]) / (self.run_seconds - self.first_window[1])

    def _reset(self) -> None:
        self._start: float | None = None
        self._steps = self._samples = self._tokens = 0

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._start is None:
            self._sync(pl_module)
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        samples, tokens = pl_module.count(batch)
        self._steps += 1
        self._samples += samples
        self._tokens += tokens
        every = self.log_every_n_steps or trainer.log_every_n_steps
        if trainer.global_step % every:
            return
        self._sync(pl_module)
        elapsed = time.perf_counter() - self._start
        tokens, samples, world = self._tokens, self._samples, trainer.world_size
        if world > 1:
            # every process is at this step (a logging step): one collective adds up their windows
            counts = torch.tensor([tokens, samples, elapsed], dtype=torch.float64, device=pl_module.device)
            counts = trainer.strategy.reduce(counts, reduce_op="sum")
            tokens, samples, elapsed = int(counts[0]), int(counts[1]), float(counts[2]) / world
        figures = {
            "throughput/tokens_per_s": tokens / elapsed,
            "throughput/tokens_per_s_per_device": tokens / elapsed / world,
            "throughput/samples_per_s": samples / elapsed,
            "throughput/step_ms": 1000 * elapsed / self._steps,
        }
        self.run_tokens += tokens
        self.run_seconds += elapsed
        if self.first_window is None:
            self.first_window = (tokens, elapsed)
        if pl_module.device.type == "cuda":
            figures["memory/peak_cuda_mib"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        self._start, self._steps, self._samples, self._tokens = None, 0, 0, 0
        self.last_figures = figures
        # Straight to the loggers, once per window: figures logged through the LightningModule would be
        # written again at every later logging step of the Trainer until the next window.
        for logger in trainer.loggers:
            logger.log_metrics(figures, step=trainer.global_step - 1)
        # a host tensor: the progress bar converts it at every step, which a device value would make wait for the GPU
        pl_module.log("tok/s", torch.tensor(figures["throughput/tokens_per_s"]), prog_bar=True, logger=False,
                      on_step=True, on_epoch=False, batch_size=samples)

    def on_train_end(self, trainer, pl_module) -> None:
        # the run's average (what the console's last line says, what lltm-report and TensorBoard's HPARAMS show)
        if self.average_tokens_per_s is not None:
            for logger in trainer.loggers:
                logger.log_metrics({"throughput/tokens_per_s_run_average": self.average_tokens_per_s},
                                   step=max(trainer.global_step - 1, 0))

    def on_validation_start(self, trainer, pl_module) -> None:
        self._start, self._steps, self._samples, self._tokens = None, 0, 0, 0
