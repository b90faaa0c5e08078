// cachalot_torch's C++ shim: installs cachalot as PyTorch's CUDA allocator with the hooks that
// PyTorch 2.11's CUDAPluggableAllocator only offers to C++ (torch.cuda.memory.CUDAPluggableAllocator
// takes alloc and free only). Built at first use by torch.utils.cpp_extension, against the torch
// that runs, and loaded as a plain shared library; the Rust library's C functions arrive as
// addresses, so nothing here links against it.
//
// - alloc: a null pointer for a non-empty request is a failure; PyTorch does not check for it
//   (CUDAPluggableAllocator::malloc stores and returns whatever alloc_fn gives), so it is raised
//   here: c10::OutOfMemoryError (Python: torch.OutOfMemoryError) with PyTorch's message, which
//   the allocator wrote, or c10::Error (RuntimeError) for anything else.
// - record_stream (Tensor.record_stream), reset (torch.cuda.empty_cache) and memory fraction
//   (torch.cuda.set_per_process_memory_fraction) go to the allocator.
// - CUDA graph capture: the allocator itself refuses an allocation on a capturing stream (it asks
//   the stream, cuStreamIsCapturing), and the refusal is raised here as any other failure
//   (RuntimeError); the begin/end_allocate_to_pool hooks are left unset.

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>

namespace {

using AllocFn = void* (*)(size_t, int, cudaStream_t);
using FreeFn = void (*)(void*, size_t, int, cudaStream_t);
using RecordStreamFn = void (*)(void*, cudaStream_t);
using EmptyCacheFn = void (*)();
using MemoryFractionFn = void (*)(double, int);
using LastErrorFn = const char* (*)(int*);

constexpr int kOutOfMemory = 1;

}  // namespace

extern "C" {

// Installs the allocator. Returns 0, or 1 with the reason in `error` (PyTorch's allocator was
// already initialized, ...). `wire_record_stream` 0 leaves Tensor.record_stream unheard (only
// for the test that shows what the hook prevents).
int cachalot_torch_shim_install(
    uintptr_t alloc_address,
    uintptr_t free_address,
    uintptr_t record_stream_address,
    uintptr_t empty_cache_address,
    uintptr_t memory_fraction_address,
    uintptr_t last_error_address,
    int wire_record_stream,
    char* error,
    size_t error_size) {
  try {
    auto alloc = reinterpret_cast<AllocFn>(alloc_address);
    auto release = reinterpret_cast<FreeFn>(free_address);
    auto record_stream = reinterpret_cast<RecordStreamFn>(record_stream_address);
    auto empty_cache = reinterpret_cast<EmptyCacheFn>(empty_cache_address);
    auto memory_fraction = reinterpret_cast<MemoryFractionFn>(memory_fraction_address);
    auto last_error = reinterpret_cast<LastErrorFn>(last_error_address);

    auto allocator = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
        [alloc, last_error](size_t size, int device, cudaStream_t stream) -> void* {
          void* ptr = alloc(size, device, stream);
          if (ptr == nullptr && size != 0) {
            int kind = 0;
            const char* message = last_error(&kind);
            if (kind == kOutOfMemory) {
              TORCH_CHECK_WITH(OutOfMemoryError, false, message);
            }
            TORCH_CHECK(false, "cachalot_torch: ", message);
          }
          return ptr;
        },
        [release](void* ptr, size_t size, int device, cudaStream_t stream) {
          release(ptr, size, device, stream);
        });
    auto pluggable =
        std::dynamic_pointer_cast<torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator>(allocator);
    TORCH_CHECK(pluggable, "createCustomAllocator did not make a CUDAPluggableAllocator");
    pluggable->set_reset_fn([empty_cache]() { empty_cache(); });
    pluggable->set_memory_fraction_fn([memory_fraction](double fraction, int device) {
      memory_fraction(fraction, device);
    });
    if (wire_record_stream != 0) {
      pluggable->set_record_stream_fn([record_stream](void* ptr, cudaStream_t stream) {
        record_stream(ptr, stream);
      });
    }
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
    return 1;
  }
}

}  // extern "C"
