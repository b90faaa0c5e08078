"""cachalot as PyTorch's CUDA allocator.

    import cachalot_torch
    cachalot_torch.enable()          # before the first CUDA tensor; PYTORCH_CUDA_ALLOC_CONF applies
    ...                              # the job, unchanged: same bytes as PyTorch's allocator
    cachalot_torch.dump_snapshot("run.pickle")   # opens in torch.cuda._memory_viz and `cachalot view`

cachalot's policy is PyTorch 2.11's caching allocator, byte for byte, so a job on it reserves
exactly what it reserves on PyTorch's own allocator. PyTorch's memory API cannot reach a
pluggable allocator (``torch.cuda.memory_allocated()`` raises "CUDAPluggableAllocator does not yet
support getDeviceStats"); this package provides it, and with ``patch_torch=True`` (the default)
routes ``torch.cuda``'s own functions to it, so existing scripts work unchanged.

The history records each allocation's Python stack (``context``/``stacks`` as PyTorch's
``_record_memory_history``; C++ frames are not recorded): ``torch.cuda._memory_viz`` and
``cachalot view`` show them.

Private pools (CUDA graph capture, ``torch.cuda.MemPool`` with ``use_mem_pool``) and
``torch.backends.cudnn.benchmark`` reach cachalot through the C++ shim. Without the shim
(``shim=False``) they are refused with a RuntimeError (``PRIVATE_POOL_ERROR``).

The first ``enable()`` builds a small C++ shim against the installed torch (once; cached): it
needs a C++ compiler (g++: ``apt install build-essential``), ninja (``pip install ninja``) and
the CUDA toolkit's headers, and says which is missing before it starts.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import shutil
import sys

from . import _native

__all__ = [
    "enable",
    "is_enabled",
    "cuda_status",
    "CUDA_NOT_USABLE",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_stats",
    "memory_summary",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "empty_cache",
    "set_per_process_memory_fraction",
    "record_memory_history",
    "snapshot",
    "dump_snapshot",
    "PATCHED_TORCH_FUNCTIONS",
    "PRIVATE_POOL_ERROR",
    "SHIM_FUNCTIONS",
    "NOT_THE_ALLOCATOR",
]

# The Rust library's functions the C++ shim calls, in the order of its `Functions` struct.
SHIM_FUNCTIONS = (
    "alloc",
    "free",
    "record_stream",
    "set_memory_fraction",
    "last_error",
    "create_pool",
    "begin_allocate_to_pool",
    "end_allocate_to_pool",
    "release_pool",
    "empty_pool_cache",
    "pool_use_count",
    "pool_live_allocations_are",
    "cache_info",
    "enable_pool_hooks",
    "pool_checkpoint",
    "checkpoint_drop",
    "pool_restore",
)

# The torch._C entry points `patch_torch=True` replaces. Every Python-level function of
# torch.cuda that reads the allocator goes through one of them (memory_allocated, memory_reserved,
# max_memory_*, memory_stats, memory_summary, reset_peak_memory_stats,
# reset_accumulated_memory_stats, memory_snapshot, memory._snapshot, memory._dump_snapshot,
# memory._record_memory_history, get_per_process_memory_fraction), so those work unchanged.
# empty_cache and set_per_process_memory_fraction reach the allocator through PyTorch's own hooks.
PATCHED_TORCH_FUNCTIONS = (
    "_cuda_memoryStats",
    "_cuda_resetPeakMemoryStats",
    "_cuda_resetAccumulatedMemoryStats",
    "_cuda_memorySnapshot",
    "_cuda_record_memory_history",
    "_cuda_record_memory_history_legacy",
    "_cuda_getMemoryFraction",
)

_enabled = False


CUDA_NOT_USABLE = "CUDA is not usable here: "


def cuda_status(device: int = 0) -> str:
    """Describes CUDA device `device` ("CUDA device 0: NVIDIA H200 (139.8 GiB, ...)"), or says why
    CUDA is not usable: then the text starts with CUDA_NOT_USABLE (no libcuda, no such device).
    It never raises for a missing GPU."""
    try:
        return _native.cuda_status(device)
    except RuntimeError as e:
        return f"{CUDA_NOT_USABLE}{e}"


def is_enabled() -> bool:
    """Whether cachalot is this process's CUDA allocator."""
    return _enabled


