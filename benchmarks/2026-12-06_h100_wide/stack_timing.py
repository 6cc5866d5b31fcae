"""Stacks with and without their extra CUDA streams, side by side: forward + backward of lltm_train.nn's module,
CUDA-event medians after warm-up, alternated twice. The directions of a bidirectional layer on two streams
(lltm_train/nn/rnn.py, _side_stream) and the wavefront of one-direction stacks (lltm_train/nn/_wavefront.py,
layer_streams; on main since session 25, which timed it as a patch).
    python stack_timing.py OUT.jsonl [cell:H:B:T:layers:bi:dtype,...] [--captured] [--min-width=N]
Default: gpu-S sizes (B 32, T 512, I 64) at H 128 and 512, 3 layers and 2 layers bidirectional, GRU and LSTM.
--captured: each forward + backward captured once in a CUDA graph (as the captured training step does) and its
replays timed, so that no host time counts (a row's "captured": true).
--min-width=N: the wavefront from width N a head (lltm_train.nn._wavefront.MIN_WIDTH; a row's "min_width")."""
import json
import statistics
import sys

import torch

import lltm_train.nn._wavefront as wavefront
import lltm_train.nn.rnn as rnn
from lltm_train.nn import recurrent_layers

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT = ",".join(f"{c}:{h}:32:512:{lb}:{dt}" for c in ("gru", "lstm") for h in (128, 512)
                   for lb in ("3:0", "2:1") for dt in ("bf16", "fp32"))
ONE = {"_side_stream": lambda t: None, "layer_streams": lambda layers, t: None}
MANY = {name: getattr(rnn, name) for name in ONE if hasattr(rnn, name)}
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True


def tokens_per_s(step, T, B):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 3e3)
    return T * B / statistics.median(times)


POOL_MIB = []  # the memory each capture reserved (its graph's private pool), MiB


def captured(step):
    """step's work captured in a CUDA graph after an eager warm-up on a side stream: its replay (the memory the
    capture reserved appended to POOL_MIB)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    POOL_MIB.append(round((torch.cuda.memory_reserved() - reserved) / 2**20, 1))
    return graph.replay


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    for a in sys.argv[1:]:
        if a.startswith("--min-width="):
            wavefront.MIN_WIDTH = int(a.split("=")[1])
    capture = captured if "--captured" in sys.argv else (lambda step: step)
    out = open(args[0], "a")
    for spec in (args[1] if len(args) > 1 else DEFAULT).split(","):
        cell, H, B, T, L, bi, dt = spec.split(":")
        H, B, T, L, bi, dt = int(H), int(B), int(T), int(L), bool(int(bi)), DT[dt]
        torch.manual_seed(0)
        m = recurrent_layers(cell, 64, H, num_layers=L, bidirectional=bi, backend="cuda").to("cuda", dt)
        theirs = getattr(torch.nn, {"gru": "GRU", "lstm": "LSTM"}[cell])(64, H, num_layers=L, bidirectional=bi).to("cuda", dt)
        x = torch.randn(T, B, 64, device="cuda", dtype=dt, requires_grad=True)
        g = torch.randn(T, B, H * (2 if bi else 1), device="cuda", dtype=dt)

        def ours():
            o, _ = m(x)
            o.backward(g)

        def cudnn():
            o, _ = theirs(x)
            o.backward(g)

        row = {"cell": cell, "H": H, "B": B, "T": T, "layers": L, "bidirectional": bi, "dtype": str(dt)[6:],
               "captured": capture is captured,
               "min_width": wavefront.MIN_WIDTH, "M_tok_s": {}}
        for label, patch in (("streams", MANY), ("one stream", ONE)) * 2:
            for name, fn in patch.items():
                setattr(rnn, name, fn)
            row["M_tok_s"].setdefault(label, []).append(round(tokens_per_s(capture(ours), T, B) / 1e6, 3))
            if POOL_MIB:  # the warm-up's and the graph's memory, reserved by this capture
                row.setdefault("capture_reserved_MiB", {}).setdefault(label, []).append(POOL_MIB.pop())
        for name, fn in MANY.items():
            setattr(rnn, name, fn)
        try:
            theirs_step = capture(cudnn)
        except RuntimeError as e:  # cuDNN's layer not capturable here: timed eagerly, and said so
            torch.cuda.synchronize()
            theirs_step, row["cuDNN not captured"] = cudnn, str(e).splitlines()[0]
        row["M_tok_s"]["nn (cuDNN)"] = [round(tokens_per_s(theirs_step, T, B) / 1e6, 3)]
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()
