"""``lltm-bench``: the speed and memory figures of BENCHMARKS.md, each measured beside what a user would pick instead.

Layers (default; layers.py): forward + backward of one layer over a whole sequence (tokens = T x B), for each
cell (``--cells``, default every cell of :data:`lltm_train.ops.cells.CELLS`): PyTorch's own layer (the
cell's main baseline, ``CellSpec.baselines``: ``torch.nn.LSTM`` for the LLTM and the LSTM, ``torch.nn.GRU``
for the GRU: cuDNN on a GPU, oneDNN/ATen on a CPU), the python backend (input projection hoisted, time loop
in Python) and the fused backend (``cpp`` or ``cuda``); the seed cell (one step) against the baseline's
``torch.nn`` cell (``torch.nn.LSTMCell``/``GRUCell``); peak memory on a GPU. Before timing a configuration
it checks the fused backend against the python one on the same inputs and stops if they differ.

Inference (``--inference``): one layer's forward alone: as training runs it, under ``torch.no_grad()``
(nothing kept for a backward) and PyTorch's layer under ``torch.no_grad()`` (inference.py).

Training (``--training``, training.py): the default job's model (CharLM, embedding 64, 1 x 256, T = 128,
B = 64, AdamW, clipping) in a bare loop (a fixed batch, no framework) and through ``lltm-train`` (Lightning,
the Shakespeare data, logging, checkpoints), with each cell (on a CPU the LLTM and the LSTM) and with
PyTorch's layer of the same cell and width where it has one (``nn.LSTM``, ...); tokens/s of each and the
ratios the targets name.

GPU times come from CUDA events after warm-up, CPU times from ``time.perf_counter``; each figure is the
median of ``--repeats`` timings, every contender measured in the same process on the same data. On a CPU
the process first takes the malloc settings that ``lltm-train`` gives a CPU run (``host_memory.py``: freed
blocks stay in the process), for every contender alike.

    lltm-bench --device cpu                      # cpu-S, cpu-M and the seed cell, every cell
    lltm-bench --device cuda --dtype bfloat16 --cells lstm,gru --json bench.json
    lltm-bench --device cuda --dtype best --configs gpu-S,gpu-M,gpu-L,gpu-XL   # each in its fastest dtype
    lltm-bench --training --device cuda --steps 300 --repeats 3   # medians of 3 alternated lltm-train runs
    lltm-bench --inference --device cuda --dtype bfloat16   # forward only: training's, no_grad's, cuDNN's
    lltm-bench --sweep T --plot plots/           # tokens/s and memory against T (or B, H): sweep.py
"""


