"""Where the persistent kernels stop paying: tokens/s of the persistent path and of the stepped one against
the batch size, per cell, dtype and hidden size (forward + backward of one layer, T = 128, I = H, CUDA
events, median of 5). ``csrc/lltm_cuda_persistent.cu``'s ``max_waves`` comes from these figures.

    python scripts/persistent_waves.py --json waves.json          # needs a GPU of compute capability 9.0

Each path runs in its own process (LLTM_CUDA_PATH is read once per process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

GRID = [  # (dtype, hidden_size, batch sizes)
    ("bfloat16", 128, [64, 256, 512, 1024, 2048]),
    ("bfloat16", 256, [64, 128, 256, 512, 1024]),
    ("bfloat16", 512, [32, 56, 64, 96, 128]),
    ("float32", 256, [64, 128, 256, 512, 1024]),
]


def _measure(cells: list[str]) -> list[dict]:
    import torch

    from lltm_train.bench.common import measure
    from lltm_train.functional import rnn_layer
    from lltm_train.ops.cells import CELLS

    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    for dtype_name, H, batches in GRID:
        dtype = getattr(torch, dtype_name)
        for B in batches:
            for name in cells:
                cell, T = CELLS[name], 128
                kw = dict(device="cuda", dtype=dtype)
                x = torch.randn(T, B, H, **kw, requires_grad=True)
                G = cell.num_gates
                weights = [(torch.randn(G * H, H, **kw) * H**-0.5).requires_grad_() for _ in range(2)]
                biases = [torch.zeros(G * H, **kw, requires_grad=True) for _ in cell.biases]
                grad = torch.randn(T, B, H, **kw)

                def run():
                    out, _ = rnn_layer(cell, x, None, *weights, *biases, backend="cuda")
                    out.backward(grad)

                sec = measure(run, torch.device("cuda"), repeats=5, calls=3)
                rows.append({"cell": name, "dtype": dtype_name, "hidden_size": H, "B": B, "tokens_per_s": T * B / sec})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default="lltm,lstm,gru")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cells = args.cells.split(",")
    if args.child:
        print(json.dumps(_measure(cells)))
        return
    figures = {}
    for path in ("stepped", "persistent"):
        out = subprocess.run([sys.executable, __file__, "--child", "--cells", args.cells], check=True, text=True,
                             capture_output=True, env={**os.environ, "LLTM_CUDA_PATH": path}).stdout
        figures[path] = json.loads(out.strip().splitlines()[-1])
    print("| cell | dtype | H | B | stepped M tok/s | persistent | persistent / stepped |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s, p in zip(figures["stepped"], figures["persistent"]):
        print(f"| {s['cell']} | {s['dtype']} | {s['hidden_size']} | {s['B']} | {s['tokens_per_s'] / 1e6:.2f} | "
              f"{p['tokens_per_s'] / 1e6:.2f} | {p['tokens_per_s'] / s['tokens_per_s']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
