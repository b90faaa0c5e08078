#!/usr/bin/env python3
"""What a pluggable allocator must get right besides the bytes, checked on the GPU.

    torch-features.py MODE     (MODE: native | cachalot | cachalot-nohook)

1. Cross-stream safety: x is read on a side stream by a kernel queued behind a 0.3 s sleep;
   x.record_stream(side); del x; a tensor of the same size is made and overwritten on the
   current stream at once, while the side stream is still busy. PASS when it did not get x's
   memory and the side stream read x's values. cachalot-nohook installs cachalot without the record_stream hook: the check must FAIL
   there (it shows what the hook prevents).
2. OOM: torch.OutOfMemoryError with PyTorch's message; on cachalot, snapshot_on_oom writes a
   snapshot that pickle loads.
3. torch.cuda's memory functions equal cachalot_torch's (the patch), empty_cache releases.
4. CUDA graph capture: captured into the graph's private pool, and a replay on new input computes
   the new result (cachalot-nohook too: the pool hooks do not depend on the record_stream hook).
Prints the results so far as one JSON line after each.
"""
import faulthandler
import json
import os
import pickle
import sys
import tempfile

# A hang shows where it is.
faulthandler.enable()
faulthandler.dump_traceback_later(100, exit=True)

mode = sys.argv[1]
oom_path = os.path.join(tempfile.mkdtemp(), "oom.pickle")
if mode.startswith("cachalot"):
    import cachalot_torch
    cachalot_torch.enable(snapshot_on_oom=oom_path, _record_stream_hook=(mode != "cachalot-nohook"))
import torch  # noqa: E402

result = {"mode": mode}
torch.zeros(1, device="cuda")

def report():
    # After every section: a crash in a later one leaves what was found so far.
    print(json.dumps(result), flush=True)


# 1. Cross-stream safety. The kernels run once first: a first launch loads its module (CUDA's
# lazy loading), which may wait for the device and would let the side stream finish early.
side = torch.cuda.Stream()
n = 16 << 20
for _ in range(2):
    x = torch.full((n,), 1.0, device="cuda")
    address = x.data_ptr()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(600_000_000)  # about 0.3 s of GPU clock cycles
        y = x * 2
    x.record_stream(side)
    del x
    z = torch.empty(n, device="cuda")
    z.fill_(7.0)
    side_busy = not side.query()
    reused = z.data_ptr() == address
    torch.cuda.synchronize()
    read_right = bool((y == 2).all())
    del y, z
verdict = "PASS" if (not reused and read_right) else "FAIL"
result["record_stream"] = {"side_stream_busy_when_reallocating": side_busy, "reused_before_side_stream_done": reused,
                           "side_stream_read_x": read_right, "verdict": verdict if side_busy else "INVALID (side stream done)"}
report()

# 2. OOM.
total = torch.cuda.get_device_properties(0).total_memory
try:
    torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    result["oom"] = "no error"
except torch.OutOfMemoryError as e:
    result["oom"] = "torch.OutOfMemoryError: " + str(e)
if mode.startswith("cachalot"):
    try:
        with open(oom_path, "rb") as f:
            snap = pickle.load(f)
        result["snapshot_on_oom"] = f"{len(snap['segments'])} segments, {sum(map(len, snap['device_traces']))} trace entries"
    except OSError as e:
        result["snapshot_on_oom"] = f"missing: {e}"
report()

# 3. torch.cuda's functions.
keep = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
before = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
if mode.startswith("cachalot"):
    result["torch_cuda_equals_cachalot"] = before == (cachalot_torch.memory_allocated(), cachalot_torch.memory_reserved())
del keep
torch.cuda.empty_cache()
result["empty_cache"] = {"before": before, "after": (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())}
report()

# 4. Graph capture (last: a failure here must not hide the rest).
graph = torch.cuda.CUDAGraph()
a = torch.ones(1024, device="cuda")
try:
    with torch.cuda.graph(graph):
        b = a * 2
    result["graph_capture"] = "captured"
    a.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    result["graph_replay_on_new_input"] = "PASS" if bool((b == 6).all()) else "FAIL"
except RuntimeError as e:
    result["graph_capture"] = "RuntimeError: " + str(e).splitlines()[0][:400]
torch.cuda.synchronize()
print(json.dumps(result))
