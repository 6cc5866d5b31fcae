"""Checkpoint files written whole: a kill or a full disk during a write leaves the previous file as it was."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from fsspec.implementations.local import LocalFileSystem


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, no permission); the previous file is intact."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO``, except that a checkpoint on a local disk is written to a temporary
    file beside its destination, flushed to the disk (``fsync``) and renamed over it (``os.replace``, atomic
    on POSIX), then the directory entry is flushed too. Lightning's own writer stages the file in the system
    temporary directory, whence a move to another file system is a copy that a kill can cut short, and it
    does not fsync. Other file systems (``s3://`` ...) are left to Lightning.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        except OSError as exc:
            kept = f"; the previous {path.name} is intact" if path.is_file() else ""
            raise CheckpointWriteError(exc.errno, f"cannot write the checkpoint {path}: "
                                                  f"{exc.strerror or exc}{kept}") from None
        except RuntimeError as exc:  # torch.save's own writer reports a short write so
            if "file write failed" not in str(exc) and "unexpected pos" not in str(exc):
                raise
            kept = f"; the previous {path.name} is intact" if path.is_file() else ""
            raise CheckpointWriteError(f"cannot write the checkpoint {path}: the disk is full or failing{kept}") from None
        finally:
            try:
                partial.unlink(missing_ok=True)
            except OSError:  # a read-only disk refuses even this: the error above is the one to report
                pass
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)
