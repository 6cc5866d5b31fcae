"""``lltm-bench``: the speed and memory figures of BENCHMARKS.md, each measured beside what a user would pick instead.

Layers (default): forward + backward of one layer over a whole sequence (tokens = T x B), for each cell
(``--cells``, default lltm, lstm and gru): PyTorch's own layer (``torch.nn.LSTM`` for the LLTM and the
LSTM, ``torch.nn.GRU`` for the GRU: cuDNN on a GPU, oneDNN/ATen on a CPU), the python backend (input
projection hoisted, time loop in Python) and the fused backend (``cpp`` or ``cuda``); the seed cell (one
step) against ``torch.nn.LSTMCell``/``GRUCell``; peak memory on a GPU. Before timing a configuration it
checks the fused backend against the python one on the same inputs and stops if they differ.

Inference (``--inference``): one layer's forward alone: as training runs it, under ``torch.no_grad()``
(nothing kept for a backward) and PyTorch's layer under ``torch.no_grad()`` (bench_inference.py).

Training (``--training``): the default job's model (CharLM, embedding 64, 1 x 256, T = 128, B = 64,
AdamW, clipping) in a bare loop (a fixed batch, no framework) and through ``lltm-train`` (Lightning, the
Shakespeare data, logging, checkpoints), with the LLTM and with an ``nn.LSTM`` of the same width; tokens/s
of each and the ratios the targets name.

GPU times come from CUDA events after warm-up, CPU times from ``time.perf_counter``; each figure is the
median of ``--repeats`` timings, every contender measured in the same process on the same data. On a CPU
the process first takes the malloc settings that ``lltm-train`` gives a CPU run (``host_memory.py``: freed
blocks stay in the process), for every contender alike.

    lltm-bench --device cpu                      # cpu-S, cpu-M and the seed cell, every cell
    lltm-bench --device cuda --dtype bfloat16 --cells lstm,gru --json bench.json
    lltm-bench --device cuda --dtype best --configs gpu-S,gpu-M,gpu-L,gpu-XL   # each in its fastest dtype
    lltm-bench --training --device cuda --steps 300 --repeats 3   # medians of 3 alternated lltm-train runs
    lltm-bench --inference --device cuda --dtype bfloat16   # forward only: training's, no_grad's, cuDNN's
    lltm-bench --sweep T --plot plots/           # tokens/s and memory against T (or B, H): bench_sweep.py
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .backends import resolve_backend
from .functional import rnn_cell, rnn_layer
from .host_memory import keep_freed_memory
from .ops.cells import CELLS, LLTM, CellSpec

CONFIGS = {  # name: (T, B, input_size, hidden_size)
    "seed-cell": (1, 16, 32, 128),
    "gpu-S": (512, 32, 64, 128),
    "gpu-M": (128, 64, 256, 512),
    "gpu-L": (256, 128, 1024, 1024),
    "gpu-XL": (128, 256, 1024, 2048),
    "cpu-S": (128, 32, 64, 128),
    "cpu-M": (64, 64, 256, 512),
}
DEFAULTS = {"cpu": ["seed-cell", "cpu-S", "cpu-M"], "cuda": ["seed-cell", "gpu-S", "gpu-M", "gpu-L"]}


def _timer(device: torch.device) -> Callable[[Callable[[], None], int], float]:
    """Returns time(fn, n): seconds per call of fn, over n back-to-back calls."""
    if device.type == "cuda":
        def time_cuda(fn, n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000 / n
        return time_cuda

    def time_cpu(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n
    return time_cpu


def measure(fn: Callable[[], None], device: torch.device, repeats: int, calls: int, warmup: int = 3) -> float:
    """Median seconds per call of fn over ``repeats`` timings of ``calls`` calls each, after warm-up."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timer = _timer(device)
    return statistics.median(timer(fn, calls) for _ in range(repeats))


def baseline_label(cell: CellSpec) -> str:
    """PyTorch's layer that a cell is compared with: nn.GRU for the GRU, nn.LSTM for the LSTM and the LLTM."""
    return "nn.GRU" if cell.name == "gru" else "nn.LSTM"


