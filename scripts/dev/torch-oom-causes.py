#!/usr/bin/env python3
"""One small PyTorch job per cause `cachalot explain` names, each ending in the out-of-memory
error of its cause, and the check that `explain` names it.

    python3 scripts/dev/torch-oom-causes.py OUTDIR            # the jobs, then the check
    python3 scripts/dev/torch-oom-causes.py --jobs OUTDIR     # the jobs only (a GPU machine)
    python3 scripts/dev/torch-oom-causes.py --check OUTDIR    # the check only (no GPU needed)
    CACHALOT=target/release/cachalot python3 scripts/dev/torch-oom-causes.py OUTDIR

Each job runs in a process of its own (PYTORCH_CUDA_ALLOC_CONF is read once, at the first CUDA
allocation), records its memory history (stacks="python"), catches the torch.cuda.OutOfMemoryError
and writes OUTDIR/CAUSE.pickle (torch.cuda.memory._dump_snapshot) with OUTDIR/CAUSE.expected.json
beside it (settings, memory fraction, device total and, for the private pool, the pool calls the
replay needs, as scripts/conformance/pool_calls.py lists them), and OUTDIR/CAUSE.job.json (what
the check expects).

Sizing: on a ~140 GiB H200 no job uses more than ~10 GiB of the allocator's memory. The jobs
whose error is the device's own take the rest of the device first with one cuMemAlloc outside
PyTorch's allocator (the "outside" memory explain reports, like another process's): a memory
fraction cannot stand in for a small device there, because an error under a fraction's cap
where the device still had room *is* the fraction_cap cause. Only the fraction_cap job sets
one (torch.cuda.set_per_process_memory_fraction).

The check runs `$CACHALOT explain --json OUTDIR/CAUSE.pickle` (CACHALOT defaults to `cachalot`
on PATH) and prints one line per job: the expected cause, explain's main cause, its fix, and
whether the fix's replay let the job through (explain names a fix only where a replay proved
it); exit status 1 if any job's answer differs from what is expected.

The oversize job has no error of its own: in PyTorch 2.11 a request that the oversize rules
keep from a cached oversize block is served after the retry chain releases such blocks
(release_available_cached_blocks, then release_cached_blocks), so oversize blocks are never
the main cause outside a pool that allocations are routed to. The job shows that rule on the
device (the request is served, a segment was released) and the check asks explain for that
request (--at ENTRY): served, with the oversize blocks among the classes when it came.
"""

import ctypes
import json
import os
import pickle
import subprocess
import sys

MIB = 1 << 20
GIB = 1 << 30
# The allocator's memory a job may use: the rest of the device is taken outside it.
BUDGET = 10 * GIB

# cause: (PYTORCH_CUDA_ALLOC_CONF, whether explain proves a fix). The fix expectations are those
# of the simulator's tests (trace/tests/explain.rs): None where no fix search runs.
JOBS = {
    "too_small": ("", True),
    "other_stream": ("", True),
    "other_pool": ("", False),
    "oversize": ("max_split_size_mb:64", None),
    "pending_stream_free": ("", True),
    "private_pool": ("", False),
    "fraction_cap": ("", True),
    "live_exceeds_device": ("", None),
}


