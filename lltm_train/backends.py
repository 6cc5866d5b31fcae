"""Which implementation of a cell runs: ``python``, ``cpp``, ``cuda``, ``torch``, or ``auto``.

- ``python``: the reference, composed of PyTorch ops (any device and dtype; autograd does the backward).
- ``cpp``: the compiled extension's fused CPU kernels, for CPU tensors.
- ``cuda``: the compiled extension's CUDA kernels, for CUDA tensors.
- ``torch``: PyTorch's own layer of the cell (``torch.nn.LSTM``, ``GRU``, ``RNN``: cuDNN on a GPU, oneDNN on a
  CPU), the baseline the fused cells are compared with; the cells PyTorch has (not the LLTM).
- ``auto``: the extension for the tensors' device when it is usable, else ``python``; the choice is
  logged once per device type (logger ``lltm_train``).
"""

from __future__ import annotations

import logging

import torch

from . import ops
from .ops.cells import cell_spec

log = logging.getLogger("lltm_train")

BACKENDS = ("auto", "python", "cpp", "cuda", "torch")
_DEVICE_BACKEND = {"cpu": "cpp", "cuda": "cuda"}  # the compiled backend of each device type
_announced: set[str] = set()
_available: list[str] = []


def available_backends() -> list[str]:
    """The backends usable in this process, e.g. ``["python", "cpp"]`` or ``["python", "cpp", "cuda"]``.

    The first call loads the compiled extension, building it just in time from ``csrc/`` when a source
    checkout has no compiled copy; the answer is then kept (it is asked on every call of an op).
    """
    if not _available:
        names = ["python"]
        if ops.load():
            names.append("cpp")
            if ops.has_cuda_kernels() and torch.cuda.is_available():
                names.append("cuda")
        _available[:] = names
    return list(_available)


def _why_unavailable(name: str) -> str:
    if not ops.load():
        return (
            f"the compiled extension could not be loaded ({ops.load_error()}); build it with "
            "`pip install --no-build-isolation -e .` (needs g++ and ninja), or use backend='python'"
        )
    if name == "cuda" and not ops.has_cuda_kernels():
        return (
            f"the extension was built without CUDA kernels (torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}); rebuild it with a CUDA build of torch and nvcc on PATH, "
            "or use backend='python'"
        )
    return "no CUDA device is visible (torch.cuda.is_available() is False)"


def check_backend_name(backend: str, cell: str = "lltm") -> None:
    """Raises ValueError unless ``backend`` is one of :data:`BACKENDS` and exists for ``cell`` (``torch`` only
    for the cells PyTorch has: ``CellSpec.torch_module``)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "torch":
        spec = cell_spec(cell)
        if not spec.has_torch:
            raise ValueError(f"backend 'torch' is torch.nn's own cells, and PyTorch has no {spec.title}: choose auto, "
                             f"python, cpp or cuda for the {spec.name} cell")


@torch.compiler.assume_constant_result
def resolve_backend(backend: str, device_type: str, cell: str = "lltm") -> str:
    """The concrete backend (``python``, ``cpp``, ``cuda`` or ``torch``) that runs ``backend`` on
    ``device_type`` for ``cell``.

    Raises:
        ValueError: unknown backend or cell name, ``torch`` for a cell PyTorch lacks (the LLTM), or a backend
            asked for tensors of the wrong device.
        RuntimeError: the backend asked for is not built or not usable here (the message says how to fix it).
    """
    check_backend_name(backend, cell)
    if backend in ("python", "torch"):
        return backend
    if backend == "auto":
        wanted = _DEVICE_BACKEND.get(device_type)
        chosen = wanted if wanted in available_backends() else "python"
        if device_type not in _announced:
            _announced.add(device_type)
            reason = "" if chosen == wanted else f" ({_why_unavailable(wanted) if wanted else 'no kernels for this device'})"
            log.info("backend 'auto' runs '%s' for %s tensors%s", chosen, device_type, reason)
        return chosen
    if _DEVICE_BACKEND.get(device_type) != backend:
        fix = "backend='cuda'" if device_type == "cuda" else "backend='cpp'" if device_type == "cpu" else "backend='python'"
        raise ValueError(
            f"backend {backend!r} runs on {'CPU' if backend == 'cpp' else 'CUDA'} tensors, but the "
            f"tensors are on {device_type}; use {fix} or backend='auto', or move the tensors"
        )
    if backend not in (_available or available_backends()):
        raise RuntimeError(f"backend {backend!r} is not available: {_why_unavailable(backend)}")
    return backend