def _weights(cell: CellSpec, I: int, H: int, **kw) -> list[torch.Tensor]:
    """weight_ih, weight_hh and the cell's biases, random, scaled as a trained layer's would be."""
    G = cell.num_gates
    return [torch.randn(G * H, I, **kw) * I**-0.5, torch.randn(G * H, H, **kw) * H**-0.5,
            *(torch.randn(G * H, **kw) * 0.1 for _ in cell.biases)]


def _contenders(name: str, T: int, B: int, I: int, H: int, device, dtype, backend: str, cell: CellSpec = LLTM):
    """(label, fn) pairs: each fn runs forward + backward once on fresh random inputs made here."""
    kw = dict(device=device, dtype=dtype)
    x = torch.randn(T, B, I, **kw, requires_grad=True)
    weights = [w.requires_grad_() for w in _weights(cell, I, H, **kw)]
    grad = torch.randn(T, B, H, **kw)
    step = name == "seed-cell"

    def ours(be: str):
        if step:
            def run():
                state = rnn_cell(cell, x[0], None, *weights, backend=be)
                torch.autograd.backward(state, (grad[0],) * len(state))
        else:
            def run():
                out, _ = rnn_layer(cell, x, None, *weights, backend=be)
                out.backward(grad)
        return run

    gru = cell.name == "gru"
    module = ((torch.nn.GRUCell if gru else torch.nn.LSTMCell) if step else (torch.nn.GRU if gru else torch.nn.LSTM))
    theirs = module(I, H).to(**kw)

    def run_theirs():
        if step:
            state = theirs(x[0])
            state = state if isinstance(state, tuple) else (state,)
            torch.autograd.backward(state, (grad[0],) * len(state))
        else:
            out, _ = theirs(x)
            out.backward(grad)

    return [(baseline_label(cell), run_theirs), ("python", ours("python")), (backend, ours(backend))]


def check_against_python(T, B, I, H, device, dtype, backend: str, cell: CellSpec = LLTM) -> float:
    """How far the backend's outputs and gradients are from the python backend's: the largest relative
    difference (norm) in float32. In 16-bit dtypes both backends round differently, so each is measured
    against a float64 run and the backend's error is returned relative to python's (<= 1 when it is no
    worse)."""
    torch.manual_seed(0)
    kw = dict(device=device, dtype=dtype)
    leaves = [torch.randn(T, B, I, **kw), *_weights(cell, I, H, **kw)]

    def results(be, leaf_dtype):
        ls = [t.to(leaf_dtype).requires_grad_() for t in leaves]
        out, state = rnn_layer(cell, ls[0], None, *ls[1:], backend=be)
        loss = out.float().square().mean() + state[-1].float().mean()
        return [t.detach().double() for t in (out, *state, *torch.autograd.grad(loss, ls))]

    def error(got, want):
        return max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(got, want))

    if dtype == torch.float32:
        return error(results(backend, dtype), results("python", dtype))
    exact = results("python", torch.float64)
    return error(results(backend, dtype), exact) / max(error(results("python", dtype), exact), 1e-30)


