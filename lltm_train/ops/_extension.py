"""Loads the compiled op library, building it just in time when no compiled copy is installed.

``pip install --no-build-isolation -e .`` compiles ``lltm_train._C`` ahead of time. A source checkout run
with ``PYTHONPATH`` (as on the GPU machine) has no compiled module: the first use then compiles
``csrc/`` with :func:`torch.utils.cpp_extension.load` into ``.cache/extension/<python-torch-device>/`` at
the repository root, under an ``fcntl`` lock that the operating system releases when a build crashes.
"""

from __future__ import annotations

import fcntl
import importlib
import logging
import os
import re
import shutil
import sys
from pathlib import Path

import torch

from ._build import CPP_SOURCES, CUDA_FLAGS, CUDA_SOURCES, CXX_FLAGS, LD_FLAGS

log = logging.getLogger("lltm_train")

_ROOT = Path(__file__).resolve().parents[2]

_CSRC = _ROOT / "csrc"
_status: dict[str, object] = {"loaded": False, "error": None}


def _cuda_build_possible() -> bool:
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    return torch.version.cuda is not None and home is not None and Path(home, "bin", "nvcc").exists()


def _build_dir(with_cuda: bool) -> Path:
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}-{'cuda' if with_cuda else 'cpu'}"
    return _ROOT / ".cache" / "extension" / re.sub(r"[^A-Za-z0-9_.-]", "_", tag)


def _build_just_in_time() -> None:
    from torch.utils import cpp_extension

    if not (_CSRC / "lltm.cpp").exists():
        raise RuntimeError(
            "the compiled extension lltm_train._C is missing and there are no sources to build it from; "
            "reinstall with `pip install --no-build-isolation .`"
        )
    with_cuda = _cuda_build_possible()
    sources = [_CSRC / name for name in (CPP_SOURCES + (CUDA_SOURCES if with_cuda else ()))]
    build_dir = _build_dir(with_cuda)
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the OS if this process dies
        # cpp_extension's own lock file outlives a killed build and would block every later one;
        # holding our lock means nobody else is building, so any such file is stale.
        (build_dir / "lock").unlink(missing_ok=True)
        built = build_dir / "lltm_train_C.so"
        newest_source = max(f.stat().st_mtime for f in _CSRC.iterdir())
        # ninja rebuilds only what changed: announce a build only when there is one to wait for
        if not built.exists() or built.stat().st_mtime < newest_source:
            print(
                f"lltm_train: compiling the {'C++/CUDA' if with_cuda else 'C++'} extension into {build_dir} "
                "(first use only; about a minute)",
                file=sys.stderr,
                flush=True,
            )
        cpp_extension.load(
            name="lltm_train_C",
            sources=[str(s) for s in sources],
            extra_cflags=CXX_FLAGS,
            extra_ldflags=LD_FLAGS,
            extra_cuda_cflags=CUDA_FLAGS,
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=os.environ.get("LLTM_VERBOSE_BUILD") == "1",
        )


def load() -> bool:
    """Registers the ``torch.ops.lltm`` ops; returns False (and keeps the reason) when that fails."""
    if _status["loaded"]:
        return True
    if _status["error"] is not None:
        return False
    try:
        try:
            importlib.import_module("lltm_train._C")
        except ImportError as exc:  # absent, or built against another torch
            log.debug("no usable compiled extension (%s); building just in time", exc)
            _put_ninja_on_path()
            _build_just_in_time()
    except Exception as exc:  # noqa: BLE001 - any build failure makes the backend unavailable
        _status["error"] = f"{type(exc).__name__}: {exc}"
        return False
    from . import _registrations

    _registrations.register()
    _status["loaded"] = True
    return True


def load_if_built() -> bool:
    """Registers the ops if a compiled op library is at hand (the installed ``lltm_train._C``, or an
    up-to-date just-in-time build), without building one: ``import lltm_train`` runs this, so that saved
    programs calling ``torch.ops.lltm.*`` (TorchScript, ``torch.export``) load after that import alone."""
    if _status["loaded"]:
        return True
    try:
        importlib.import_module("lltm_train._C")
    except ImportError:
        built = _build_dir(_cuda_build_possible()) / "lltm_train_C.so"
        sources = [f.stat().st_mtime for f in _CSRC.iterdir()] if _CSRC.is_dir() else []
        if not (built.exists() and sources and built.stat().st_mtime >= max(sources)):
            return False
        try:
            torch.ops.load_library(str(built))
        except OSError:
            return False
    from . import _registrations

    _registrations.register()
    _status["loaded"] = True
    return True


def _put_ninja_on_path() -> None:
    # pip's ninja lands beside the interpreter, which is not on PATH when a venv is used unactivated.
    if shutil.which("ninja") is None:
        bindir = Path(sys.executable).parent
        if (bindir / "ninja").exists():
            os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
        else:
            raise RuntimeError("building the extension needs ninja: `pip install ninja`")


def load_error() -> str | None:
    """Why :func:`load` failed, or None."""
    return _status["error"]  # type: ignore[return-value]


def has_cuda_kernels() -> bool:
    """True when the loaded library carries the CUDA kernels."""
    return load() and torch._C._dispatch_has_kernel_for_dispatch_key("lltm::layer_forward", "CUDA")
