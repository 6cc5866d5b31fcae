"""``lltm-bench --inference``: one layer's forward alone, as evaluation and sampling run it. For each config
and cell: the fused backend's forward as training runs it (inputs that require grad; the activations kept
for a backward), the same forward under ``torch.no_grad()`` (the ops' ``save=False``: nothing kept), and
PyTorch's layer (the cell's baseline: ``nn.LSTM`` for the LLTM and the LSTM, ``nn.GRU`` for the GRU; cuDNN
on a GPU) under ``torch.no_grad()``. Tokens/s (T x B per forward) and, on a GPU, the peak memory of one
forward beyond its inputs (MiB)."""

from __future__ import annotations

import torch

from ..functional import rnn_layer
from ..ops.cells import CellSpec
from .common import CONFIGS, baseline, compiled_backend, measure, peak_memory_mib, weights


def run_inference(configs: list[str], device: torch.device, dtype: torch.dtype, repeats: int,
                  cells: list[CellSpec], num_heads: int = 1) -> list[dict]:
    backend = compiled_backend(device)
    rows = []
    for name in configs:
        T, B, I, H = CONFIGS[name]
        for cell in cells:
            kw = dict(device=device, dtype=dtype)
            x = torch.randn(T, B, I, **kw, requires_grad=True)
            params = [w.requires_grad_() for w in weights(cell, I, H, num_heads, **kw)]
            rival = baseline(cell)
            theirs = rival.torch_layer(I, H).to(**kw)

            def training_forward():
                rnn_layer(cell, x, None, *params, backend=backend, num_heads=num_heads)

            @torch.no_grad()
            def no_grad_forward():
                rnn_layer(cell, x, None, *params, backend=backend, num_heads=num_heads)

            @torch.no_grad()
            def torch_forward():
                theirs(x)

            baseline_name = f"{rival.torch_label} no_grad"
            contenders = {f"{backend} training": training_forward, f"{backend} no_grad": no_grad_forward,
                          baseline_name: torch_forward}
            row = {"config": name, "cell": cell.name, "T": T, "B": B, "input_size": I, "hidden_size": H,
                   "num_heads": num_heads, "backend": backend, "tokens_per_s": {}}
            for label, fn in contenders.items():
                row["tokens_per_s"][label] = T * B / measure(fn, device, repeats, calls=3)
                if device.type == "cuda":
                    row.setdefault("peak_mib", {})[label] = peak_memory_mib(fn, device)
            tps = row["tokens_per_s"]
            row["no_grad_vs_training"] = tps[f"{backend} no_grad"] / tps[f"{backend} training"]
            row["no_grad_vs_baseline"] = tps[f"{backend} no_grad"] / tps[baseline_name]
            rows.append(row)
            mem = ""
            if "peak_mib" in row:
                mem = "; peak MiB " + ", ".join(f"{k} {v:.0f}" for k, v in row["peak_mib"].items())
            heads = f", {num_heads} heads" if num_heads != 1 else ""
            print(f"{name:>9} {cell.name:>4} (T={T}, B={B}, I={I}, H={H}{heads}): "
                  + ", ".join(f"{k} {v / 1e6:.3f} M tok/s" for k, v in tps.items())
                  + f"; no_grad/training {row['no_grad_vs_training']:.2f}x, no_grad/{baseline_name} "
                  f"{row['no_grad_vs_baseline']:.2f}x{mem}", flush=True)
    return rows