def peak_memory_mib(fn: Callable[[], None], device) -> float:
    """Peak CUDA memory one call of fn allocates beyond what was allocated before it, MiB."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def compiled_backend(device: torch.device) -> str:
    """The fused backend for the device (cpp or cuda); exits with the reason when it is not built here."""
    backend = resolve_backend("auto", device.type)
    if backend == "python":
        raise SystemExit(f"lltm-bench: the compiled backend for {device.type} is not available here")
    return backend


def run_layers(configs: list[str], device: torch.device, dtype: torch.dtype, repeats: int,
               cells: list[CellSpec]) -> list[dict]:
    backend = compiled_backend(device)
    # float32: the relative difference from python; 16-bit: the error against float64, as a multiple of python's
    # in the same dtype
    tol = 1e-3 if dtype == torch.float32 else 1.5
    rows = []
    for name in configs:
        T, B, I, H = CONFIGS[name]
        for cell in cells:
            err = check_against_python(min(T, 64), B, I, H, device, dtype, backend, cell)
            if not err < tol:
                what = "relative difference" if dtype == torch.float32 else "error against float64, times python's,"
                raise SystemExit(f"lltm-bench: {backend} differs from python on {name} ({cell.name}): {what} "
                                 f"{err:.2e} > {tol}")
            calls = 50 if name == "seed-cell" else 1 if T * H >= 256 * 1024 and device.type == "cpu" else 3
            baseline = baseline_label(cell)
            row = {"config": name, "cell": cell.name, "T": T, "B": B, "input_size": I, "hidden_size": H,
                   "baseline": baseline, "backend": backend, "check_rel_err": err, "seconds": {}, "tokens_per_s": {}}
            for label, fn in _contenders(name, T, B, I, H, device, dtype, backend, cell):
                sec = measure(fn, device, repeats, calls)
                row["seconds"][label] = sec
                row["tokens_per_s"][label] = T * B / sec
                if device.type == "cuda":
                    row.setdefault("peak_mib", {})[label] = peak_memory_mib(fn, device)
            tps = row["tokens_per_s"]
            row["ratio_vs_torch"] = tps[backend] / tps[baseline]
            row["ratio_vs_python"] = tps[backend] / tps["python"]
            rows.append(row)
            print(_format(row), flush=True)
    return rows


def _format(row: dict) -> str:
    backend, baseline = row["backend"], row["baseline"]
    if row["config"] == "seed-cell":
        times = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in row["seconds"].items())
    else:
        times = ", ".join(f"{k} {v / 1e6:.3f} M tok/s" for k, v in row["tokens_per_s"].items())
    mem = ""
    if "peak_mib" in row:
        mem = f"; peak MiB {row['peak_mib'][backend]:.0f} vs {baseline} {row['peak_mib'][baseline]:.0f}"
    return (f"{row['config']:>9} {row['cell']:>4} (T={row['T']}, B={row['B']}, I={row['input_size']}, "
            f"H={row['hidden_size']}): {times}; {backend}/{baseline} {row['ratio_vs_torch']:.2f}x, "
            f"{backend}/python {row['ratio_vs_python']:.2f}x{mem}")


def _machine(device: torch.device, args) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu, "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": args.dtype,
            "repeats": args.repeats}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lltm-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--configs", help=f"comma-separated, from {', '.join(CONFIGS)} (default: by device)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "best"], default="float32",
                        help="best: every layer in each dtype, credited with its fastest (bench_best.py)")
    parser.add_argument("--cells", default=",".join(CELLS), help="comma-separated cells to time (default: all)")
    parser.add_argument("--repeats", type=int, help="timings per figure, the median reported (default 5); with "
                        "--training, alternated lltm-train runs per figure (default 1)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--training", action="store_true", help="the training figures instead of the layer ones")
    parser.add_argument("--steps", type=int, help="training steps per run with --training (at least 50; default 300)")
    parser.add_argument("--inference", action="store_true", help="forward only: as training runs it, under "
                        "torch.no_grad() (nothing saved) and PyTorch's layer (bench_inference.py)")
    parser.add_argument("--jit", action="store_true", help="the default model's forward as eager, TorchScript, "
                        "torch.compile and torch.export (batch 1 and 64)")
    parser.add_argument("--sweep", choices=["T", "B", "H"], help="one layer's tokens/s and memory against the "
                        "sequence length, batch or hidden size (lltm_train/bench_sweep.py)")
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
    machine = {**_machine(device, args), "keep_freed_memory": kept}
    print(f"lltm-bench: {machine}", flush=True)
    if args.sweep:
        from .bench_sweep import plot_sweep, run_sweep

        results = run_sweep(args.sweep, device, args.repeats, sorted(values) if values else None)
        if args.plot and results["points"]:
            print(f"lltm-bench: wrote {plot_sweep(results, machine, args.plot)}", flush=True)
    elif args.jit:
        from .bench_jit import run_jit

        results = run_jit(device, args.repeats)
    elif args.training:
        from .bench_training import run_training

        results = run_training(device, args.steps or 300, args.repeats)
    elif args.inference:
        from .bench_inference import run_inference

        results = run_inference(configs, device, getattr(torch, args.dtype), args.repeats, [CELLS[c] for c in cells])
    elif args.dtype == "best":
        from .bench_best import run_best

        results = run_best(configs, device, args.repeats, [CELLS[c] for c in cells])
    else:
        results = run_layers(configs, device, getattr(torch, args.dtype), args.repeats, [CELLS[c] for c in cells])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "command": " ".join(["lltm-bench", *sys.argv[1:]]), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
