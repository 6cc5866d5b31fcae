"""``lltm-bench --jit``: the default job's model, forward only (inference), as eager PyTorch, TorchScript
(``torch.jit.script`` where it goes, ``torch.jit.trace``), ``torch.compile`` and a ``torch.export``
program: the speed study of the tutorial's "jit" variants, redone for this model."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..export import TokenModel
from ..models import CharLM
from .common import measure


def _variants(model: TokenModel, args: tuple) -> dict[str, Callable[[], object] | str]:
    """name -> a call of that variant on ``args``, or the reason it cannot be made."""
    out: dict[str, Callable[[], object] | str] = {"eager": lambda: model(*args)}
    try:
        scripted = torch.jit.script(model)
        out["jit.script"] = lambda: scripted(*args)
    except Exception as exc:  # noqa: BLE001 - the reason goes in the table
        out["jit.script"] = f"not scriptable: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    traced = torch.jit.trace(model, args, check_trace=False)
    out["jit.trace"] = lambda: traced(*args)
    compiled = torch.compile(model)
    out["compile"] = lambda: compiled(*args)
    T, B = torch.export.Dim("T", min=1, max=100_000), torch.export.Dim("B", min=1, max=100_000)
    # exported once with 2 rows (an example of size 1 would fix the batch size at 1), called with args
    example = (args[0][:, :1].repeat(1, 2), args[1][:, :1].repeat(1, 2, 1), args[2][:, :1].repeat(1, 2, 1))
    program = torch.export.export(model, example, dynamic_shapes=({0: T, 1: B}, {1: B}, {1: B})).module()
    out["export"] = lambda: program(*args)
    return out


def run_jit(device: torch.device, repeats: int, seq_len: int = 128, batches=(1, 64)) -> list[dict]:
    """Median milliseconds per forward of each variant, for each batch size; prints a table."""
    torch.manual_seed(0)
    net = CharLM(84, hidden_size=256, embedding_dim=64).to(device).eval()
    rows = []
    with torch.no_grad():
        for B in batches:
            model = TokenModel(net)
            args = (torch.randint(0, 84, (seq_len, B), device=device), torch.zeros(1, B, 256, device=device),
                    torch.zeros(1, B, 256, device=device))
            eager_ms = None
            for name, call in _variants(model, args).items():
                if isinstance(call, str):
                    rows.append({"batch": B, "variant": name, "ms": None, "note": call})
                    print(f"B={B:3d} {name:10s} {call}", flush=True)
                    continue
                ms = 1000 * measure(call, device, repeats, calls=5, warmup=3)
                eager_ms = eager_ms or ms
                rows.append({"batch": B, "variant": name, "ms": ms, "vs_eager": eager_ms / ms})
                print(f"B={B:3d} {name:10s} {ms:8.3f} ms  {eager_ms / ms:5.2f}x eager", flush=True)
    return rows
