"""Where float32's error over long sequences comes from (issue 41, item 11): for each draw, every output's
relative error against float64 for the cuda backend, the python backend on the same GPU and on the CPU (three
float32 computations that differ only in the order of their sums), beside the draw's conditioning: the error
of float64 itself when every input is perturbed by one float32 rounding (relative 2^-24, random sign), the
least error any float32 computation of the draw can expect.

    python scripts/float32_tail.py --out results.jsonl            (a GPU; TF32 off, LLTM, T 2048, B 4, I 8)
    python scripts/float32_tail.py --batch 1 --tf32 --steps 512   (item 12: B 1 with TF32 allowed)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

from lltm_train.functional import rnn_layer
from lltm_train.ops.cells import CELLS

DEV, OURS = ("cuda", "cuda") if torch.cuda.is_available() else ("cpu", "cpp")  # cpu: a smoke test of the script


def draw_inputs(cell, T, B, I, H, seed, scale):
    """The long-sequence test's inputs (tests/test_cuda.py): weights scale/sqrt(fan-in), biases 0.1, states 0.5,
    the output's incoming gradient 0.01, the final states' 1, all drawn in float64."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * s

    G = cell.num_gates
    p = [rnd(T, B, I), *(rnd(B, H, s=0.5) for _ in cell.states), rnd(G * H, I, s=scale * I**-0.5),
         rnd(G * H, H, s=scale * H**-0.5), *(rnd(G * H, s=0.1) for _ in cell.biases)]
    upstream = [rnd(T, B, H, s=0.01), *(rnd(B, H) for _ in cell.states)]
    return p, upstream


def forward_backward(cell, p, upstream, backend):
    p = [t.detach().clone().requires_grad_() for t in p]
    n = len(cell.states)
    out, state = rnn_layer(cell, p[0], tuple(p[1:1 + n]), *p[1 + n:], backend=backend)
    loss = sum((r * u).sum() for r, u in zip((out, *state), upstream))
    return [t.detach() for t in (out, *state, *torch.autograd.grad(loss, p))]


def errors(got, want):
    return [float((g.double().cpu() - w.cpu()).norm() / w.cpu().norm().clamp_min(1e-300)) for g, w in zip(got, want)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell", default="lltm")
    ap.add_argument("--steps", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--input-size", type=int, default=8)
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--tf32", action="store_true", help="allow TF32 products (float32_matmul_precision high)")
    ap.add_argument("--out", default=None, help="append one JSON line a draw here")
    a = ap.parse_args()
    torch.set_float32_matmul_precision("high" if a.tf32 else "highest")
    cell = CELLS[a.cell]
    names = ["output", *(f"{s}_n" for s in cell.states), "x", *(f"{s}0" for s in cell.states), "w_ih", "w_hh",
             *cell.biases]
    for H in a.hidden:
        ratios = []
        for seed in range(a.seeds):
            p, up = draw_inputs(cell, a.steps, a.batch, a.input_size, H, seed, a.scale)
            p32 = [t.float() for t in p]
            up32 = [t.float() for t in up]
            # float32's values, as float64: the exact answer to the question float32 was asked
            p, up = [t.double().to(DEV) for t in p32], [t.double().to(DEV) for t in up32]
            exact = [t.cpu() for t in forward_backward(cell, p, up, "python")]
            g = torch.Generator(device=DEV).manual_seed(1000 + seed)

            def nudge(t):
                return t * (1 + (torch.rand(t.shape, generator=g, device=DEV, dtype=torch.float64) * 2 - 1) * 2**-24)

            rec = {"H": H, "seed": seed, "T": a.steps, "B": a.batch, "tf32": a.tf32,
                   "conditioning": errors(forward_backward(cell, [nudge(t) for t in p], [nudge(t) for t in up],
                                                           "python"), exact),
                   "cuda": errors(forward_backward(cell, [t.float() for t in p], [t.float() for t in up], OURS), exact),
                   "python_gpu": errors(forward_backward(cell, [t.float() for t in p], [t.float() for t in up],
                                                         "python"), exact),
                   "python_cpu": errors(forward_backward(cell, [t.float().cpu() for t in p],
                                                         [t.float().cpu() for t in up], "python"), exact)}
            worst = max(range(len(names)), key=lambda i: rec["cuda"][i] / max(rec["python_gpu"][i], 1e-300))
            rec["worst"] = names[worst]
            ratios.append(rec["cuda"][worst] / rec["python_gpu"][worst])
            print(f"H {H:4d} seed {seed}: worst cuda/python_gpu {ratios[-1]:7.2f}x at {names[worst]:6s} "
                  f"(cuda {rec['cuda'][worst]:.2e} python_gpu {rec['python_gpu'][worst]:.2e} "
                  f"python_cpu {rec['python_cpu'][worst]:.2e} conditioning {rec['conditioning'][worst]:.2e}); "
                  f"max over outputs cuda/cond {max(c / max(k, 1e-300) for c, k in zip(rec['cuda'], rec['conditioning'])):.1f} "
                  f"python_gpu/cond {max(c / max(k, 1e-300) for c, k in zip(rec['python_gpu'], rec['conditioning'])):.1f} "
                  f"python_cpu/cond {max(c / max(k, 1e-300) for c, k in zip(rec['python_cpu'], rec['conditioning'])):.1f}",
                  flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps({**rec, "names": names}) + "\n")
        print(f"H {H}: worst-output ratio geometric mean {math.exp(statistics.fmean(map(math.log, ratios))):.2f}, "
              f"max {max(ratios):.2f}", flush=True)


if __name__ == "__main__":
    main()
