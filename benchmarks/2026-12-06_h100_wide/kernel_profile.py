import sys, json, torch
from collections import defaultdict
from lltm_train.functional import rnn_layer
from lltm_train.ops.cells import CELLS
DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def make_step(spec):
    """spec "cell:H:B:dtype[:T:I]" -> (cell name, H, B, dtype, T, step): step() runs forward + backward of one
    layer; T and I default to FlashRNN's shape (1024, 768); psMNIST's is "lstm:128:128:bf16:784:1"."""
    cellname, H, B, dt, *rest = spec.split(":"); H, B, dt = int(H), int(B), DT[dt]
    T, I = (int(rest[0]), int(rest[1])) if rest else (1024, 768)
    cell = CELLS[cellname]; G = cell.num_gates; dev = "cuda"
    torch.manual_seed(0)
    x = torch.randn(T, B, I, device=dev, dtype=dt, requires_grad=True)
    st = tuple(torch.zeros(B, H, device=dev, dtype=dt) for _ in cell.states)
    w_ih = (torch.randn(G*H, I, device=dev) * I**-0.5).to(dt).requires_grad_()
    w_hh = (torch.randn(G*H, H, device=dev) * H**-0.5).to(dt).requires_grad_()
    bs = [torch.zeros(G*H, device=dev, dtype=dt, requires_grad=True) for _ in cell.biases]
    def step():
        o, s = rnn_layer(cell, x, st, w_ih, w_hh, *bs, backend="cuda")
        o.float().sum().backward()
    return cellname, H, B, dt, T, step


if __name__ == "__main__":
    out = open(sys.argv[1], "a")
    for spec in sys.argv[2].split(","):
        cellname, H, B, dt, T, step = make_step(spec)
        for _ in range(3): step()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ts = []
        for _ in range(5):
            ev[0].record(); step(); ev[1].record(); torch.cuda.synchronize(); ts.append(ev[0].elapsed_time(ev[1]))
        ts.sort()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3): step()
            torch.cuda.synchronize()
        agg, launches = defaultdict(float), defaultdict(int)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                agg[e.name[:60]] += e.device_time / 3
                launches[e.name[:60]] += 1
        top = sorted(agg.items(), key=lambda kv: -kv[1])[:16]
        # all_kernels_us: the device time of every kernel and copy of a call; median_ms minus it is idle time
        # between them (launch gaps, host waits)
        row = {"cell": cellname, "H": H, "B": B, "T": T, "dtype": str(dt), "median_ms": ts[2], "tok_s": T*B/ts[2]*1e3,
               "all_kernels_us": round(sum(agg.values()), 1), "launches_per_call": round(sum(launches.values()) / 3, 1),
               "kernels_us_per_call": {k: round(v, 1) for k, v in top}, "us_per_step": {k[:30]: round(v/T, 3) for k, v in top[:2]}}
        print(json.dumps(row)); out.write(json.dumps(row) + "\n"); out.flush()
