"""The private-pool calls of a PyTorch program, listed as a replay needs them.

A trace does not show which requests a pool served, nor when a pool was made or released. A
`PoolCalls` takes a `_snapshot()` (which records a `snapshot` entry) just before each such call
and lists the call with that entry's index (`trace_len`), in the words of the device allocator
(`trace/src/pool_calls.rs` reads them from `expected.json`'s `calls`). Used by
`capture_pools.py` and `scripts/dev/torch-jobs.py`. `PoolCalls.graph_trees()` lists the calls
torch.compile(mode="reduce-overhead")'s CUDA-graph trees make, which go through PyTorch's own
code rather than the job's.
"""

import bisect
import gc
import weakref


class PoolCalls:
    """The calls listed so far (`calls`), and the recorded ways to make them."""

    def __init__(self, torch):
        self.torch = torch
        self.calls = []
        self.graph_tree_calls = None

    def trace_len(self):
        """The index the next trace entry gets (a snapshot during a capture is host-side only)."""
        return len(self.torch.cuda.memory._snapshot()["device_traces"][0])

    def record(self, at, call, pool=None, **extra):
        """Lists `call`, made after the `snapshot` entry `at`, in trace order (a capture's begin
        is known only at its end, after calls made during it)."""
        entry = {"call": call, "trace_len": at}
        if pool is not None:
            entry["pool"] = list(pool)
        entry.update(extra)
        where = bisect.bisect_right([c["trace_len"] for c in self.calls], at)
        self.calls.insert(where, entry)

    def pool(self):
        """A `torch.cuda.MemPool` whose creation, scopes and deletion are listed."""
        return RecordedPool(self)

    def empty_cache(self):
        if self.graph_tree_calls is not None:
            self.torch.cuda.empty_cache()  # listed by the graph trees' patch
            return
        at = self.trace_len()
        self.torch.cuda.empty_cache()
        self.record(at, "empty_cache")

    def graph_trees(self):
        """A context manager: while it is open, the calls of CUDA-graph trees are listed too
        (`GraphTreeCalls`). Open it before the first compiled call, which makes the tree's pool;
        a job that spells out its own captures (capture_begin, `record(...)`) does not open it."""
        return GraphTreeCalls(self)


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


