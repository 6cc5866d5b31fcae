import sys, torch
from lltm_train.functional import rnn_layer
from lltm_train.ops.cells import CELLS
DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
for spec in sys.argv[1].split(","):
    cellname, H, B, dt = spec.split(":"); H, B, dt = int(H), int(B), DT[dt]
    cell = CELLS[cellname]; T, I = 1024, 768; G = cell.num_gates; dev = "cuda"
    torch.manual_seed(0)
    x = torch.randn(T, B, I, device=dev, dtype=dt, requires_grad=True)
    st = tuple(torch.zeros(B, H, device=dev, dtype=dt) for _ in cell.states)
    w_ih = (torch.randn(G*H, I, device=dev) * I**-0.5).to(dt).requires_grad_()
    w_hh = (torch.randn(G*H, H, device=dev) * H**-0.5).to(dt).requires_grad_()
    bs = [torch.zeros(G*H, device=dev, dtype=dt, requires_grad=True) for _ in range(2)]
    print(f"=== {spec}", flush=True)
    for i in range(2):
        o, s = rnn_layer(cell, x, st, w_ih, w_hh, *bs, backend="cuda")
        o.float().sum().backward()
        torch.cuda.synchronize()
        print(f"--- call {i}", flush=True)
