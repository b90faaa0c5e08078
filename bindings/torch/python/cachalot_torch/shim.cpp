// cachalot_torch's C++ shim: installs cachalot as PyTorch's CUDA allocator with the parts of
// PyTorch 2.11's allocator interface that Python cannot reach. torch.cuda.memory.CUDAPluggableAllocator
// takes alloc and free only, and CUDAPluggableAllocator itself refuses cacheInfo (cuDNN's
// autotuner), createOrIncrefPool (torch.cuda.MemPool), getPoolUseCount,
// checkPoolLiveAllocations, getCheckpointState and setCheckpointPoolState (CUDA-graph trees).
// The shim subclasses it and sends each of those to the Rust library. Built at first use by torch.utils.cpp_extension, against the torch that runs,
// and loaded as a plain shared library; the Rust library's C functions arrive as addresses, so
// nothing here links against it.
//
// - alloc: a null pointer for a non-empty request is a failure; PyTorch does not check for it
//   (CUDAPluggableAllocator::malloc stores and returns whatever alloc_fn gives), so it is raised
//   here: c10::OutOfMemoryError (Python: torch.OutOfMemoryError) with PyTorch's message, which
//   the allocator wrote, or c10::Error (RuntimeError) for anything else. While allocations are
//   routed to a pool (a graph capture), alloc runs in relaxed capture mode, as PyTorch's
//   cudaMallocMaybeCapturing does: a segment allocated during a global-mode capture is legal.
// - record_stream (Tensor.record_stream) and the memory fraction go to the allocator through
//   CUDAPluggableAllocator's setters.
// - Private pools (CUDA graphs, MemPool): beginAllocateToPool's filter stays here, on the heap;
//   the allocator asks it, through `filter_accepts`, before each request while the pool is
//   routed to, and frees it through `filter_release` when the routing ends.
// - Checkpoints (CUDA-graph trees): the allocator keeps each one; the AllocatorState PyTorch
//   holds names it and drops it when PyTorch does.
// - Every hook that fails raises RuntimeError with the allocator's reason.

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

using AllocFn = void* (*)(size_t, int, cudaStream_t);
using FreeFn = void (*)(void*, size_t, int, cudaStream_t);
using RecordStreamFn = void (*)(void*, cudaStream_t);
using MemoryFractionFn = void (*)(double, int);
using LastErrorFn = const char* (*)(int*);
using PoolFn = int (*)(int, uint64_t, uint64_t);
using FilterAcceptsFn = int (*)(void*, void*);
using FilterReleaseFn = void (*)(void*);
using BeginPoolFn = int (*)(int, uint64_t, uint64_t, FilterAcceptsFn, FilterReleaseFn, void*);
using EmptyPoolCacheFn = int (*)(uint64_t, uint64_t);
using PoolUseCountFn = int64_t (*)(int, uint64_t, uint64_t);
using PoolLiveFn = int (*)(int, uint64_t, uint64_t, const uint64_t*, size_t);
using CacheInfoFn = int (*)(int, size_t*);
using EnablePoolHooksFn = void (*)();
using PoolCheckpointFn = uint64_t (*)(int, uint64_t, uint64_t);
using CheckpointDropFn = void (*)(int, uint64_t);
using RestoreSinkFn = void (*)(void*, int, void*, size_t, void*);
using PoolRestoreFn = int (*)(int, uint64_t, RestoreSinkFn, void*);

constexpr int kOutOfMemory = 1;

// The Rust library's functions, in the order the Python package passes their addresses
// (`cachalot_torch.SHIM_FUNCTIONS`).
struct Functions {
  AllocFn alloc;
  FreeFn release;
  RecordStreamFn record_stream;
  MemoryFractionFn memory_fraction;
  LastErrorFn last_error;
  PoolFn create_pool;
  BeginPoolFn begin_allocate_to_pool;
  PoolFn end_allocate_to_pool;
  PoolFn release_pool;
  EmptyPoolCacheFn empty_pool_cache;
  PoolUseCountFn pool_use_count;
  PoolLiveFn pool_live_allocations_are;
  CacheInfoFn cache_info;
  EnablePoolHooksFn enable_pool_hooks;
  PoolCheckpointFn pool_checkpoint;
  CheckpointDropFn checkpoint_drop;
  PoolRestoreFn pool_restore;
};
constexpr size_t kFunctionCount = sizeof(Functions) / sizeof(void*);

using Filter = std::function<bool(cudaStream_t)>;

int filter_accepts(void* filter, void* stream) {
  try {
    return (*static_cast<Filter*>(filter))(static_cast<cudaStream_t>(stream)) ? 1 : 0;
  } catch (...) {
    // PyTorch's capture filter asks cudaStreamGetCaptureInfo; a stream it cannot ask is not
    // part of the capture.
    return 0;
  }
}

void filter_release(void* filter) {
  delete static_cast<Filter*>(filter);
}

