"""``lltm-bench --sweep T|B|H``: how the cost of one layer's forward + backward grows with the sequence length
T, the batch B or the hidden size H, for each backend against ``torch.nn.LSTM``; ``--plot DIR`` draws it.

One dimension varies over powers of two while the others stay at the device's base size (``BASE``; the
input size follows H). Each point is timed as ``lltm-bench`` times a layer (median of ``--repeats``, after
warm-up, every contender on the same inputs) and checked against the python backend first. Memory is what
a user runs out of: on a GPU the peak CUDA memory of one forward + backward beyond what was allocated
before; on the CPU the bytes the forward keeps for the backward (autograd's saved tensors, counted once
per storage), as the CPU has no allocator statistics. The fitted exponent of time against the varied size
(least squares over the upper half of the points, log-log) says how the cost grows: 1.0 is linear.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..backends import resolve_backend
from .common import checked_against_python, contenders, measure, peak_memory_mib

BASE = {"cpu": {"T": 64, "B": 32, "H": 128}, "cuda": {"T": 128, "B": 64, "H": 512}}
VALUES = {  # the swept values by device and dimension; the python backend is left out above its limit
    "cpu": {"T": [8, 16, 32, 64, 128, 256, 512], "B": [1, 4, 16, 64, 256], "H": [32, 64, 128, 256, 512]},
    "cuda": {"T": [16, 32, 64, 128, 256, 512, 1024, 2048], "B": [1, 4, 16, 64, 256, 1024],
             "H": [64, 128, 256, 512, 1024, 2048]},
}
UNITS = {"T": "sequence length T", "B": "batch size B", "H": "hidden size H (= input size)"}


def saved_for_backward_mib(fn) -> float:
    """MiB of the tensors autograd saves for the backward during one call of ``fn`` (each storage once)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values()) / 2**20


def _point(dim: str, value: int, device: torch.device, repeats: int, python_limit: int) -> dict:
    size = {**BASE[device.type], dim: value}
    T, B, H = size["T"], size["B"], size["H"]
    backend = resolve_backend("auto", device.type)
    err = checked_against_python(f"{dim}={value}", min(T, 64), B, H, H, device, torch.float32, backend)
    row = {dim: value, "T": T, "B": B, "hidden_size": H, "check_rel_err": err, "seconds": {}, "tokens_per_s": {},
           "memory_mib": {}}
    for label, fn in contenders("sweep", T, B, H, H, device, torch.float32, backend):
        if label == "python" and T * B * H > python_limit:
            continue  # the time loop in Python: minutes per point at the largest sizes
        sec = measure(fn, device, repeats, calls=1 if device.type == "cpu" else 3, warmup=2)
        row["seconds"][label] = sec
        row["tokens_per_s"][label] = T * B / sec
        row["memory_mib"][label] = peak_memory_mib(fn, device) if device.type == "cuda" else saved_for_backward_mib(fn)
    return row


def growth_exponent(xs: list[float], ys: list[float]) -> float:
    """Slope of log(y) against log(x) by least squares over the upper half of the points (at least two)."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys)][max(0, min(len(xs) // 2, len(xs) - 2)):]
    if len(pairs) < 2:
        return float("nan")
    mx, my = sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs)
    return sum((x - mx) * (y - my) for x, y in pairs) / sum((x - mx) ** 2 for x, _ in pairs)


def run_sweep(dim: str, device: torch.device, repeats: int, values: list[int] | None = None) -> dict:
    """Times every contender at each value of ``dim``; prints one line a point and the growth exponents."""
    values = values or VALUES[device.type][dim]
    python_limit = 64 * 32 * 512 if device.type == "cpu" else 2048 * 64 * 2048
    points = []
    for value in values:
        try:
            row = _point(dim, value, device, repeats, python_limit)
        except (torch.OutOfMemoryError, RuntimeError) as exc:  # the CPU allocator raises a RuntimeError
            if "memory" not in str(exc):
                raise
            print(f"{dim}={value:>5}: out of memory, and so every larger size: {str(exc).splitlines()[0][:120]}", flush=True)
            break
        points.append(row)
        figures = ", ".join(f"{k} {v / 1e6:.3f} M tok/s ({row['memory_mib'][k]:.1f} MiB)" for k, v in row["tokens_per_s"].items())
        print(f"{dim}={value:>5} (T={row['T']}, B={row['B']}, H={row['hidden_size']}): {figures}", flush=True)
    labels = list(dict.fromkeys(label for p in points for label in p["seconds"]))  # python leaves the large sizes out
    exponents = {}
    for label in labels:
        have = [p for p in points if label in p["seconds"]]
        exponents[label] = growth_exponent([p[dim] for p in have], [p["seconds"][label] for p in have])
    print(f"time ~ {dim}^k over the upper half: " + ", ".join(
        f"{k} k={v:.2f}" if math.isfinite(v) else f"{k} k: two sizes needed" for k, v in exponents.items()), flush=True)
    return {"dimension": dim, "base": BASE[device.type], "points": points, "time_exponent": exponents,
            "memory": "peak CUDA MiB" if device.type == "cuda" else "MiB saved for the backward"}


def plot_sweep(result: dict, machine: dict, out_dir: str | Path) -> Path:
    """Writes ``scaling_<device>_<dim>.png``: tokens/s and memory against the swept size, one line a contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dim, points = result["dimension"], result["points"]
    device = "cpu" if machine["device"] == "cpu" else "cuda"
    fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label in result["time_exponent"]:
        have = [p for p in points if label in p["seconds"]]
        xs = [p[dim] for p in have]
        ax_speed.plot(xs, [p["tokens_per_s"][label] for p in have], marker="o",
                      label=f"{label} (time ~ {dim}^{result['time_exponent'][label]:.2f})")
        ax_mem.plot(xs, [p["memory_mib"][label] for p in have], marker="o", label=label)
    for ax, ylabel in ((ax_speed, "tokens/s (forward + backward)"), (ax_mem, result["memory"])):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(UNITS[dim])
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    others = ", ".join(f"{k}={v}" for k, v in result["base"].items() if k != dim)
    fig.suptitle(f"One layer, float32, {others}; {machine['device']} ({machine['cpu']}, {machine['threads']} threads), "
                 f"torch {machine['torch']}", fontsize=9)
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"scaling_{device}_{dim}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
