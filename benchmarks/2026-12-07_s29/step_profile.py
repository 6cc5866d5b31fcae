"""psMNIST's training step outside Lightning, kernel by kernel: SequenceClassifier (LSTM, 128 units, I 1, T 784,
B 128), cross-entropy, backward, gradient-norm clipping at 1, fused AdamW: what the recipe's step runs (eager, not
captured). For backend cuda and torch (cuDNN) at float32 with TF32, autocast float16 and bfloat16, alternated twice.
Median of 20 steps after 5 of warm-up (CUDA events), then every kernel's device time over 3 steps (torch.profiler).
    python3 step_profile.py OUT.jsonl [B]
STEP_BACKENDS (default "cuda,torch") and STEP_PRECISIONS (default "32-true,16-mixed,bf16-mixed") narrow the runs;
STEP_TREE names the tree in each row (for A/B runs of two builds); STEP_GRAPH=1 times the step captured in one CUDA graph
(as Lightning runs it: model.cuda_graph, capturable fused AdamW) and replayed, with no kernel list."""
import json, os, sys
from collections import defaultdict
import torch
from lltm_train.models.sequence import SequenceClassifier

torch.backends.cuda.matmul.allow_tf32 = True  # the recipe's float32_matmul_precision: high
torch.backends.cudnn.allow_tf32 = True
B = int(sys.argv[2]) if len(sys.argv) > 2 else 128
T = 784
GRAPH = os.environ.get("STEP_GRAPH") == "1"


def make(backend, precision):
    torch.manual_seed(0)
    model = SequenceClassifier(1, 10, 128, cell="lstm", backend=backend, forget_bias=1.0).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, fused=True, capturable=GRAPH)
    x = torch.rand(B, T, 1, device="cuda")
    y = torch.randint(0, 10, (B,), device="cuda")
    dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if dtype is torch.float16 else None

    def step():
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward(); scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); scaler.step(opt); scaler.update()
        else:
            loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
    if not GRAPH or scaler is not None:
        return step
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream before the capture, as PyTorch's whole-network recipe
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


out = open(sys.argv[1], "a")
for rnd in (1, 2):
    for precision in os.environ.get("STEP_PRECISIONS", "32-true,16-mixed,bf16-mixed" if not GRAPH else "32-true,bf16-mixed").split(","):
        for backend in os.environ.get("STEP_BACKENDS", "cuda,torch").split(","):
            step = make(backend, precision)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            ts = []
            for _ in range(20):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); step(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
            ts.sort()
            row = {"tree": os.environ.get("STEP_TREE", "main"), "round": rnd, "backend": backend, "precision": precision, "B": B, "graph": GRAPH, "median_ms": round(ts[10], 4),
                   "tokens_per_s": round(B * T / ts[10] * 1e3)}
            if rnd == 1 and not GRAPH:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        step()
                    torch.cuda.synchronize()
                agg, n = defaultdict(float), 0
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        agg[e.name[:70]] += e.device_time / 3
                        n += 1
                row["kernels_us"] = round(sum(agg.values()), 1)
                row["launches"] = n / 3
                row["top"] = {k: round(v, 1) for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:14]}
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n"); out.flush()