// A checkpoint of a private pool (getCheckpointState), kept by the allocator under `handle`
// until PyTorch drops this object.
struct PoolCheckpoint : c10::cuda::CUDACachingAllocator::AllocatorState {
  PoolCheckpoint(CheckpointDropFn drop, c10::DeviceIndex device, uint64_t handle)
      : drop(drop), device(device), handle(handle) {}
  ~PoolCheckpoint() override {
    drop(device, handle);
  }
  PoolCheckpoint(const PoolCheckpoint&) = delete;
  PoolCheckpoint& operator=(const PoolCheckpoint&) = delete;

  CheckpointDropFn drop;
  c10::DeviceIndex device;
  uint64_t handle;
};

// What a restore told its sink: the pointers freed, then those handed out.
struct Restored {
  struct Block {
    void* ptr;
    size_t size;
    cudaStream_t stream;
  };
  std::vector<void*> freed;
  std::vector<Block> allocated;
  bool failed = false;
};

void restore_sink(void* context, int allocated, void* ptr, size_t size, void* stream) {
  auto* restored = static_cast<Restored*>(context);
  try {
    if (allocated != 0) {
      restored->allocated.push_back({ptr, size, static_cast<cudaStream_t>(stream)});
    } else {
      restored->freed.push_back(ptr);
    }
  } catch (...) {
    // Nothing may unwind into the Rust library; the restore is reported failed below.
    restored->failed = true;
  }
}

// Pools allocations are routed to now, on any device: while there is one, alloc runs in relaxed
// capture mode.
std::atomic<int> routed_pools{0};

// A block setCheckpointPoolState restored, which the next allocation on this thread returns
// instead of allocating (see CachalotAllocator::setCheckpointPoolState).
thread_local void* adopted_block = nullptr;

