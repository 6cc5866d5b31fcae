# Runs two forward + backward calls of each spec ("cell:H:B:dtype", comma-separated) on a build with
# probes_clock64.patch applied: the kernels print their TIMING lines (the second call's are the steady ones).
import sys, torch
from kernel_profile import make_step
for spec in sys.argv[1].split(","):
    step = make_step(spec)[-1]
    print(f"=== {spec}", flush=True)
    for i in range(2):
        step(); torch.cuda.synchronize()
        print(f"--- call {i}", flush=True)
