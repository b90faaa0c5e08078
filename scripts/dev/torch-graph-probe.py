#!/usr/bin/env python3
"""A CUDA graph capture begun below the Python guard of cachalot_torch (torch._C._CUDAGraph
directly), allocating inside it: what happens. `torch-graph-probe.py --shim` installs with the C++
shim, without it through CUDAPluggableAllocator (alloc and free only). On the H100 (PyTorch 2.11)
the --shim run ended with a segmentation fault after "capture began" (bindings/torch/README.md)."""
import sys, faulthandler
faulthandler.enable()
import cachalot_torch, torch
cachalot_torch.enable(shim="--shim" in sys.argv)
a = torch.ones(4, device="cuda")
s = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
print("capture via torch._C._CUDAGraph.capture_begin (skipping the Python guard)", flush=True)
with torch.cuda.stream(s):
    torch._C._CUDAGraph.capture_begin(g, pool=None, capture_error_mode="global")
    print("capture began", flush=True)
    try:
        b = a * 2
        print("allocated during capture", flush=True)
    except RuntimeError as e:
        print("raised", type(e).__name__, str(e).splitlines()[0][:300], flush=True)
    try:
        torch._C._CUDAGraph.capture_end(g)
        print("capture ended", flush=True)
    except RuntimeError as e:
        print("capture_end raised", str(e).splitlines()[0][:200], flush=True)
x = torch.ones(8, device="cuda") * 3
torch.cuda.synchronize()
print("after: usable", x.sum().item(), flush=True)