class CachalotAllocator : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  using Base = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

  CachalotAllocator(const Functions& f)
      : Base(
            [f](size_t size, int device, cudaStream_t stream) -> void* {
              if (adopted_block != nullptr) {  // setCheckpointPoolState's restored block
                return std::exchange(adopted_block, nullptr);
              }
              void* ptr = nullptr;
              if (routed_pools.load(std::memory_order_relaxed) > 0) {
                c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
                ptr = f.alloc(size, device, stream);
              } else {
                ptr = f.alloc(size, device, stream);
              }
              if (ptr == nullptr && size != 0) {
                int kind = 0;
                const char* message = f.last_error(&kind);
                if (kind == kOutOfMemory) {
                  TORCH_CHECK_WITH(OutOfMemoryError, false, message);
                }
                TORCH_CHECK(false, "cachalot_torch: ", message);
              }
              return ptr;
            },
            [f](void* ptr, size_t size, int device, cudaStream_t stream) { f.release(ptr, size, device, stream); }),
        f_(f) {}

  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    check(f_.cache_info(device, largestBlock));
  }

  void emptyCache(c10::cuda::MempoolId_t mempool_id) override {
    check(f_.empty_pool_cache(mempool_id.first, mempool_id.second));
  }

  void createOrIncrefPool(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id,
      std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator) override {
    TORCH_CHECK(
        allocator == nullptr || allocator.get() == this,
        "cachalot_torch: a MemPool with an allocator of its own is not supported (cachalot serves every "
        "pool itself); make the MemPool without `allocator`");
    check(f_.create_pool(device, mempool_id.first, mempool_id.second));
  }

  void beginAllocateToPool(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id,
      std::function<bool(cudaStream_t)> filter) override {
    auto* held = new Filter(std::move(filter));
    // On failure the allocator has already released the filter.
    check(f_.begin_allocate_to_pool(device, mempool_id.first, mempool_id.second, &filter_accepts, &filter_release, held));
    routed_pools.fetch_add(1, std::memory_order_relaxed);
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override {
    check(f_.end_allocate_to_pool(device, mempool_id.first, mempool_id.second));
    routed_pools.fetch_sub(1, std::memory_order_relaxed);
  }

  void releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override {
    check(f_.release_pool(device, mempool_id.first, mempool_id.second));
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override {
    int64_t count = f_.pool_use_count(device, mempool_id.first, mempool_id.second);
    if (count < 0) {
      fail();
    }
    return static_cast<int>(count);
  }

  void setUseOnOOM(c10::DeviceIndex /*device*/, c10::cuda::MempoolId_t /*mempool_id*/, bool use_on_oom) override {
    TORCH_CHECK(!use_on_oom, "cachalot_torch: MemPool(use_on_oom=True) is not supported");
  }

  void setNoSplit(c10::DeviceIndex /*device*/, c10::cuda::MempoolId_t /*mempool_id*/) override {
    TORCH_CHECK(false, "cachalot_torch: MemPool(no_split=True) is not supported");
  }

  bool checkPoolLiveAllocations(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override {
    std::vector<uint64_t> expected;
    expected.reserve(expected_live_allocations.size());
    for (void* ptr : expected_live_allocations) {
      expected.push_back(reinterpret_cast<uint64_t>(ptr));
    }
    int same = f_.pool_live_allocations_are(device, mempool_id.first, mempool_id.second, expected.data(), expected.size());
    if (same < 0) {
      fail();
    }
    return same == 1;
  }

  // A copy between devices. CUDAPluggableAllocator copies with cudaMemcpyAsync, which fails with
  // "invalid argument" for memory mapped through the virtual-memory API (cuMemMap: expandable
  // segments, policy:cachalot's pages) unless that memory was made accessible to the peer. As
  // PyTorch's own allocator does, such copies go through cudaMemcpyPeerAsync, which takes memory
  // of either kind.
  cudaError_t memcpyAsync(
      void* dst,
      int dstDevice,
      const void* src,
      int srcDevice,
      size_t count,
      cudaStream_t stream,
      bool /*p2p_enabled*/) override {
    if (srcDevice == dstDevice) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  // CUDA-graph trees (torch.compile's mode="reduce-overhead") take a checkpoint of a graph's pool
  // after recording it, and restore it to record a graph off the current path (a new shape or
  // branch). The checkpoint stays in the allocator; PyTorch holds its handle.
  std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> getCheckpointState(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t id) override {
    uint64_t handle = f_.pool_checkpoint(device, id.first, id.second);
    if (handle == 0) {
      fail();
    }
    return std::make_shared<PoolCheckpoint>(f_.checkpoint_drop, device, handle);
  }

  // As PyTorch's allocator: the pointers freed leave this allocator's records (their storages'
  // deleters are removed by the caller), and each block allocated at the checkpoint comes back
  // as a DataPtr whose deleter frees it through cachalot, as `allocate` would have made it.
  c10::cuda::CUDACachingAllocator::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device,
      std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> pps) override {
    auto checkpoint = std::dynamic_pointer_cast<PoolCheckpoint>(pps);
    TORCH_CHECK(checkpoint, "cachalot_torch: setCheckpointPoolState takes a checkpoint cachalot's getCheckpointState made");
    TORCH_CHECK(
        checkpoint->device == device, "cachalot_torch: a checkpoint of device ", static_cast<int>(checkpoint->device),
        " restored on device ", static_cast<int>(device));
    Restored restored;
    check(f_.pool_restore(device, checkpoint->handle, &restore_sink, &restored));
    TORCH_CHECK(!restored.failed, "cachalot_torch: setCheckpointPoolState: out of host memory for its result");

    c10::cuda::CUDACachingAllocator::CheckpointDelta delta;
    delta.ptrs_freed = restored.freed;
    delta.dataptrs_allocd.reserve(restored.allocated.size());
    {
      // Freed first: a pointer may be freed and handed out again.
      const std::lock_guard<std::mutex> lock(allocator_mutex_);
      for (void* ptr : restored.freed) {
        allocation_metadata_.erase(ptr);
      }
    }
    for (const auto& block : restored.allocated) {
      // The block is cachalot's already; Base::malloc records it (libtorch does not export
      // _AllocationMetadata's constructors, so the shim cannot write the record itself) while
      // the alloc function hands it over instead of allocating.
      adopted_block = block.ptr;
      void* ptr = Base::malloc(block.size, device, block.stream);
      TORCH_CHECK(ptr == block.ptr, "cachalot_torch: setCheckpointPoolState: a restored block was not adopted");
      delta.dataptrs_allocd.emplace_back(ptr, ptr, raw_deleter(), c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  std::string name() override {
    return "cachalot";
  }

 private:
  void check(int status) {
    if (status != 0) {
      fail();
    }
  }

  [[noreturn]] void fail() {
    int kind = 0;
    const char* message = f_.last_error(&kind);
    TORCH_CHECK(false, "cachalot_torch: ", message);
    std::terminate();  // not reached: TORCH_CHECK(false) throws
  }

  Functions f_;
};

}  // namespace

extern "C" {

// Installs the allocator. `functions` holds `count` addresses of the Rust library's C functions
// in the order of `Functions`. Returns 0, or 1 with the reason in `error` (PyTorch's allocator was
// already initialized, a list of another length, ...). `wire_record_stream` 0 leaves
// Tensor.record_stream unheard (only for the test that shows what the hook prevents).
int cachalot_torch_shim_install(
    const uintptr_t* functions,
    size_t count,
    int wire_record_stream,
    char* error,
    size_t error_size) {
  try {
    TORCH_CHECK(
        count == kFunctionCount, "the shim takes ", kFunctionCount, " functions, the package passed ", count,
        ": the shim and the package are of different versions");
    Functions f{};
    static_assert(sizeof(Functions) == kFunctionCount * sizeof(uintptr_t), "Functions holds function pointers only");
    std::memcpy(&f, functions, sizeof(Functions));
    auto allocator = std::make_shared<CachalotAllocator>(f);
    allocator->set_memory_fraction_fn([f](double fraction, int device) { f.memory_fraction(fraction, device); });
    if (wire_record_stream != 0) {
      allocator->set_record_stream_fn([f](void* ptr, cudaStream_t stream) { f.record_stream(ptr, stream); });
    }
    allocator->init(0);
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    f.enable_pool_hooks();
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
    return 1;
  }
}

}  // extern "C"