class GraphTreeCalls:
    """While open, lists the private-pool calls of CUDA-graph trees (torch/_inductor/
    cudagraph_trees.py) by patching the Python entry points they go through:

    - `torch.cuda.graph`, for the tree manager's first capture (empty: it keeps the pool alive)
      and each recording: `torch.cuda.empty_cache()` on entry (empty_cache),
      `CUDAGraph.capture_begin` (begin_allocate_to_pool on the capture stream, listed after the
      RNG state's two tensors, which capture_begin allocates before it routes to the pool),
      `CUDAGraph.capture_end` (end_allocate_to_pool), `CUDAGraph.reset` (release_pool);
    - warm-ups (`_use_cuda_memory_pool_manager`): `torch._C._cuda_beginAllocateCurrentThreadToPool`
      (begin_allocate_to_pool for every stream of the thread), `_cuda_endAllocateToPool`,
      `_cuda_releasePool`;
    - `torch._C._cuda_getCheckpointState` (checkpoint_pool, numbered from 0) and
      `_cuda_setCheckpointPoolState` (set_checkpoint_pool_state with that number).

    Not listed: a graph's pool released by its C++ destructor without `reset()`, which graph
    trees leave to their teardown (`torch._dynamo.reset()`, the end of the process). Every
    `torch.cuda.empty_cache()` while open is listed, the job's own too."""

    def __init__(self, calls):
        self.calls = calls
        self.patched = []
        self.captures = {}  # id(graph) -> (weak graph, trace_len after capture_begin, stream)
        self.captured = {}  # id(graph) -> (weak graph, pool)
        self.checkpoints = {}  # id(state) -> (number, pool, state), the state kept so its id stays its own

    def __enter__(self):
        torch = self.calls.torch
        graph_class = torch.cuda.CUDAGraph
        self.patch(torch.cuda, "empty_cache", self.empty_cache)
        self.patch(graph_class, "capture_begin", self.capture_begin)
        self.patch(graph_class, "capture_end", self.capture_end)
        self.patch(graph_class, "reset", self.reset)
        self.patch(torch._C, "_cuda_beginAllocateCurrentThreadToPool", self.listed("begin_allocate_to_pool"))
        self.patch(torch._C, "_cuda_endAllocateToPool", self.listed("end_allocate_to_pool"))
        self.patch(torch._C, "_cuda_releasePool", self.listed("release_pool"))
        self.patch(torch._C, "_cuda_getCheckpointState", self.get_checkpoint_state)
        self.patch(torch._C, "_cuda_setCheckpointPoolState", self.set_checkpoint_pool_state)
        self.calls.graph_tree_calls = self
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self.patched):
            setattr(owner, name, original)
        self.patched.clear()
        self.calls.graph_tree_calls = None

    def patch(self, owner, name, make):
        original = getattr(owner, name)
        self.patched.append((owner, name, original))
        setattr(owner, name, make(original))

    def empty_cache(self, original):
        def empty_cache():
            at = self.calls.trace_len()
            original()
            self.calls.record(at, "empty_cache")
        return empty_cache

    def capture_begin(self, original):
        def capture_begin(graph, *args, **kwargs):
            original(graph, *args, **kwargs)
            stream = self.calls.torch.cuda.current_stream().cuda_stream
            self.captures[id(graph)] = (weakref.ref(graph), self.calls.trace_len(), stream)
        return capture_begin

    def capture_end(self, original):
        def capture_end(graph):
            original(graph)
            at = self.calls.trace_len()
            pool = tuple(graph.pool())  # known once the capture ended
            ref, begun, stream = self.captures.pop(id(graph))
            if ref() is not graph:
                raise RuntimeError("pool_calls: a capture ended that was not seen beginning")
            self.calls.record(begun, "begin_allocate_to_pool", pool, stream=stream)
            self.calls.record(at, "end_allocate_to_pool", pool)
            self.captured[id(graph)] = (weakref.ref(graph), pool)
        return capture_end

    def reset(self, original):
        def reset(graph):
            ref, pool = self.captured.pop(id(graph), (None, None))
            if ref is None or ref() is not graph:
                return original(graph)  # no capture of its own to release
            at = self.calls.trace_len()
            original(graph)
            self.calls.record(at, "release_pool", pool)
        return reset

    def listed(self, call):
        """The patch of a `torch._C` pool function of `(device, pool)`, listed as `call`."""
        def make(original):
            def wrapper(device, pool):
                at = self.calls.trace_len()
                original(device, pool)
                self.calls.record(at, call, tuple(pool))
            return wrapper
        return make

    def get_checkpoint_state(self, original):
        def get_checkpoint_state(device, pool):
            at = self.calls.trace_len()
            state = original(device, pool)
            number = len(self.checkpoints)
            self.checkpoints[id(state)] = (number, tuple(pool), state)
            self.calls.record(at, "checkpoint_pool", tuple(pool), checkpoint=number)
            return state
        return get_checkpoint_state

    def set_checkpoint_pool_state(self, original):
        def set_checkpoint_pool_state(device, state, *args, **kwargs):
            if id(state) not in self.checkpoints:
                raise RuntimeError("pool_calls: a checkpoint restored that was taken before graph_trees() was opened")
            number, pool, _ = self.checkpoints[id(state)]
            at = self.calls.trace_len()
            result = original(device, state, *args, **kwargs)
            self.calls.record(at, "set_checkpoint_pool_state", pool, checkpoint=number)
            return result
        return set_checkpoint_pool_state
