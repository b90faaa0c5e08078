#!/usr/bin/env python3
"""Python stacks in the memory history, on PyTorch's allocator and on cachalot's, through
PyTorch's own API (on cachalot it is cachalot's, through its patch of torch._C).

    torch-stacks.py MODE OUT.pickle      (MODE: native | cachalot)

Records the history with `_record_memory_history(stacks="python")` (context "all"), runs
`make_activations()` and a few training steps of a small model (backward runs on autograd's own
thread), dumps the snapshot with `_dump_snapshot`, and checks that the alloc entry of
make_activations' tensor names that function and this file in its frames, as PyTorch's do.
Then times the training step (median of 3 x 20 steps, alternating) with the history off, on
without stacks (context=None) and on with stacks: what gathering the stacks costs. Prints one
JSON line.
"""
import json
import pickle
import statistics
import sys
import time

mode, out = sys.argv[1], sys.argv[2]
if mode == "cachalot":
    import cachalot_torch
    cachalot_torch.enable()
import torch  # noqa: E402

torch.manual_seed(0)
torch.zeros(1, device="cuda")
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_activations():
    return torch.empty(3 << 20, dtype=torch.uint8, device="cuda")


def train_step():
    x = torch.randn(256, 512, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


result = {"mode": mode}
torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=100_000)
marker = make_activations()
for _ in range(3):
    train_step()
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(out)
torch.cuda.memory._record_memory_history(enabled=None)

with open(out, "rb") as f:
    snapshot = pickle.load(f)
trace = snapshot["device_traces"][0]
allocs = [e for e in trace if e["action"] == "alloc"]
mine = [e for e in allocs if e["size"] == 3 << 20 and e["addr"] == marker.data_ptr()]
frames = mine[0].get("frames", []) if mine else []
result["marker_alloc_frames"] = [f"{f['name']} ({f['filename'].rsplit('/', 1)[-1]}:{f['line']})" for f in frames[:3]]
result["marker_stack_names_this_script"] = bool(frames) and frames[0]["name"] == "make_activations" and \
    frames[0]["filename"] == __file__
result["entries"] = len(trace)
result["alloc_entries_with_frames"] = sum(1 for e in allocs if e.get("frames"))
result["alloc_entries"] = len(allocs)
result["distinct_innermost_functions"] = sorted({e["frames"][0]["name"] for e in allocs if e.get("frames")})[:12]
blocks = [b for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
result["live_blocks_with_frames"] = f"{sum(1 for b in blocks if b.get('frames'))}/{len(blocks)}"

# The cost of the stacks: the same step, history off / on without stacks / on with stacks.
settings = {"off": None, "history": dict(context=None), "stacks": dict(stacks="python")}
times = {k: [] for k in settings}
for _ in range(3):
    for name, kwargs in settings.items():
        if kwargs is None:
            torch.cuda.memory._record_memory_history(enabled=None)
        else:
            torch.cuda.memory._record_memory_history(enabled="all", max_entries=100_000, **kwargs)
        train_step()
        torch.cuda.synchronize()
        for _ in range(20):
            t = time.perf_counter()
            train_step()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t)
torch.cuda.memory._record_memory_history(enabled=None)
result["step_ms_median"] = {k: round(statistics.median(v) * 1e3, 4) for k, v in times.items()}
print(json.dumps(result), flush=True)
