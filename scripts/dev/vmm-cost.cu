// What backing GiBs of memory costs in the driver's calls: one cudaMalloc, or the virtual-memory
// calls expandable segments and policy:cachalot make (cuMemCreate + cuMemMap per page, one
// cuMemSetAccess per mapped range), at several page sizes; and the unmap side.
//
//   nvcc -O2 -o vmm-cost scripts/dev/vmm-cost.cu -lcuda -lpthread && ./vmm-cost [GIB]
//
// Prints one line per way: microseconds in all and per page, split by call.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

static void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) {
        const char* s = nullptr;
        cuGetErrorString(r, &s);
        std::fprintf(stderr, "%s: %s\n", what, s ? s : "?");
        std::exit(1);
    }
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Pinned memory on device 0, no shareable handle (as PyTorch's and cachalot's pages).
static CUmemAllocationProp device_memory() {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

// Read and write access for device 0.
static CUmemAccessDesc read_write() {
    CUmemAccessDesc access = {};
    access.location = device_memory().location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return access;
}

// Unmaps and releases every page of a reservation, then frees it (untimed).
static void give_back(CUdeviceptr base, size_t total, size_t page, const std::vector<CUmemGenericAllocationHandle>& handles) {
    for (size_t i = 0; i < handles.size(); i++) {
        check(cuMemUnmap(base + i * page, page), "cuMemUnmap");
        check(cuMemRelease(handles[i]), "cuMemRelease");
    }
    check(cuMemAddressFree(base, total), "cuMemAddressFree");
}

static void pages(size_t whole, size_t page) {
    size_t total = whole / page * page;  // whole pages only
    CUmemAllocationProp prop = device_memory();
    CUdeviceptr base;
    check(cuMemAddressReserve(&base, total, 0, 0, 0), "cuMemAddressReserve");
    size_t n = total / page;
    std::vector<CUmemGenericAllocationHandle> handles(n);
    double t0 = now_us();
    for (size_t i = 0; i < n; i++) check(cuMemCreate(&handles[i], page, &prop, 0), "cuMemCreate");
    double t1 = now_us();
    for (size_t i = 0; i < n; i++) check(cuMemMap(base + i * page, page, 0, handles[i], 0), "cuMemMap");
    double t2 = now_us();
    CUmemAccessDesc access = read_write();
    check(cuMemSetAccess(base, total, &access, 1), "cuMemSetAccess");
    double t3 = now_us();
    check(cuMemsetD8(base, 1, total), "cuMemsetD8");  // touch it: the memory is really there
    check(cuCtxSynchronize(), "sync");
    double t4 = now_us();
    for (size_t i = 0; i < n; i++) check(cuMemUnmap(base + i * page, page), "cuMemUnmap");
    double t5 = now_us();
    for (size_t i = 0; i < n; i++) check(cuMemRelease(handles[i]), "cuMemRelease");
    double t6 = now_us();
    check(cuMemAddressFree(base, total), "cuMemAddressFree");
    std::printf("pages of %8zu KiB x %6zu: create %9.0f us, map %8.0f, set access %7.0f (memset %6.0f), "
                "unmap %8.0f, release %8.0f; map side %7.1f us/page, %8.0f us in all\n",
                page >> 10, n, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, (t3 - t0) / n, t3 - t0);
}

static void per_page_access(size_t total, size_t page) {
    // Each page created, mapped and granted on its own, against pages() granting the range once.
    CUmemAllocationProp prop = device_memory();
    CUmemAccessDesc access = read_write();
    CUdeviceptr base;
    check(cuMemAddressReserve(&base, total, 0, 0, 0), "cuMemAddressReserve");
    size_t n = total / page;
    std::vector<CUmemGenericAllocationHandle> handles(n);
    double t0 = now_us();
    for (size_t i = 0; i < n; i++) {
        check(cuMemCreate(&handles[i], page, &prop, 0), "cuMemCreate");
        check(cuMemMap(base + i * page, page, 0, handles[i], 0), "cuMemMap");
        check(cuMemSetAccess(base + i * page, page, &access, 1), "cuMemSetAccess");
    }
    double t1 = now_us();
    give_back(base, total, page, handles);
    std::printf("pages of %8zu KiB x %6zu, access granted per page: %7.1f us/page, %8.0f us in all\n", page >> 10, n,
                (t1 - t0) / n, t1 - t0);
}

static void threaded_create(size_t total, size_t page, unsigned threads) {
    // Whether the driver creates and maps pages on several threads at once (each thread makes the
    // context current; pages are disjoint).
    CUcontext ctx;
    check(cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
    CUmemAllocationProp prop = device_memory();
    CUdeviceptr base;
    check(cuMemAddressReserve(&base, total, 0, 0, 0), "cuMemAddressReserve");
    size_t n = total / page;
    std::vector<CUmemGenericAllocationHandle> handles(n);
    double t0 = now_us();
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; t++) {
        pool.emplace_back([&, t] {
            check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
            for (size_t i = t; i < n; i += threads) {
                check(cuMemCreate(&handles[i], page, &prop, 0), "cuMemCreate");
                check(cuMemMap(base + i * page, page, 0, handles[i], 0), "cuMemMap");
            }
        });
    }
    for (auto& th : pool) th.join();
    CUmemAccessDesc access = read_write();
    check(cuMemSetAccess(base, total, &access, 1), "cuMemSetAccess");
    double t1 = now_us();
    give_back(base, total, page, handles);
    std::printf("pages of %8zu KiB x %6zu, created and mapped on %u threads: %7.1f us/page, %8.0f us in all\n",
                page >> 10, n, threads, (t1 - t0) / n, t1 - t0);
}

int main(int argc, char** argv) {
    size_t gib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 14;
    size_t total = gib << 30;
    check(cuInit(0), "cuInit");
    cudaFree(nullptr);  // the runtime's primary context, current on this thread
    for (int round = 0; round < 2; round++) {
        void* p = nullptr;
        double t0 = now_us();
        if (cudaMalloc(&p, total) != cudaSuccess) return 1;
        double t1 = now_us();
        cudaMemset(p, 1, total);
        cudaDeviceSynchronize();
        double t2 = now_us();
        cudaFree(p);
        double t3 = now_us();
        std::printf("cudaMalloc of %zu GiB (round %d): %8.0f us, cudaFree %8.0f us\n", gib, round, t1 - t0, t3 - t2);
    }
    for (int round = 0; round < 2; round++) {
        for (size_t page : {size_t(2) << 20, size_t(20) << 20, size_t(64) << 20, size_t(512) << 20, total})
            pages(total, page);
    }
    per_page_access(total, size_t(2) << 20);
    for (unsigned threads : {1u, 2u, 4u, 8u}) threaded_create(total, size_t(2) << 20, threads);
    return 0;
}