def enable(config: str | None = None, *, snapshot_on_oom: str | None = None, patch_torch: bool = True,
           shim: bool = True, _record_stream_hook: bool = True) -> None:
    """Makes cachalot the CUDA allocator of this process. Call it before the first CUDA tensor.

    config: allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (default: that variable).
    snapshot_on_oom: a path; an allocation that runs out of memory writes a snapshot pickle there
        before torch.OutOfMemoryError is raised.
    patch_torch: route torch.cuda's memory functions to cachalot (PATCHED_TORCH_FUNCTIONS).
    shim: install through the C++ shim (built once with torch.utils.cpp_extension, cached), which
        wires record_stream, empty_cache, the memory fraction, private pools (CUDA graphs,
        MemPool), cacheInfo (cudnn.benchmark), and raises a failed allocation
        (torch.OutOfMemoryError, or RuntimeError).
        shim=False uses torch.cuda.memory.CUDAPluggableAllocator (alloc and free only):
        Tensor.record_stream is then not honoured, a failed allocation is a null pointer
        PyTorch does not check, and graphs, MemPool and cudnn.benchmark are refused; use it only
        where no compiler is available.
    """
    global _enabled
    if _enabled:
        return
    try:
        import torch
    except ImportError as e:
        raise RuntimeError("cachalot_torch.enable() needs PyTorch (with CUDA) installed") from e
    if not torch.cuda.is_available():
        reason = cuda_status(0)
        raise RuntimeError(
            f"cachalot_torch: CUDA is not available, so there is no CUDA allocator to replace "
            f"(torch {torch.__version__}, torch.version.cuda={torch.version.cuda}; "
            f"torch.cuda.is_available() is False; cachalot: {reason})")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "cachalot_torch.enable() must run before the first CUDA tensor: PyTorch cannot replace an "
            "allocator it has already initialized")
    if shim:
        _check_shim_tools()
    settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") if config is None else config
    _native.configure(settings, None, snapshot_on_oom)
    addresses = _native.function_addresses()
    if shim:
        library = _load_shim(torch)
        error = ctypes.create_string_buffer(4096)
        functions = (ctypes.c_size_t * len(SHIM_FUNCTIONS))(*(addresses[name] for name in SHIM_FUNCTIONS))
        status = library.cachalot_torch_shim_install(
            functions, len(SHIM_FUNCTIONS), int(_record_stream_hook), error, ctypes.sizeof(error))
        if status != 0:
            raise RuntimeError(f"cachalot_torch: installing the allocator failed: {error.value.decode()}")
    else:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            _native.__file__, "cachalot_torch_alloc", "cachalot_torch_free")
        torch.cuda.memory.change_current_allocator(allocator)
        # PyTorch's pool hooks are C++ only: without the shim a capture would allocate from the
        # default pools.
        _refuse_private_pools(torch)
    if patch_torch:
        _patch(torch, hooks_wired=shim)
    _enabled = True


PRIVATE_POOL_ERROR = (
    "cachalot_torch: CUDA graph capture and torch.cuda.MemPool allocate into a private memory pool, "
    "which reaches cachalot only through its C++ shim: enable() without shim=False (it needs a C++ "
    "compiler once).")


def _refuse_private_pools(torch) -> None:
    """CUDA graph capture and MemPool: a RuntimeError when they start, in Python, before PyTorch
    sets up a private pool the pluggable allocator cannot serve. (A capture begun below this
    guard, from torch._C or C++, gets the allocator's own refusal at its first allocation.)"""

    def capture_begin(self, *args, **kwargs):
        raise RuntimeError(PRIVATE_POOL_ERROR)

    def mem_pool(self, *args, **kwargs):
        raise RuntimeError(PRIVATE_POOL_ERROR)

    torch.cuda.CUDAGraph.capture_begin = capture_begin
    torch.cuda.MemPool.__init__ = mem_pool


