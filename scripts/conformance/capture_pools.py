#!/usr/bin/env python3
"""Captures PyTorch traces that use private pools: `torch.cuda.MemPool` + `use_mem_pool`, and a
small CUDA graph capture with its graph-private pool.

    capture_pools.py OUTDIR [--only NAME,...]

For each workload NAME it writes OUTDIR/NAME.pickle (`torch.cuda.memory._snapshot()` with the
full trace) and OUTDIR/NAME.expected.json, the format of `capture.py` (settings, device total,
marks, `memory_stats()`, `memory_summary()`, `calls`). Every workload runs in a process of its
own (a new CUDA context, so the allocator starts empty with the workload's
PYTORCH_CUDA_ALLOC_CONF).

A trace does not show which requests a pool served, nor when a pool was made or released: the
capture takes a `_snapshot()` (which records a `snapshot` entry) just before each such call and
lists the calls in `calls`, with that entry's index (`trace_len`), in the words of the device
allocator, which is what a replay needs:

    {"call": "create_pool", "pool": [0, 1]}                       MemPool(): use_count 1
    {"call": "begin_allocate_to_pool", "pool": [0, 1]}             use_mem_pool enters: every
                                                                   stream of this thread, +1
    {"call": "begin_allocate_to_pool", "pool": [1, 0], "stream": S} a graph capture on stream S
    {"call": "end_allocate_to_pool", "pool": [0, 1]}
    {"call": "release_pool", "pool": [0, 1]}                       use_count - 1
    {"call": "empty_cache", "pool": [0, 1]}                        emptyCache(pool), as the
                                                                   MemPool's destructor calls it
    {"call": "empty_cache"}                                        torch.cuda.empty_cache()

`use_mem_pool`'s exit is end_allocate_to_pool + release_pool; `del pool` (the MemPool's last
reference) is release_pool + empty_cache of the pool; `torch.cuda.graph`'s entry is
empty_cache + begin_allocate_to_pool on the capture stream, its exit end_allocate_to_pool, the
graph's `reset()` release_pool. `probe.txt` keeps the Python sources of these calls from the
PyTorch that ran, so the mapping can be checked against them.
"""

import inspect
import json
import pickle

import one_process
from pool_calls import PoolCalls

WORKLOADS = {
    # name: PYTORCH_CUDA_ALLOC_CONF
    "pool_basic": "",
    "pool_outlives": "",
    "pool_two_pools": "",
    "pool_expandable": "expandable_segments:True",
    "pool_max_split": "max_split_size_mb:64",
    "graph_capture": "",
    "pool_oom": "",
    "pool_streams": "",
}

# Memory fractions of workloads that set one.
FRACTIONS = {"pool_oom": 0.01}


def capture_one(name, outdir):
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.empty_cache()
    if name in FRACTIONS:
        torch.cuda.set_per_process_memory_fraction(FRACTIONS[name])
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    recorder = PoolCalls(torch)
    calls, marks = recorder.calls, []
    mark, record, empty_cache = recorder.trace_len, recorder.record, recorder.empty_cache

    def empty(n, device="cuda"):
        return torch.empty(int(n), dtype=torch.uint8, device=device)

    Pool = recorder.pool

    def oom(label, e):
        marks.append({"label": label, "message": str(e), "allocated": torch.cuda.memory_allocated(),
                      "reserved": torch.cuda.memory_reserved()})

    empty.oom = oom
    globals()[name](torch, empty, Pool, empty_cache, record, mark)

    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = dict(torch.cuda.memory_stats())
    with open(f"{outdir}/{name}.pickle", "wb") as f:
        pickle.dump(snap, f)
    with open(f"{outdir}/{name}.expected.json", "w") as f:
        json.dump({"workload": name, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                   "PYTORCH_CUDA_ALLOC_CONF": WORKLOADS[name], "memory_fraction": FRACTIONS.get(name),
                   "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
                   "marks": marks, "calls": calls, "memory_stats": stats,
                   "memory_summary": torch.cuda.memory_summary()}, f, indent=1)


# ---- workloads: (torch, empty, Pool, empty_cache, record, mark) ----

def pool_basic(torch, empty, Pool, empty_cache, record, mark):
    """Default-pool tensors, then a MemPool serving small and large requests, frees inside and
    outside the scope, a default-pool request the pool's cached blocks must not serve, and the
    pool's release."""
    a = empty(3 << 20)
    b = empty(4096)
    del a
    pool = Pool()
    with pool:
        x = empty(3 << 20)  # the default pool's cached 20 MiB segment must not serve it
        y = empty(700)
        z = empty(12 << 20)
        del y
        w = empty(1 << 20)
    c = empty(2 << 20)  # the default pool again
    del x
    d = empty(1 << 20)  # not from the pool's free blocks
    empty_cache()  # the pool is alive: its cached segments stay
    del z, w
    pool.delete()  # releases the pool's free segments
    del b, c, d
    empty_cache()


def pool_outlives(torch, empty, Pool, empty_cache, record, mark):
    """A tensor outlives its MemPool: the segment stays until the tensor dies and a later
    empty_cache releases the freeable pool; the pool is entered twice."""
    pool = Pool()
    with pool:
        keep = empty(5 << 20)
        t = empty(30 << 20)
    del t
    with pool:
        u = empty(25 << 20)  # fits the freed 30 MiB block of the pool
        v = empty(2000)
    del u, v
    pool.delete()  # keep is alive: its segment stays in the (now freeable) pool
    e = empty(8 << 20)
    del keep
    empty_cache()  # now the freeable pool's segment goes too
    del e
    empty_cache()


