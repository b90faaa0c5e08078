// What CUDA's virtual memory management calls cost per 2 MiB page on this GPU: the calls
// cachalot's CUDA backend (backends/cuda/src/vmm.rs) makes to map and unmap expandable-segment
// pages, one physical allocation per page as PyTorch's ExpandableSegment does, against the same
// bytes in 64 MiB allocations; and whether the driver unmaps part of one mapping (it does not).
// BENCHMARKS.md §3 ("What a page costs on CUDA") has the figures and what they mean for
// `policy:cachalot`.
//
//   nvcc -O2 -o vmm_cost scripts/dev/vmm_cost.cu -lcuda && ./vmm_cost      (GPU machine; uses 512 MiB)
#include <cuda.h>
#include <cstdio>
#include <chrono>
#include <vector>
#include <algorithm>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorString(r, &s); printf("%s: %s\n", #x, s); return 1; } } while (0)
static double now() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
  size_t gran; CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t page = 2 << 20; const int N = 256; // 512 MiB
  CUdeviceptr base; CK(cuMemAddressReserve(&base, page * N, 0, 0, 0));
  CUmemAccessDesc acc = {}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUstream st; CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  std::vector<CUmemGenericAllocationHandle> h(N);
  for (int round = 0; round < 4; round++) {
    double t0 = now(); for (int i = 0; i < N; i++) CK(cuMemCreate(&h[i], page, &prop, 0));
    double t1 = now(); for (int i = 0; i < N; i++) CK(cuMemMap(base + i * page, page, 0, h[i], 0));
    double t2 = now(); for (int i = 0; i < N; i++) CK(cuMemSetAccess(base + i * page, page, &acc, 1));
    double t3 = now(); CK(cuStreamSynchronize(st));
    double t4 = now(); for (int i = 0; i < N; i++) CK(cuMemUnmap(base + i * page, page));
    double t5 = now(); for (int i = 0; i < N; i++) CK(cuMemRelease(h[i]));
    double t6 = now();
    printf("round %d per 2MiB page (us): create %.2f map %.2f setaccess(page) %.2f unmap %.2f release %.2f | streamsync %.2f\n", round,
      (t1-t0)/N, (t2-t1)/N, (t3-t2)/N, (t5-t4)/N, (t6-t5)/N, t4-t3);
  }
  // set access once for 32 pages, unmap per page; and reuse handles (no create/release)
  for (int i = 0; i < N; i++) CK(cuMemCreate(&h[i], page, &prop, 0));
  for (int round = 0; round < 4; round++) {
    double t0 = now(); for (int i = 0; i < N; i++) CK(cuMemMap(base + i * page, page, 0, h[i], 0));
    double t1 = now(); for (int i = 0; i < N; i += 32) CK(cuMemSetAccess(base + i * page, 32 * page, &acc, 1));
    double t2 = now(); for (int i = 0; i < N; i++) CK(cuMemUnmap(base + i * page, page));
    double t3 = now();
    printf("reuse round %d per page (us): map %.2f setaccess(32 pages)/page %.2f unmap %.2f\n", round, (t1-t0)/N, (t2-t1)/N, (t3-t2)/N);
  }
  // unmap of a 32-page range in one call (32 separate mappings)
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) CK(cuMemMap(base + i * page, page, 0, h[i], 0));
    CK(cuMemSetAccess(base, N * page, &acc, 1));
    double t0 = now(); CUresult r = CUDA_SUCCESS; for (int i = 0; i < N; i += 32) { r = cuMemUnmap(base + i * page, 32 * page); if (r) break; }
    double t1 = now();
    if (r) { const char* s; cuGetErrorString(r, &s); printf("range unmap of separate mappings: %s\n", s); for (int i = 0; i < N; i++) cuMemUnmap(base + i * page, page); }
    else printf("range-unmap round %d per page (us): %.2f\n", round, (t1-t0)/N);
  }
  for (int i = 0; i < N; i++) CK(cuMemRelease(h[i]));
  // big handles: 64 MiB created and mapped in one call each
  const int B = 8; const size_t big = 32 * page;
  for (int round = 0; round < 3; round++) {
    std::vector<CUmemGenericAllocationHandle> hb(B);
    double t0 = now(); for (int i = 0; i < B; i++) CK(cuMemCreate(&hb[i], big, &prop, 0));
    double t1 = now(); for (int i = 0; i < B; i++) CK(cuMemMap(base + i * big, big, 0, hb[i], 0));
    double t2 = now(); CK(cuMemSetAccess(base, B * big, &acc, 1));
    double t3 = now(); for (int i = 0; i < B; i++) CK(cuMemUnmap(base + i * big, big));
    double t4 = now(); for (int i = 0; i < B; i++) CK(cuMemRelease(hb[i]));
    double t5 = now();
    printf("64MiB handles round %d per 2MiB-equivalent (us): create %.2f map %.2f setaccess %.2f unmap %.2f release %.2f\n", round,
      (t1-t0)/(B*32), (t2-t1)/(B*32), (t3-t2)/(B*32), (t4-t3)/(B*32), (t5-t4)/(B*32));
  }
  // partial unmap of a big mapping
  { CUmemGenericAllocationHandle hb; CK(cuMemCreate(&hb, big, &prop, 0)); CK(cuMemMap(base, big, 0, hb, 0)); CK(cuMemSetAccess(base, big, &acc, 1));
    CUresult r = cuMemUnmap(base + big - page, page); const char* s = "ok"; if (r) cuGetErrorString(r, &s); printf("partial unmap of a 64 MiB mapping: %s\n", s);
    if (r == CUDA_SUCCESS) { r = cuMemUnmap(base, big - page); printf("rest unmap: %d\n", (int)r); } else CK(cuMemUnmap(base, big));
    CK(cuMemRelease(hb)); }
  // map one page-sized piece of a big handle at an offset (handle offset)
  { CUmemGenericAllocationHandle hb; CK(cuMemCreate(&hb, big, &prop, 0)); CUresult r = cuMemMap(base, page, page, hb, 0); const char* s = "ok"; if (r) cuGetErrorString(r, &s);
    printf("map with nonzero handle offset: %s\n", s); if (!r) CK(cuMemUnmap(base, page)); CK(cuMemRelease(hb)); }
  return 0;
}
