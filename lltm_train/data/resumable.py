"""Training batches that a checkpoint can resume part-way through an epoch, in the same order.

The order of epoch ``e`` is a function of ``(seed, e)`` alone (never of the global random state), and the
loader counts the batches it has handed out. Lightning saves that position in every checkpoint (it calls
``state_dict`` on training loaders that have one) and hands it back to ``load_state_dict`` on resume, so
a resumed run trains on exactly the batches the uninterrupted run would have.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class ResumableSampler(DistributedSampler):
    """Indices of a map-style data set for one process, shuffled per epoch, from a given batch on.

    As :class:`~torch.utils.data.DistributedSampler` (``drop_last=True``): epoch ``e`` is the permutation
    drawn from ``seed + e``, of which process ``rank`` takes every ``num_replicas``-th index. Being a
    DistributedSampler, Lightning leaves it in place under DDP and calls :meth:`set_epoch` at each epoch.

    ``epoch`` and ``position`` (batches of ``batch_size`` already trained in that epoch) say where
    iteration starts; the loader that draws from it advances ``position``.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.position = 0

    def set_epoch(self, epoch: int) -> None:
        """Moves to the start of ``epoch``; a no-op for the epoch under way (which may be a resumed one)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def __iter__(self):
        indices = list(super().__iter__())
        return iter(indices[self.position * self.batch_size :])


class ResumablePosition:
    """``state_dict``/``load_state_dict`` for an iterable of batches that draws from ``self.sampler``
    (a :class:`ResumableSampler`) and has a length in batches."""

    sampler: ResumableSampler

    def state_dict(self) -> dict:
        """Where training is in the data: epoch, batches trained in it, and the layout they count in
        (batch size per process, samples per process, processes, samples in the data set)."""
        s = self.sampler
        return {"epoch": s.epoch, "batches": s.position, "batch_size": s.batch_size, "samples": s.num_samples,
                "num_replicas": s.num_replicas, "dataset_size": len(s.dataset)}

    def load_state_dict(self, state: dict) -> None:
        """Resumes at a saved position, also on another number of processes or another batch size: the
        batches trained so far are a prefix of the epoch's order (process ``r`` of ``n`` takes every
        ``n``-th index of it), so a new layout goes on after that prefix when it ends on one of the new
        layout's batches. Where it cannot (another data set size, or a prefix the new batches do not divide)
        a warning says so and that epoch starts again from its first batch.

        Raises:
            ValueError: the state is not one :meth:`state_dict` wrote.
        """
        try:
            epoch, batches = int(state["epoch"]), int(state["batches"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{type(self).__name__}: not a data position: {state!r}") from None
        if epoch < 0 or batches < 0:
            raise ValueError(f"{type(self).__name__}: not a data position: {state!r}")
        s = self.sampler
        saved = (state.get("batch_size"), state.get("samples"), state.get("num_replicas", 1))
        if saved != (s.batch_size, s.num_samples, s.num_replicas):
            trained = batches * (saved[0] or 0) * saved[2]  # samples of the epoch's order, all processes
            per_batch = s.batch_size * s.num_replicas
            same_order = state.get("dataset_size") == len(s.dataset) and saved[0] is not None
            if same_order and trained % per_batch == 0:
                batches = trained // per_batch
            else:
                warnings.warn(f"the checkpoint's data position (epoch {epoch}, batch {batches}) was counted in batches "
                              f"of {saved[0]} on {saved[2]} process(es) over {saved[1]} samples each, this run has "
                              f"batches of {s.batch_size} on {s.num_replicas} over {s.num_samples}: epoch {epoch} "
                              "starts again from its first batch", stacklevel=2)
                batches = 0
        s.epoch, s.position = epoch, batches

    def _start_epoch(self) -> None:
        """At the start of an iteration: an epoch whose batches were all trained gives way to the next
        (Lightning knows the length, so it never asks the finished iterator for more)."""
        if self.sampler.position >= len(self):
            self.sampler.set_epoch(self.sampler.epoch + 1)


class ResumableLoader(ResumablePosition, DataLoader):
    """A :class:`~torch.utils.data.DataLoader` whose ``sampler`` is a :class:`ResumableSampler` and whose
    position Lightning checkpoints. Worker seeds come from ``loader.generator``, reseeded each epoch, so the
    loader never draws from the global random state (which dropout uses and checkpoints restore)."""

    def __iter__(self):
        if not isinstance(self.sampler, ResumableSampler):  # replaced by Lightning (e.g. overfit_batches)
            yield from super().__iter__()
            return
        self._start_epoch()
        if self.generator is not None:
            self.generator.manual_seed(self.sampler.seed + self.sampler.epoch)
        for batch in super().__iter__():
            self.sampler.position += 1  # before the yield: the batch counts as trained once handed out
            yield batch

    def state_dict(self) -> dict:
        return super().state_dict() if isinstance(self.sampler, ResumableSampler) else {}

    def load_state_dict(self, state: dict) -> None:
        if state and isinstance(self.sampler, ResumableSampler):
            super().load_state_dict(state)


def loader_generator(seed: int) -> torch.Generator:
    """A CPU generator for a DataLoader's worker seeds, so that making an iterator leaves the global
    random state alone (a resumed run's dropout then draws what the uninterrupted run's drew)."""
    return torch.Generator().manual_seed(seed)