from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..console import help_text
from ..host_memory import keep_freed_memory
from ..ops.cells import CELLS
from .best import run_best
from .common import CONFIGS, DEFAULTS, describe_machine
from .inference import run_inference
from .jit import run_jit
from .layers import run_layers
from .sweep import plot_sweep, run_sweep
from .training import run_training


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lltm-bench", description=help_text(__doc__.split("\n\n")[0]))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--configs", help=f"comma-separated, from {', '.join(CONFIGS)} (default: by device)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "best"], default="float32",
                        help="best: every layer in each dtype, credited with its fastest (lltm_train/bench/best.py)")
    parser.add_argument("--cells", default=",".join(CELLS), help="comma-separated cells to time (default: all)")
    parser.add_argument("--num-heads", type=int, default=1, help="heads of the layers' recurrence (ours and FlashRNN's; "
                        "PyTorch's layer runs the dense width): it must divide every config's hidden size")
    parser.add_argument("--num-layers", type=int, default=1, help="stacked layers (ours: lltm_train.nn's module; PyTorch's "
                        "layer the same; no FlashRNN), with the layer figures")
    parser.add_argument("--bidirectional", action="store_true", help="both directions in every layer (as --num-layers)")
    parser.add_argument("--repeats", type=int, help="timings per figure, the median reported (default 5); with "
                        "--training, alternated lltm-train runs per figure (default 1)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--training", action="store_true", help="the training figures instead of the layer ones")
    parser.add_argument("--steps", type=int, help="training steps per run with --training (at least 50; default 300)")
    parser.add_argument("--inference", action="store_true", help="forward only: as training runs it, under "
                        "torch.no_grad() (nothing saved) and PyTorch's layer (lltm_train/bench/inference.py)")
    parser.add_argument("--jit", action="store_true", help="the default model's forward as eager, TorchScript, "
                        "torch.compile and torch.export (batch 1 and 64)")
    parser.add_argument("--sweep", choices=["T", "B", "H"], help="one layer's tokens/s and memory against the "
                        "sequence length, batch or hidden size (lltm_train/bench/sweep.py)")
    parser.add_argument("--values", help="with --sweep: comma-separated sizes (default: by device)")
    parser.add_argument("--plot", metavar="DIR", help="with --sweep: write the plot scaling_<device>_<dim>.png here")
    parser.add_argument("--json", help="write the raw figures and the machine to this file")
    args = parser.parse_args(argv)
    configs = args.configs.split(",") if args.configs is not None else DEFAULTS[args.device]
    if args.dtype == "best" and args.configs is None:
        configs = [c for c in configs if c != "seed-cell"]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown config {unknown[0]!r}; choose from {', '.join(CONFIGS)}")
    cells = args.cells.split(",")
    unknown = [c for c in cells if c not in CELLS]
    if unknown or not cells:
        parser.error(f"--cells: unknown cell {unknown[0] if unknown else ''!r}; choose from {', '.join(CELLS)}")
    no_baseline = [c for c in cells if not CELLS[c].baselines]
    if no_baseline and not (args.training or args.jit or args.sweep):
        parser.error(f"--cells: the {no_baseline[0]} cell names no torch.nn layer to be timed against (CellSpec.baselines)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    if (args.values is not None or args.plot) and not args.sweep:
        parser.error("--values and --plot go with --sweep")
    if args.inference and (args.jit or args.training or args.sweep or args.dtype == "best"):
        parser.error("--inference times layers in one dtype: it does not go with --jit, --training, --sweep or "
                     "--dtype best")
    if args.inference and "seed-cell" in configs:
        if args.configs is not None:
            parser.error("--inference times whole layers: the seed cell has no inference row")
        configs = [c for c in configs if c != "seed-cell"]
    if args.sweep and (args.jit or args.training or args.configs or args.dtype != "float32"):
        parser.error("--sweep times float32 layers: it does not go with --jit, --training, --configs or --dtype")
    if args.num_heads != 1:
        if args.num_heads < 1:
            parser.error("--num-heads must be at least 1")
        if args.jit or args.training or args.sweep:
            parser.error("--num-heads goes with the layer figures (default, --dtype best, --inference)")
        uneven = [c for c in configs if CONFIGS[c][3] % args.num_heads]
        if uneven:
            parser.error(f"--num-heads {args.num_heads} does not divide the hidden size of {uneven[0]} "
                         f"({CONFIGS[uneven[0]][3]})")
    if args.num_layers != 1 or args.bidirectional:
        if args.num_layers < 1:
            parser.error("--num-layers must be at least 1")
        if args.jit or args.training or args.sweep or args.inference:
            parser.error("--num-layers and --bidirectional go with the layer figures (default, --dtype best)")
        if "seed-cell" in configs:
            parser.error("--num-layers and --bidirectional time whole layers: the seed cell is one step of one layer")
    if args.dtype == "best" and (args.jit or args.training):
        parser.error("--dtype best times layers: it does not go with --jit or --training")
    if args.dtype == "best" and "seed-cell" in configs:
        parser.error("--dtype best times whole layers: the seed cell has no best-dtype row")
    if args.jit and args.training:
        parser.error("--jit and --training are separate runs")
    try:
        values = [int(v) for v in args.values.split(",")] if args.values is not None else None
    except ValueError:
        parser.error(f"--values: comma-separated whole numbers, not {args.values!r}")
    if values is not None and (not values or min(values) < 1 or len(set(values)) != len(values)):
        parser.error("--values: distinct sizes of at least 1")
    if args.plot:
        try:
            Path(args.plot).mkdir(parents=True, exist_ok=True)
            probe = Path(args.plot) / ".lltm-bench-probe"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            parser.error(f"--plot: cannot write into {args.plot}: {exc.strerror or exc}")
    # --training's figure is the pace after the first logging window (25 steps, the set-up's): two windows at least
    if args.steps is not None and not args.training:
        parser.error("--steps goes with --training (the layer figures time a fixed number of calls: --repeats)")
    if args.repeats is None:
        args.repeats = 1 if args.training else 5
    if args.repeats < 1 or (args.steps or 300) < 50 or (args.threads is not None and args.threads < 1):
        parser.error("--repeats and --threads must be at least 1, --steps at least 50 (the training figure is the "
                     "pace after the first 25-step logging window)")
    if args.json:
        try:
            open(args.json, "a").close()  # find an unwritable path now, not after the whole benchmark
        except OSError as exc:
            parser.error(f"--json: cannot write {args.json}: {exc}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":  # TF32 for every contender alike
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    # On a CPU, every contender with the malloc settings lltm-train gives a CPU run (lltm_train.host_memory):
    # nn.LSTM at cpu-M ran 1.12x-1.27x faster with them (2026-12-03), ours about 1.0x.
    kept = keep_freed_memory() if device.type == "cpu" else False
    machine = {**describe_machine(device, args.dtype, args.repeats), "keep_freed_memory": kept}
    print(f"lltm-bench: {machine}", flush=True)
    if args.sweep:
        results = run_sweep(args.sweep, device, args.repeats, sorted(values) if values else None)
        if args.plot and results["points"]:
            print(f"lltm-bench: wrote {plot_sweep(results, machine, args.plot)}", flush=True)
    elif args.jit:
        results = run_jit(device, args.repeats)
    elif args.training:
        results = run_training(device, args.steps or 300, args.repeats)
    elif args.inference:
        results = run_inference(configs, device, getattr(torch, args.dtype), args.repeats, [CELLS[c] for c in cells],
                                args.num_heads)
    elif args.dtype == "best":
        results = run_best(configs, device, args.repeats, [CELLS[c] for c in cells], args.num_heads, args.num_layers,
                           args.bidirectional)
    else:
        results = run_layers(configs, device, getattr(torch, args.dtype), args.repeats, [CELLS[c] for c in cells],
                             args.num_heads, args.num_layers, args.bidirectional)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "command": " ".join(["lltm-bench", *sys.argv[1:]]), "results": results}, f, indent=1)

