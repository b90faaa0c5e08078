#!/usr/bin/env python3
"""Captures PyTorch traces of one process using two GPUs, for `cachalot replay --all-devices`.

    capture_devices.py OUTDIR [--only NAME,...]

Needs a machine with at least two CUDA devices. For each workload NAME it writes
OUTDIR/NAME.pickle (`torch.cuda.memory._snapshot()`: one trace per device in `device_traces`,
every device's segments) and, in the format of `capture.py`, OUTDIR/NAME.expected.json for device
0 and OUTDIR/NAME.device1.expected.json for device 1 (settings, device total, marks,
`memory_stats(device)`, `memory_summary(device)`, `calls`). PyTorch keeps one allocator per
device, and `torch.cuda.empty_cache()` empties them all: each device's expected.json lists the
call with the length of that device's trace, after the `snapshot` entry a `_snapshot()` just
before it records, as `capture.py` does. (An `empty_cache` that releases nothing leaves no entry
of its own, yet counts in `num_sync_all_streams`.) Every workload runs in a process of its own
(a new CUDA context, so both allocators start empty with the workload's
PYTORCH_CUDA_ALLOC_CONF).
"""

import json
import pickle
import sys

import one_process

WORKLOADS = {
    # name: PYTORCH_CUDA_ALLOC_CONF
    "devices_interleaved": "",
    "devices_streams": "",
    "devices_expandable": "expandable_segments:True",
    "devices_fraction": "",
}

# Memory fractions, set on both devices, of workloads that set one.
FRACTIONS = {"devices_fraction": 0.01}

DEVICES = (0, 1)


def capture_one(name, outdir):
    import torch

    if torch.cuda.device_count() < 2:
        sys.exit(f"{name}: needs two CUDA devices, found {torch.cuda.device_count()}")
    for d in DEVICES:
        torch.zeros(1, device=f"cuda:{d}")
    torch.cuda.empty_cache()
    for d in DEVICES:
        if name in FRACTIONS:
            torch.cuda.set_per_process_memory_fraction(FRACTIONS[name], d)
        torch.cuda.reset_peak_memory_stats(d)
        torch.cuda.reset_accumulated_memory_stats(d)
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    marks = {d: [] for d in DEVICES}
    calls = {d: [] for d in DEVICES}

    def empty_cache():
        snap = torch.cuda.memory._snapshot()
        for d in DEVICES:
            calls[d].append({"call": "empty_cache", "trace_len": len(snap["device_traces"][d])})
        torch.cuda.empty_cache()

    def empty(n, device):
        return torch.empty(int(n), dtype=torch.uint8, device=f"cuda:{device}")

    def oom(label, e, device):
        marks[device].append({"label": label, "message": str(e),
                              "allocated": torch.cuda.memory_allocated(device),
                              "reserved": torch.cuda.memory_reserved(device)})

    empty.oom = oom
    empty.empty_cache = empty_cache
    globals()[name](torch, empty)

    for d in DEVICES:
        torch.cuda.synchronize(d)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(f"{outdir}/{name}.pickle", "wb") as f:
        pickle.dump(snap, f)
    for d in DEVICES:
        suffix = "" if d == 0 else f".device{d}"
        with open(f"{outdir}/{name}{suffix}.expected.json", "w") as f:
            json.dump({"workload": name, "device": d, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(d),
                       "PYTORCH_CUDA_ALLOC_CONF": WORKLOADS[name], "memory_fraction": FRACTIONS.get(name),
                       "device_total_bytes": torch.cuda.get_device_properties(d).total_memory,
                       "marks": marks[d], "calls": calls[d], "memory_stats": dict(torch.cuda.memory_stats(d)),
                       "memory_summary": torch.cuda.memory_summary(d)}, f, indent=1)


# ---- workloads: (torch, empty); empty.empty_cache() is torch.cuda.empty_cache(), listed ----

def devices_interleaved(torch, empty):
    """Requests of both pools alternating between the devices, frees that split and merge on
    each, a large block on one only, `empty_cache` (both devices) in the middle."""
    a0, a1 = empty(3 << 20, 0), empty(5 << 20, 1)
    s0, s1 = empty(700, 0), empty(1500, 1)
    big1 = empty(300 << 20, 1)
    del a0
    b0 = empty(2 << 20, 0)  # carved from a0's 20 MiB segment
    xs = [empty((i + 1) * 777_000, i % 2) for i in range(24)]
    del xs[::3]
    del big1
    empty.empty_cache()
    c1, c0 = empty(40 << 20, 1), empty(40 << 20, 0)
    ys = [empty(512 * (i + 1), (i // 3) % 2) for i in range(30)]
    del s0, s1, xs[1::2], ys[::2]
    d0 = empty(9 << 20, 0)
    del a1, b0, c1
    empty.empty_cache()
    del c0, d0, xs, ys


def devices_streams(torch, empty):
    """A side stream on each device, blocks used on both streams of their device
    (`record_stream`, frees completing later), and copies from one device to the other."""
    kept = []
    for d in DEVICES:
        with torch.cuda.device(d):
            side = torch.cuda.Stream()
            main = torch.cuda.current_stream()
            a = empty(4 << 20, d)
            with torch.cuda.stream(side):
                b = empty(6 << 20, d)
                c = empty(1000, d)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                a.fill_(1)
            a.record_stream(side)
            del a  # completes once the side stream's work has
            e = empty(4 << 20, d)  # not a's block while its free is pending
            kept += [b, c, e]
    x0 = empty(8 << 20, 0).fill_(2)
    x1 = x0.to("cuda:1")  # allocated on device 1's current stream
    y0 = x1.to("cuda:0")
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    f0, f1 = empty(4 << 20, 0), empty(4 << 20, 1)  # after the deferred frees completed
    # The loop's last b, c and e (device 1's) stay referenced: device 1's empty_cache releases
    # nothing, and still synchronizes.
    del x0, x1, y0, kept, f0, f1
    empty.empty_cache()


def devices_expandable(torch, empty):
    """`expandable_segments:True`: each device's segments grow and shrink by pages in its own
    address space."""
    ts = []
    for i in range(16):
        ts.append(empty((i % 5 + 1) * (3 << 20) + 4096 * i, i % 2))
    ts.append(empty(900, 0))
    ts.append(empty(900, 1))
    del ts[2:10]
    big = [empty(200 << 20, 1), empty(120 << 20, 0)]
    empty.empty_cache()
    more = [empty((i + 2) << 20, (i + 1) % 2) for i in range(10)]
    del big, ts[::2]
    empty.empty_cache()
    del more, ts


def devices_fraction(torch, empty):
    """A 1 % memory fraction on both devices: each runs out on its own, the error names its
    device, and both go on."""
    for d in (1, 0):
        held = []
        try:
            for _ in range(64):
                held.append(empty(256 << 20, d))
        except torch.OutOfMemoryError as e:
            empty.oom(f"device {d} full", e, d)
        del held[::2]
        small = empty(64 << 20, d)  # from a freed block
        del held, small
    empty.empty_cache()


if __name__ == "__main__":
    one_process.main(__file__, __doc__, WORKLOADS, capture_one, timeout=180)
