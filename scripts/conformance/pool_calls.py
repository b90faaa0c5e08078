"""The private-pool calls of a PyTorch program, listed as a replay needs them.

A trace does not show which requests a pool served, nor when a pool was made or released. A
`PoolCalls` takes a `_snapshot()` (which records a `snapshot` entry) just before each such call
and lists the call with that entry's index (`trace_len`), in the words of the device allocator
(`trace/src/pool_calls.rs` reads them from `expected.json`'s `calls`). Used by
`capture_pools.py` and `scripts/dev/torch-jobs.py`.
"""

import gc


class PoolCalls:
    """The calls listed so far (`calls`), and the recorded ways to make them."""

    def __init__(self, torch):
        self.torch = torch
        self.calls = []

    def trace_len(self):
        """The index the next trace entry gets (a snapshot during a capture is host-side only)."""
        return len(self.torch.cuda.memory._snapshot()["device_traces"][0])

    def record(self, at, call, pool=None, **extra):
        entry = {"call": call, "trace_len": at}
        if pool is not None:
            entry["pool"] = list(pool)
        entry.update(extra)
        self.calls.append(entry)

    def pool(self):
        """A `torch.cuda.MemPool` whose creation, scopes and deletion are listed."""
        return RecordedPool(self)

    def empty_cache(self):
        at = self.trace_len()
        self.torch.cuda.empty_cache()
        self.record(at, "empty_cache")


class RecordedPool:
    """A MemPool; `with` it is `use_mem_pool` (end_allocate_to_pool + release_pool on exit), and
    `delete()` drops its last reference (release_pool + empty_cache of the pool)."""

    def __init__(self, calls):
        self.calls = calls
        at = calls.trace_len()
        self.pool = calls.torch.cuda.MemPool()
        self.id = tuple(self.pool.id)
        calls.record(at, "create_pool", self.id)

    def __enter__(self):
        at = self.calls.trace_len()
        self.scope = self.calls.torch.cuda.use_mem_pool(self.pool)
        self.scope.__enter__()
        self.calls.record(at, "begin_allocate_to_pool", self.id)

    def __exit__(self, *exc):
        at = self.calls.trace_len()
        self.scope.__exit__(*exc)
        self.calls.record(at, "end_allocate_to_pool", self.id)
        self.calls.record(at, "release_pool", self.id)

    def delete(self):
        at = self.calls.trace_len()
        del self.pool
        gc.collect()
        self.calls.record(at, "release_pool", self.id)
        self.calls.record(at, "empty_cache", self.id)
