"""One training run at a time in a run folder: two runs writing one folder (two commands given one
``hydra.run.dir``, or started in the same second into the default folder) would overwrite each other's
checkpoints and logs, and the "holds checkpoints" refusal acts only once a checkpoint exists."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from .config import ConfigError
from .run_files import LOCK

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None

# launched processes of a multi-process run (DDP, SLURM tasks) have one of these non-zero; the first holds the lock
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")


class RunFolderBusy(ConfigError):
    """Another process is training in the run folder: the folder is that run's (nothing may be written into it,
    nor the folder removed, on this refusal's account)."""


def _launched_rank() -> bool:
    return any(os.environ.get(name, "0").strip() not in ("", "0") for name in _RANK_VARIABLES)


@contextlib.contextmanager
def run_dir_lock(run_dir: str | Path) -> Iterator[None]:
    """Holds a lock on ``<run_dir>/.lock`` while the block runs: a POSIX record lock (``lockf``), which the
    system drops when the process ends, however it ends, and which forked processes (data-loader workers) do not
    inherit, so a killed run leaves no stale lock. In a process of a multi-process run other than the first, a
    no-op; on a file system without locks, the run goes on unguarded.

    Raises:
        RunFolderBusy: another process holds it (the message names its pid and host).
        ConfigError: the lock file cannot be opened (permission denied).
    """
    if fcntl is None or _launched_rank():
        yield
        return
    path = Path(run_dir) / LOCK
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")
    except OSError as exc:
        raise ConfigError(f"cannot open {path}, the run folder's lock ({exc.strerror}); choose another "
                          "hydra.run.dir") from None
    with f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):  # no locks here (NFS mounted nolock)
                yield
                return
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise RunFolderBusy(f"another run is training in {run_dir} ({holder}): wait for it to end, or give this run "
                                "another hydra.run.dir") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            f.flush()
            yield
        finally:
            fcntl.lockf(f, fcntl.LOCK_UN)


def run_in_progress(run_dir: str | Path) -> bool | None:
    """Whether a process holds the run folder's lock now (a run is training there), tested without taking it
    (``lockf``'s F_TEST); None where that cannot be told (no lock file: a run before 2026-12-07, or not POSIX)."""
    path = Path(run_dir) / LOCK
    if fcntl is None or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        os.lockf(fd, os.F_TEST, 0)
        return False
    except OSError as exc:
        return True if exc.errno in (errno.EACCES, errno.EAGAIN) else None
    finally:
        os.close(fd)
