"""The extra CUDA streams that stacked layers run beside the current one (a bidirectional layer's second direction,
rnn._overlapped; a wavefront's layers, _wavefront.py): when they may be used, and the kept streams themselves."""

from __future__ import annotations

import torch
from torch import Tensor

_KEPT: dict[torch.device, list[torch.cuda.Stream]] = {}


def streams_usable(x: Tensor) -> bool:
    """Whether work over x may go to extra streams: x on a GPU, and no torch.compile, torch.export or
    torch.jit.trace tracing under way. Inside a CUDA graph capture (the captured training step) too: a stream
    that waits on the capturing one joins the capture, its kernels become a branch of the graph, and its
    allocations go to the graph's pool (the kept streams are made by the eager warm-up before a capture)."""
    return not (x.device.type != "cuda" or torch.compiler.is_compiling() or torch.jit.is_tracing())


def kept_streams(device: torch.device, n: int) -> list[torch.cuda.Stream]:
    """n CUDA streams of ``device``, made once and kept: the stepped path caches its CUDA graphs and cuBLAS keeps a
    workspace per stream, which fresh streams of PyTorch's pool at each call would keep replacing."""
    kept = _KEPT.setdefault(device, [])
    while len(kept) < n:
        kept.append(torch.cuda.Stream(device))
    return kept[:n]
