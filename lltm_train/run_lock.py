"""One training run at a time in a run folder: two runs writing one folder (two commands given one
``hydra.run.dir``, or started in the same second into the default folder) would overwrite each other's
checkpoints and logs, and the "holds checkpoints" refusal acts only once a checkpoint exists."""

from __future__ import annotations

import contextlib
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


def _launched_rank() -> bool:
    return any(os.environ.get(name, "0").strip() not in ("", "0") for name in _RANK_VARIABLES)


@contextlib.contextmanager
def run_dir_lock(run_dir: str | Path) -> Iterator[None]:
    """Holds ``<run_dir>/.lock`` (an advisory ``flock``, which the system drops when the process ends, however it
    ends: a killed run leaves no stale lock) while the block runs. In a process of a multi-process run other than
    the first, a no-op.

    Raises:
        ConfigError: another process holds it (the message names its pid and host).
    """
    if fcntl is None or _launched_rank():
        yield
        return
    path = Path(run_dir) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise ConfigError(f"another run is training in {run_dir} ({holder}): wait for it to end, or give this run "
                              "another hydra.run.dir") from None
        except OSError:  # a file system without locks (NFS mounted nolock): trains unguarded, as before
            yield
            return
        try:
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            f.flush()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