def _check_shim_tools() -> None:
    """What building the shim needs, checked before torch.utils.cpp_extension fails deep inside:
    a C++ compiler, ninja, and the CUDA toolkit torch's extension builder finds (CUDA_HOME)."""
    from torch.utils import cpp_extension

    without = "or call enable(shim=False), which needs none of it but loses record_stream and raised OOMs"
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        where = "$CXX" if os.environ.get("CXX") else "c++"
        raise RuntimeError(
            f"cachalot_torch.enable() builds a small C++ shim against this torch the first time (cached after), "
            f"and needs a C++ compiler: {where} ({compiler!r}) is not on PATH. Install g++ (Debian/Ubuntu: "
            f"apt install build-essential; Fedora/RHEL: dnf install gcc-c++), {without}")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError(
            "cachalot_torch.enable() builds a small C++ shim against this torch the first time (cached after) "
            f"with torch.utils.cpp_extension, which needs ninja: pip install ninja, {without}")
    if cpp_extension.CUDA_HOME is None:
        raise RuntimeError(
            "cachalot_torch.enable() builds a small C++ shim against this torch the first time (cached after) "
            "with torch.utils.cpp_extension, which needs the CUDA toolkit's headers and did not find them: set "
            f"CUDA_HOME to the toolkit (the folder with include/cuda_runtime.h), {without}")