def pool_two_pools(torch, empty, Pool, empty_cache, record, mark):
    """Two pools, nested scopes (the innermost wins), and interleaved frees."""
    p1, p2 = Pool(), Pool()
    with p1:
        a = empty(6 << 20)
        with p2:
            b = empty(6 << 20)
            c = empty(300)
        d = empty(300)
    del a, b
    with p2:
        e = empty(5 << 20)  # from p2's freed block
    with p1:
        f = empty(5 << 20)  # from p1's freed block
    g = empty(5 << 20)  # a new default segment
    del c, d, e, f, g
    p2.delete()
    empty_cache()
    p1.delete()


def pool_expandable(torch, empty, Pool, empty_cache, record, mark):
    """Expandable segments: the pool gets reservations of its own."""
    a = empty(30 << 20)
    pool = Pool()
    with pool:
        x = empty(30 << 20)
        y = empty(600 << 10)
        z = empty(50 << 20)
    del a
    b = empty(20 << 20)
    del x
    empty_cache()
    del y, z
    pool.delete()
    del b
    empty_cache()


def pool_max_split(torch, empty, Pool, empty_cache, record, mark):
    """max_split_size_mb: oversize blocks in a pool, released by the pool's own retry chain."""
    pool = Pool()
    with pool:
        x = empty(100 << 20)
        y = empty(70 << 20)
    del x
    with pool:
        z = empty(80 << 20)  # the freed 100 MiB block is oversize: not within the rounding slack
    del y, z
    empty_cache()
    pool.delete()


def graph_capture(torch, empty, Pool, empty_cache, record, mark):
    """A small CUDA graph capture (elementwise work only) with its private pool, replayed, then
    the graph reset and its pool released. `torch.cuda.graph`'s entry is spelled out so that the
    routing's start can be marked: `capture_begin` allocates the RNG's graph-state tensors on the
    capture stream before it routes to the pool, so a mark before it would put them in the pool."""
    x = torch.ones(1 << 18, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture
        y = (x * 2 + 1).relu()
    torch.cuda.current_stream().wait_stream(s)
    del y
    g = torch.cuda.CUDAGraph()
    # torch.cuda.graph(g, stream=s).__enter__, step by step.
    torch.cuda.synchronize()
    empty_cache()
    torch._C._host_emptyCache()
    with torch.cuda.stream(s):
        g.capture_begin()
        begun = mark()  # a snapshot during the capture: host-side only
        h = x * 3
        y = (h + 1).relu()
        big = torch.empty(6 << 20, dtype=torch.uint8, device="cuda")
        big.fill_(1)
        del h
        g.capture_end()
    pool = tuple(g.pool())  # known once the capture ended
    record(begun, "begin_allocate_to_pool", pool, stream=s.cuda_stream)
    at = mark()
    record(at, "end_allocate_to_pool", pool)
    g.replay()
    torch.cuda.synchronize()
    z = empty(3 << 20)  # default pool
    del y, big
    at = mark()
    g.reset()
    record(at, "release_pool", pool)
    empty_cache()
    del z, x
    empty_cache()


def pool_oom(torch, empty, Pool, empty_cache, record, mark):
    """Under a memory fraction, a live pool's free blocks are not released by the retry chain:
    the OOM message counts them as "allocated in private pools"; once the pool is deleted the
    request fits."""
    pool = Pool()
    with pool:
        x = empty(300 << 20)
        y = empty(100 << 20)
    del x
    try:
        empty(600 << 20)
    except torch.OutOfMemoryError as e:
        empty.oom("oom_with_pool", e)
    with pool:
        try:
            empty(700 << 20)  # the pool's own retry chain: no full release while routed
        except torch.OutOfMemoryError as e:
            empty.oom("oom_in_pool", e)
    del y
    pool.delete()
    z = empty(600 << 20)
    del z
    empty_cache()


def pool_streams(torch, empty, Pool, empty_cache, record, mark):
    """A pool serving two streams; a block used on another stream (record_stream) and freed
    while routed: its free completes after the scope."""
    side = torch.cuda.Stream()
    pool = Pool()
    with pool:
        a = empty(4 << 20)
        with torch.cuda.stream(side):
            b = empty(4 << 20)
            c = empty(1000)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            a.fill_(1)
        a.record_stream(side)
        del a
        d = empty(2 << 20)
    torch.cuda.synchronize()
    e = empty(4 << 20)  # default pool, after the deferred free completed
    del b, c, d, e
    pool.delete()
    empty_cache()


def probe(outdir):
    """What the PyTorch that ran says about the calls the mapping above relies on."""
    import torch

    parts = [f"torch {torch.__version__}"]
    for label, obj in [("use_mem_pool", torch.cuda.use_mem_pool), ("MemPool", torch.cuda.MemPool),
                       ("graph", torch.cuda.graph), ("CUDAGraph", torch.cuda.CUDAGraph)]:
        try:
            parts.append(f"==== {label}\n{inspect.getsource(obj)}")
        except (OSError, TypeError) as e:
            parts.append(f"==== {label}: {e}")
    with open(f"{outdir}/probe.txt", "w") as f:
        f.write("\n".join(parts))


if __name__ == "__main__":
    one_process.main(__file__, __doc__, WORKLOADS, capture_one, timeout=120, before=probe)
