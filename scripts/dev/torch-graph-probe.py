#!/usr/bin/env python3
"""CUDA graph capture begun below cachalot_torch's Python guard, allocating inside it: the
allocator itself must refuse with a RuntimeError naming the private pool, and the process must
go on working.

    torch-graph-probe.py ROUTE     (ROUTE: c-global | c-relaxed | graph-unguarded | native)

c-global / c-relaxed: torch._C._CUDAGraph.capture_begin directly, in global or relaxed capture
mode; graph-unguarded: torch.cuda.graph with the guard's patch of CUDAGraph.capture_begin undone
(PyTorch's own context manager, as code that kept a reference to it runs); native: the same
capture on PyTorch's allocator (it succeeds). Prints one JSON line: what the allocation did,
whether capture_end raised, and whether the process still computes afterwards.
"""
import faulthandler
import json
import sys

faulthandler.enable()
route = sys.argv[1]
import torch  # noqa: E402  (CUDA is not initialized by the import)

# PyTorch's own CUDAGraph.capture_begin, as code that took a reference to it before
# cachalot_torch.enable() replaced it with the guard still calls it.
unguarded_capture_begin = torch.cuda.CUDAGraph.capture_begin
if route != "native":
    import cachalot_torch
    cachalot_torch.enable()

result = {"route": route}
a = torch.ones(1024, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
g = torch.cuda.CUDAGraph()
try:
    if route.startswith("c-") or route == "native":
        with torch.cuda.stream(s):
            mode = "relaxed" if route == "c-relaxed" else "global"
            torch._C._CUDAGraph.capture_begin(g, pool=None, capture_error_mode=mode)
            try:
                b = a * 2
                result["allocation"] = "served"
            except RuntimeError as e:
                result["allocation"] = "RuntimeError: " + str(e).splitlines()[0][:300]
            try:
                torch._C._CUDAGraph.capture_end(g)
                result["capture_end"] = "ok"
            except RuntimeError as e:
                result["capture_end"] = "RuntimeError: " + str(e).splitlines()[0][:200]
    else:
        torch.cuda.CUDAGraph.capture_begin = unguarded_capture_begin  # undo the guard
        try:
            with torch.cuda.graph(g):
                b = a * 2
            result["allocation"] = "served"
        except RuntimeError as e:
            result["allocation"] = "RuntimeError: " + str(e).splitlines()[0][:300]
except RuntimeError as e:
    result["capture_begin"] = "RuntimeError: " + str(e).splitlines()[0][:300]
torch.cuda.current_stream().wait_stream(s)
x = torch.ones(1 << 20, device="cuda") * 3
torch.cuda.synchronize()
result["after"] = f"computes: sum {x.sum().item():.0f}"
if route != "native":
    result["allocator_consistent"] = cachalot_torch._native.check_consistency(0) is None
print(json.dumps(result), flush=True)