def job(cause, outdir):
    """Runs the job of `cause` in this process and writes its files."""
    import torch

    torch.zeros(1, device="cuda")
    # The context's first tensor leaves a cached 2 MiB segment the history would not show: a
    # replay of the trace would lack it (an OOM's retry chain frees it).
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    total = torch.cuda.get_device_properties(0).total_memory
    s1, s2, side = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    keep, calls, expected = [], [], {"cause": cause}
    fraction = None

    def outside(budget):
        """Takes all but `budget` bytes of the device's free memory with cuMemAlloc, outside
        PyTorch's allocator, in the context PyTorch made current."""
        free, _ = torch.cuda.mem_get_info()
        size = free - budget
        if size <= 0:
            return
        cuda = ctypes.CDLL("libcuda.so.1")
        pointer = ctypes.c_uint64()
        result = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
        if result != 0:
            sys.exit(f"{cause}: cuMemAlloc_v2 of {size} B failed (CUresult {result})")
        keep.append(pointer)

    def fill(margin):
        """A live block on a stream of its own that leaves `margin` bytes of the device free
        (a whole number of 2 MiB pages, the segment then being exactly its size)."""
        free, _ = torch.cuda.mem_get_info()
        size = (free - margin) // (2 * MIB) * (2 * MIB)
        if size > 0:
            with torch.cuda.stream(side):
                keep.append(torch.empty(size, dtype=torch.uint8, device="cuda"))

    def alloc(size, stream=None):
        with torch.cuda.stream(stream or s1):
            return torch.empty(size, dtype=torch.uint8, device="cuda")

    def fragments(n, stream=None):
        """`n` segments of 20 MiB on `stream` (s1), each an 8 MiB block live and 12 MiB free."""
        freed = []
        for _ in range(n):
            keep.append(alloc(8 * MIB, stream))
            freed.append(alloc(8 * MIB, stream))
        del freed

    def request(size, stream=None):
        """The request that fails, or (the oversize job) is served. No synchronization before
        it: the pending free must still be pending."""
        try:
            keep.append(alloc(size, stream))
        except torch.cuda.OutOfMemoryError as error:
            expected["message"] = str(error).splitlines()[0]
            return False
        return True

    if cause != "fraction_cap":
        outside(BUDGET)
    if cause == "too_small":
        # Free 12 MiB holes between live blocks; a 16 MiB request fits none.
        fragments(64)
        fill(10 * MIB)
        request(16 * MIB)
    elif cause == "other_stream":
        # The holes are on s1; the request comes on s2.
        fragments(64)
        fill(6 * MIB)
        request(10 * MIB, s2)
    elif cause == "other_pool":
        # 2 MiB small-pool segments, each with one 512 KiB block live: 1.5 MiB free in each.
        freed = []
        for n in range(2048):
            block = alloc(512 << 10)
            (keep if n % 4 == 0 else freed).append(block)
        del freed
        fill(20 * MIB)
        request(30 * MIB)
    elif cause == "oversize":
        # max_split_size_mb:64: three free 100 MiB segments are oversize, kept whole; a 30 MiB
        # request may not split one. The device has no room for a new segment, so the chain
        # releases one (release_available_cached_blocks) and the request is served.
        freed = [alloc(100 * MIB) for _ in range(3)]
        del freed
        fill(10 * MIB)
        segments_freed = torch.cuda.memory_stats().get("num_device_free", 0)
        expected["trace_len"] = len(torch.cuda.memory._snapshot()["device_traces"][0])
        expected["request"] = 30 * MIB
        expected["served"] = request(30 * MIB)
        expected["segments_released"] = torch.cuda.memory_stats().get("num_device_free", 0) - segments_freed
    elif cause == "pending_stream_free":
        # A 12 MiB block used on s2 (record_stream) is freed while s2 is still busy; s1's other
        # holes are then taken, the device filled, and a 12 MiB request on s1 finds no free
        # block: the retry chain's synchronization completes the free too late (its retry asks
        # the device for a new segment and does not search the free blocks again).
        fragments(5)
        used_elsewhere = alloc(12 * MIB)
        with torch.cuda.stream(s2):
            torch.cuda._sleep(4_000_000_000)  # s2 busy for a second or two
            used_elsewhere.record_stream(s2)
        del used_elsewhere
        keep.extend(alloc(12 * MIB) for _ in range(4))
        fill(6 * MIB)
        request(12 * MIB)
    elif cause == "private_pool":
        # Four 20 MiB blocks of a MemPool still alive, freed: cached in the pool, which a
        # request outside it may not use.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:0] = [here, os.path.join(here, "..", "conformance")]
        from pool_calls import PoolCalls

        recorder = PoolCalls(torch)
        pool = recorder.pool()
        with torch.cuda.stream(s1):
            with pool:
                blocks = [torch.empty(20 * MIB, dtype=torch.uint8, device="cuda") for _ in range(4)]
            del blocks
        fill(20 * MIB)
        request(30 * MIB)
        calls = recorder.calls
        keep.append(pool)
    elif cause == "fraction_cap":
        # An allowance of 2 GiB, 1.5 GiB live, 1 GiB more asked: the device had the room.
        fraction = round(2 * GIB / total, 4)
        torch.cuda.set_per_process_memory_fraction(fraction)
        keep.extend(alloc(512 * MIB) for _ in range(3))
        request(GIB)
    elif cause == "live_exceeds_device":
        # 9 GiB live of the 10 GiB left, 2 GiB more asked: no cache arrangement holds it.
        keep.extend(alloc(GIB) for _ in range(9))
        request(2 * GIB)
    else:
        sys.exit(f"unknown cause {cause!r}: one of {', '.join(JOBS)}")

    torch.cuda.memory._dump_snapshot(os.path.join(outdir, f"{cause}.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    run = {"PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "memory_fraction": fraction,
           "device_total_bytes": total, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    if calls:
        run["calls"] = calls
    with open(os.path.join(outdir, f"{cause}.expected.json"), "w") as f:
        json.dump(run, f, indent=1)
    with open(os.path.join(outdir, f"{cause}.job.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"{cause}: {expected.get('message', 'served' if expected.get('served') else 'no error')}")


def run_jobs(outdir):
    os.makedirs(outdir, exist_ok=True)
    failed = []
    for cause, (settings, _) in JOBS.items():
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=settings)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--job", cause, outdir], env=env)
        if done.returncode != 0:
            failed.append(cause)
    if failed:
        sys.exit(f"jobs that did not finish: {', '.join(failed)}")


def explain(binary, path, *extra):
    done = subprocess.run([binary, "explain", "--json", *extra, path], capture_output=True, text=True)
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    return json.loads(done.stdout), None


def fix_text(x):
    search = x.get("fix")
    if search is None:
        return "no search", None
    fix = search.get("fix")
    if fix is None:
        return f"none of {search['replays']} replays", False
    change = fix["change"]
    detail = {k: v for k, v in change.items() if k != "kind"}
    return f"{change['kind']} {json.dumps(detail)}", True


def oversize_entry(path, job):
    """The index of the job's 30 MiB request in its trace: the first alloc of that size from
    the snapshot entry recorded before it."""
    with open(path, "rb") as f:
        trace = pickle.load(f)["device_traces"][0]
    for i in range(job["trace_len"], len(trace)):
        if trace[i]["action"] == "alloc" and trace[i]["size"] == job["request"]:
            return i
    return None


def check(outdir):
    binary = os.environ.get("CACHALOT", "cachalot")
    differ = 0
    for cause, (_, proves_fix) in JOBS.items():
        path = os.path.join(outdir, f"{cause}.pickle")
        with open(os.path.join(outdir, f"{cause}.job.json")) as f:
            job_facts = json.load(f)
        if cause == "oversize":
            entry = oversize_entry(path, job_facts)
            if not job_facts.get("served") or entry is None:
                ok, line = False, f"served={job_facts.get('served')} entry={entry}: the request was not served"
            else:
                x, error = explain(binary, path, "--at", str(entry))
                classes = [c["cause"] for c in x["when_asked"]] if x else []
                ok = x is not None and not x["failed"] and "oversize" in classes
                line = error or (f"served={not x['failed']}, segments released {job_facts['segments_released']}, "
                                 f"when asked: {', '.join(classes) or 'nothing in the way'}")
            print(f"{'ok  ' if ok else 'DIFF'} expected {cause:<20} | served after the chain's release | {line}")
            differ += not ok
            continue
        x, error = explain(binary, path)
        if x is None:
            print(f"DIFF expected {cause:<20} | explain failed: {error}")
            differ += 1
            continue
        fix, proven = fix_text(x)
        ok = x["main_cause"] == cause and (proves_fix is None or proves_fix == proven)
        replay = {True: "its replay lets the job through", False: "no change lets it through", None: ""}[proven]
        print(f"{'ok  ' if ok else 'DIFF'} expected {cause:<20} | explain: {x['main_cause']} | fix: {fix} | {replay}")
        differ += not ok
    print(f"{len(JOBS) - differ} of {len(JOBS)} as expected")
    return 1 if differ else 0


def main(argv):
    if len(argv) == 3 and argv[0] == "--job":
        job(argv[1], argv[2])
        return 0
    if len(argv) == 2 and argv[0] in ("--jobs", "--check"):
        if argv[0] == "--jobs":
            run_jobs(argv[1])
            return 0
        return check(argv[1])
    if len(argv) == 1 and not argv[0].startswith("-"):
        run_jobs(argv[0])
        return check(argv[0])
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