def _load_shim(torch):
    """Builds (once per torch version and shim source) and loads the C++ shim."""
    from torch.utils import cpp_extension

    source = os.path.join(os.path.dirname(__file__), "shim.cpp")
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read() + torch.__version__.encode()).hexdigest()[:16]
    root = os.environ.get("CACHALOT_TORCH_SHIM_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "cachalot_torch")
    build = os.path.join(root, f"shim-{digest}")
    os.makedirs(build, exist_ok=True)
    name = "cachalot_torch_shim"
    cpp_extension.load(name=name, sources=[source], extra_cflags=["-O2"], with_cuda=True,
                       is_python_module=False, build_directory=build, verbose=False)
    library = ctypes.CDLL(os.path.join(build, f"{name}.so"))
    library.cachalot_torch_shim_install.restype = ctypes.c_int
    library.cachalot_torch_shim_install.argtypes = [
        ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    return library


def _nested(flat: dict) -> dict:
    """memory_stats' flat keys ("allocated_bytes.all.current") as torch._C returns them, nested."""
    nested: dict = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def _patch(torch, hooks_wired: bool) -> None:
    C = torch._C

    def memory_stats(device):
        return _nested(_native.memory_stats(device))

    def memory_snapshot(arg=None):
        include_traces = True if arg is None else bool(arg[2]) if len(arg) > 2 else True
        return pickle.loads(_native.snapshot_pickle(include_traces))

    def record_history(enabled, context=None, stacks=None, max_entries=sys.maxsize, clear_history=False,
                       compile_context=False, global_record_annotations=False, skip_actions=()):
        _native.record_memory_history(enabled is not None, min(int(max_entries), sys.maxsize),
                                      list(skip_actions or ()), bool(clear_history),
                                      _stacks(context, stacks or "python"))

    def record_history_legacy(enabled, *args, **kwargs):
        max_entries = args[1] if len(args) > 1 else kwargs.get("trace_alloc_max_entries", 1)
        _native.record_memory_history(bool(enabled), int(max_entries), [], False)

    C._cuda_memoryStats = memory_stats
    C._cuda_resetPeakMemoryStats = _native.reset_peak_memory_stats
    C._cuda_resetAccumulatedMemoryStats = _native.reset_accumulated_memory_stats
    C._cuda_memorySnapshot = memory_snapshot
    C._cuda_record_memory_history = record_history
    C._cuda_record_memory_history_legacy = record_history_legacy
    C._cuda_getMemoryFraction = _native.memory_fraction
    if not hooks_wired:
        C._cuda_emptyCache = _native.empty_cache
        C._cuda_setMemoryFraction = _native.set_memory_fraction


def _device(device) -> int:
    if device is None:
        try:
            import torch
            return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        except ImportError:
            return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is not None:
        return index
    if isinstance(device, str) and ":" in device:
        return int(device.split(":", 1)[1])
    return _device(None)


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats: PyTorch's flat, sorted keys ("allocated_bytes.all.current", ...)."""
    return dict(_native.memory_stats(_device(device)))


def memory_allocated(device=None) -> int:
    """Bytes of live tensors (torch.cuda.memory_allocated)."""
    return _native.memory_stats(_device(device))["allocated_bytes.all.current"]


def memory_reserved(device=None) -> int:
    """Bytes the allocator holds from the device (torch.cuda.memory_reserved)."""
    return _native.memory_stats(_device(device))["reserved_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated since start or reset_peak_memory_stats."""
    return _native.memory_stats(_device(device))["allocated_bytes.all.peak"]


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved since start or reset_peak_memory_stats."""
    return _native.memory_stats(_device(device))["reserved_bytes.all.peak"]


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary's table."""
    return _native.memory_summary(_device(device), abbreviated)


def reset_peak_memory_stats(device=None) -> None:
    """torch.cuda.reset_peak_memory_stats."""
    _native.reset_peak_memory_stats(_device(device))


def reset_accumulated_memory_stats(device=None) -> None:
    """torch.cuda.reset_accumulated_memory_stats."""
    _native.reset_accumulated_memory_stats(_device(device))


def empty_cache() -> None:
    """Releases every unused cached segment of every device (torch.cuda.empty_cache)."""
    _native.empty_cache()


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Caps the device's reserved memory at `fraction` of its total."""
    _native.set_memory_fraction(float(fraction), _device(device))


def _stacks(context, stacks) -> str:
    """PyTorch's (context, stacks) of _record_memory_history as the native side's choice: whose
    Python stacks to record ("off", "alloc" or "all"). stacks="all" asks for C++ frames too,
    which are not recorded: its Python frames are."""
    if context is None:
        return "off"
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks is 'python' or 'all', not {stacks!r}")
    if context == "all":
        return "all"
    if context in ("alloc", "state"):
        return "alloc"
    raise ValueError(f"context is None, 'state', 'alloc' or 'all', not {context!r}")


def record_memory_history(enabled: str | bool | None = "all", context: str | None = "all", stacks: str = "python",
                          max_entries: int = sys.maxsize, skip_actions=(), clear_history: bool = False) -> None:
    """torch.cuda.memory._record_memory_history: on ("all" or True) or off (None or False).
    context: whose Python stacks are recorded, as PyTorch's: "all" (allocations and frees),
    "alloc" or "state" (allocations), None (none). Gathering a stack takes the GIL and walks the
    frames on every allocation while the history is on."""
    on = enabled is not None and enabled is not False
    _native.record_memory_history(on, min(int(max_entries), sys.maxsize), list(skip_actions), clear_history,
                                  _stacks(context, stacks))


def snapshot(include_traces: bool = True) -> dict:
    """torch.cuda.memory._snapshot(): segments of every device and each device's history."""
    return pickle.loads(_native.snapshot_pickle(include_traces))


NOT_THE_ALLOCATOR = (
    "cachalot is not this process's CUDA allocator, so it has nothing to snapshot: call "
    "cachalot_torch.enable() before the first CUDA tensor (for PyTorch's own allocator, use "
    "torch.cuda.memory._dump_snapshot)")


def dump_snapshot(path: str = "dump_snapshot.pickle") -> None:
    """Writes the snapshot as PyTorch's pickle (torch.cuda.memory._dump_snapshot): it opens in
    torch.cuda._memory_viz, pytorch.org/memory_viz and `cachalot view`. Raises RuntimeError
    (NOT_THE_ALLOCATOR), writing nothing, when cachalot has served no device: enable() was not
    called and nothing called its C functions."""
    if not _enabled and not _native.devices():
        raise RuntimeError(NOT_THE_ALLOCATOR)
    data = _native.snapshot_pickle(True)
    with open(path, "wb") as f:
        f.write(data)
