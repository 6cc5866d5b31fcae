"""``lltm-bench`` (the default mode): forward + backward of one layer over a whole sequence (tokens = T x B),
for each config and cell: PyTorch's layer (the cell's baseline), the python backend and the fused backend,
after checking the fused backend against the python one on the same inputs, and FlashRNN's layer where it is
installed (:mod:`.peers`); the seed cell (one step) against PyTorch's one-step cell; peak memory on a GPU."""

from __future__ import annotations

import torch

from ..ops.cells import CellSpec
from .common import (CONFIGS, baseline_label, checked_against_python, compiled_backend, contenders, layout_text, measure,
                     peak_memory_mib)
from .peers import try_contender


def run_layers(configs: list[str], device: torch.device, dtype: torch.dtype, repeats: int,
               cells: list[CellSpec], num_heads: int = 1, num_layers: int = 1, bidirectional: bool = False) -> list[dict]:
    """One row per config and cell: seconds and tokens/s of each contender, their ratios; prints a line each.
    With ``num_heads`` ours and FlashRNN's layers run that many heads (PyTorch's the dense width); with
    ``num_layers`` and ``bidirectional`` ours and PyTorch's run that stack (:func:`.common.contenders`)."""
    backend = compiled_backend(device)
    stack = dict(num_layers=num_layers, bidirectional=bidirectional)
    rows = []
    for name in configs:
        T, B, I, H = CONFIGS[name]
        for cell in cells:
            err = checked_against_python(name, min(T, 64), B, I, H, device, dtype, backend, cell, num_heads, **stack)
            calls = 50 if name == "seed-cell" else 1 if T * H >= 256 * 1024 and device.type == "cpu" else 3
            baseline = baseline_label(cell)
            row = {"config": name, "cell": cell.name, "T": T, "B": B, "input_size": I, "hidden_size": H,
                   "num_heads": num_heads, **stack, "baseline": baseline, "backend": backend, "check_rel_err": err,
                   "seconds": {}, "tokens_per_s": {}}
            for label, fn in contenders(name, T, B, I, H, device, dtype, backend, cell, num_heads, peers=True, **stack):
                if label.startswith("FlashRNN") and (reason := try_contender(fn)) is not None:
                    row.setdefault("failed", {})[label] = reason
                    continue
                sec = measure(fn, device, repeats, calls)
                row["seconds"][label] = sec
                row["tokens_per_s"][label] = T * B / sec
                if device.type == "cuda":
                    row.setdefault("peak_mib", {})[label] = peak_memory_mib(fn, device)
            tps = row["tokens_per_s"]
            row["ratio_vs_torch"] = tps[backend] / tps[baseline]
            row["ratio_vs_python"] = tps[backend] / tps["python"]
            peer = next((label for label in tps if label.startswith("FlashRNN")), None)
            if peer is not None:
                row["peer"], row["ratio_vs_peer"] = peer, tps[backend] / tps[peer]
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    """A row of :func:`run_layers` as the line it prints."""
    backend, baseline = row["backend"], row["baseline"]
    if row["config"] == "seed-cell":
        times = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in row["seconds"].items())
    else:
        times = ", ".join(f"{k} {v / 1e6:.3f} M tok/s" for k, v in row["tokens_per_s"].items())
    mem = ""
    if "peak_mib" in row:
        mem = f"; peak MiB {row['peak_mib'][backend]:.0f} vs {baseline} {row['peak_mib'][baseline]:.0f}"
    heads = layout_text(row)
    peer = f", {backend}/{row['peer']} {row['ratio_vs_peer']:.2f}x" if "peer" in row else ""
    failed = "".join(f"; {label} failed ({reason})" for label, reason in row.get("failed", {}).items())
    return (f"{row['config']:>9} {row['cell']:>4} (T={row['T']}, B={row['B']}, I={row['input_size']}, "
            f"H={row['hidden_size']}{heads}): {times}; {backend}/{baseline} {row['ratio_vs_torch']:.2f}x, "
            f"{backend}/python {row['ratio_vs_python']:.2f}x{peer}{mem}{failed}")
