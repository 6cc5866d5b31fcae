"""Host memory for CPU training: keep freed blocks in the process instead of handing them back to the system.

A CPU training step allocates and frees the same large tensors every step (the layer's activations and
gradients: T x B x 3 H float32, 24 MiB for the default job). glibc's malloc serves blocks above its mmap
threshold (dynamic, 128 KiB to 32 MiB) with fresh ``mmap`` pages and trims the heap's free top above its trim
threshold. Either way the next step faults the pages in again, zeroed by the kernel: under Lightning's loop
the default job took 2,000-5,000 minor page faults a step (8-20 MiB) and ran 4-10% slower than the same
step in a bare loop, which by chance of its allocation order took none (Intel Xeon, 2 vCPU, 2026-12-03,
``resource.getrusage`` around 20 steps). With both thresholds at 1 GiB it took none either. glibc's
``mallopt`` is documented in mallopt(3); before glibc 2.35 it refuses an mmap threshold above 32 MiB.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 30
_OLD_GLIBC_MAX = 32 << 20  # the largest mmap threshold glibc < 2.35 accepts (64-bit)
# The environment variables that decide what keep_freed_memory() does: its own switch, then glibc's own
# thresholds (read at start-up), which it leaves alone.
_THRESHOLDS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
ENVIRONMENT = ("LLTM_KEEP_FREED_MEMORY", *_THRESHOLDS, "GLIBC_TUNABLES")


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library's glibc, or None where the C library is not glibc (or not Linux)."""
    name, version = platform.libc_ver()
    if platform.system() != "Linux" or name != "glibc":
        return None
    return tuple(int(v) for v in version.split(".")[:2])


def _user_has_chosen() -> bool:
    """Whether the environment already sets glibc's thresholds."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(os.environ.get(name) for name in _THRESHOLDS) or \
        "malloc.mmap_threshold" in tunables or "malloc.trim_threshold" in tunables


def keep_freed_memory(limit: int = KEEP_BYTES) -> bool:
    """Serve blocks up to ``limit`` bytes (default 1 GiB; 32 MiB on glibc before 2.35, which refuses more)
    from the heap and keep up to ``limit`` bytes of free heap top instead of returning them to the system,
    so that tensors freed and allocated again every step reuse resident pages. The process's resident
    memory then stays near its peak between steps instead of dropping.

    Nothing changes outside glibc (Linux), with the environment variable ``LLTM_KEEP_FREED_MEMORY=0`` (or
    ``false``, ``no``, ``off``), or where the environment already sets glibc's thresholds
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or either in ``GLIBC_TUNABLES``). Returns whether
    both settings took effect."""
    if os.environ.get("LLTM_KEEP_FREED_MEMORY", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if glibc_version() is None or _user_has_chosen():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    limit = min(int(limit), 2**31 - 1)  # mallopt takes an int
    trim = bool(mallopt(_M_TRIM_THRESHOLD, limit))
    mmap = bool(mallopt(_M_MMAP_THRESHOLD, limit)) or bool(mallopt(_M_MMAP_THRESHOLD, min(limit, _OLD_GLIBC_MAX)))
    return trim and mmap
