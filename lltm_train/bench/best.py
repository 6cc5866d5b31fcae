"""``lltm-bench --dtype best``: each contender in the dtype that is fastest for it.

A user who wants speed picks the dtype too: cuDNN runs its persistent LSTM kernels in float16 only
(``ampere_lstm_tile16``, when I and H are multiples of 128, B a multiple of 8 up to 128 and H <= 1024), while
its float32 (TF32) kernels can be the fastest elsewhere. So each layer, PyTorch's (``nn.LSTM``, ``nn.GRU``)
and ours (``cuda`` or ``cpp``) for every cell, is timed in float32 (TF32 allowed), float16 and bfloat16, and
each is credited with its best. Every dtype of ours is first checked against the python backend
(:func:`lltm_train.bench.common.checked_against_python`). The table compares each fused cell with PyTorch's
best for its main baseline (the same cell where PyTorch has it), and each cell with several baselines
(``CellSpec.baselines``: the LLTM's are the LSTM and the GRU) with the best of their layers, where the other
cells' rows measured them. Where FlashRNN is installed (:mod:`.peers`), its layer of the cell is timed in each
dtype it takes too, and each fused cell is compared with its best.
"""

from __future__ import annotations

import torch

from ..ops.cells import CELLS, CellSpec
from .common import (CONFIGS, baseline_label, checked_against_python, compiled_backend, contenders, layout_text, measure,
                     peak_memory_mib)
from .peers import try_contender

DTYPES = ("float32", "float16", "bfloat16")


def _best(figures: dict[str, float]) -> tuple[float, str]:
    dtype = max(figures, key=figures.get)
    return figures[dtype], dtype


def run_best(configs: list[str], device: torch.device, repeats: int, cells: list[CellSpec],
             num_heads: int = 1, num_layers: int = 1, bidirectional: bool = False) -> list[dict]:
    """One row per config and cell: tokens/s and peak MiB of PyTorch's layer and ours (and FlashRNN's) in each
    dtype, the best of each and their ratio; then, per config, each cell with several baselines against the best
    of them. ``num_heads``, ``num_layers``, ``bidirectional``: as :func:`lltm_train.bench.layers.run_layers`'s."""
    stack = dict(num_layers=num_layers, bidirectional=bidirectional)
    backend = compiled_backend(device)
    rows = []
    for name in configs:
        T, B, I, H = CONFIGS[name]
        for cell in cells:
            baseline = baseline_label(cell)
            row = {"config": name, "cell": cell.name, "T": T, "B": B, "input_size": I, "hidden_size": H,
                   "num_heads": num_heads, **stack, "baseline": baseline, "backend": backend,
                   "tokens_per_s": {baseline: {}, backend: {}}, "peak_mib": {baseline: {}, backend: {}}, "check": {}}
            for dtype_name in DTYPES:
                dtype = getattr(torch, dtype_name)
                row["check"][dtype_name] = checked_against_python(name, min(T, 64), B, I, H, device, dtype, backend,
                                                                  cell, num_heads, **stack)
                for label, fn in contenders(name, T, B, I, H, device, dtype, backend, cell, num_heads, peers=True, **stack):
                    if label == "python":
                        continue
                    if label.startswith("FlashRNN"):
                        if (reason := try_contender(fn)) is not None:
                            row.setdefault("failed", {})[f"{label} {dtype_name}"] = reason
                            continue
                        row["peer"] = label
                        row["tokens_per_s"].setdefault(label, {})
                        row["peak_mib"].setdefault(label, {})
                    row["tokens_per_s"][label][dtype_name] = T * B / measure(fn, device, repeats, calls=3)
                    if device.type == "cuda":
                        row["peak_mib"][label][dtype_name] = peak_memory_mib(fn, device)
            (ours, ours_dtype), (theirs, theirs_dtype) = _best(row["tokens_per_s"][backend]), _best(row["tokens_per_s"][baseline])
            row["best"] = {backend: [ours, ours_dtype], baseline: [theirs, theirs_dtype]}
            row["ratio_best"] = ours / theirs
            peer_text = ""
            if "peer" in row:
                row["best"][row["peer"]] = list(_best(row["tokens_per_s"][row["peer"]]))
                row["ratio_vs_peer"] = ours / row["best"][row["peer"]][0]
                peer_text = f", {backend}/{row['peer']} {row['ratio_vs_peer']:.2f}x"
            rows.append(row)
            heads = layout_text(row)
            failed = "".join(f"; {label} failed ({reason})" for label, reason in row.get("failed", {}).items())
            print(f"{name:>7} {cell.name:>4} (T={T}, B={B}, I={I}, H={H}{heads}): " + "; ".join(
                f"{label} " + ", ".join(f"{d} {v / 1e6:.2f}" for d, v in row["tokens_per_s"][label].items())
                for label in row["tokens_per_s"]) + f" M tok/s; best {backend}/{baseline} {row['ratio_best']:.2f}x"
                + peer_text + failed, flush=True)
    print(format_table(rows), flush=True)
    return rows


def format_table(rows: list[dict]) -> str:
    """The best-dtype table: M tokens/s (the winning dtype), fused / PyTorch's best for the cell's main
    baseline; then for each cell with several baselines, / the best of their layers at that config (each
    layer's figure from the cell's own row for its main baseline, else from the first row that measured it;
    no line when one of them was not measured)."""
    lines = ["| config | cell | PyTorch best | fused best | fused / PyTorch | peak MiB fused / PyTorch (best dtypes) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        (ours, od), (theirs, td) = r["best"][r["backend"]], r["best"][r["baseline"]]
        mem = r["peak_mib"][r["backend"]].get(od), r["peak_mib"][r["baseline"]].get(td)
        mem_text = f"{mem[0]:.0f} / {mem[1]:.0f}" if None not in mem else "-"
        lines.append(f"| {r['config']}{layout_text(r)} | {r['cell']} | {theirs / 1e6:.2f} ({r['baseline']}, {td}) | {ours / 1e6:.2f} ({od}) "
                     f"| {r['ratio_best']:.2f}x | {mem_text} |")
    for r in rows:
        if "peer" in r:
            tps, dtype = r["best"][r["peer"]]
            lines.append(f"{r['config']}: {r['cell']} / {r['peer']}'s best ({dtype}, {tps / 1e6:.2f} M, the recurrence "
                         f"alone) {r['ratio_vs_peer']:.2f}x")
    for config in dict.fromkeys(r["config"] for r in rows):
        at_config = [r for r in rows if r["config"] == config]
        for row in at_config:
            spec = CELLS.get(row["cell"])
            if spec is None or len(spec.baselines) < 2:
                continue
            measured = {}  # torch.nn layer -> [tokens/s, dtype]: the cell's own row first
            for r in (row, *at_config):
                measured.setdefault(r["baseline"], r["best"][r["baseline"]])
            labels = [CELLS[b].torch_label for b in spec.baselines]
            if not all(label in measured for label in labels):
                continue
            ours = row["best"][row["backend"]][0]
            label, (tps, dtype) = max(((label, measured[label]) for label in labels), key=lambda kv: kv[1][0])
            names = " and ".join([", ".join(labels[:-1]), labels[-1]])
            lines.append(f"{config}: {row['cell']} / the best of {names} ({label}, {dtype}, {tps / 1e6:.2f} M) "
                         f"{ours / tps:.2f}x")
    return "\n".join(lines)
