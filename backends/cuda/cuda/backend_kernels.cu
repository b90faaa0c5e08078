// Kernels of the CUDA backend that `cachalot-shaders` does not provide: scaling, a two-pass sum,
// and the pattern kernels that check memory integrity. Compiled at run time by NVRTC, like
// `shaders/cuda/kernels.cu`; no headers, so no CUDA toolkit is needed on the include path.
//
// Conventions as there: flat arrays, `n` counts elements, 1-D kernels use grid-stride loops so
// any grid is correct. The reductions use blockDim.x == 256.

#define CACHALOT_BACKEND_BLOCK 256

__device__ __forceinline__ unsigned long long cachalot_backend_index() {
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ unsigned long long cachalot_backend_stride() {
    return (unsigned long long)gridDim.x * blockDim.x;
}

// The pattern word `i` of a block filled with `seed`: SplitMix64's finaliser of (seed, i), low
// 32 bits. `cachalot_cuda::pattern_word` computes the same on the host.
__device__ __forceinline__ unsigned int cachalot_pattern(unsigned long long seed, unsigned long long i) {
    unsigned long long z = seed + (i + 1ull) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (unsigned int)(z ^ (z >> 31));
}

// The GPU's nanosecond clock (coarse, but the same on every multiprocessor).
__device__ __forceinline__ unsigned long long cachalot_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// y[i] = alpha * x[i]
extern "C" __global__ void cachalot_scale(const float* x, float* y, float alpha, unsigned long long n) {
    for (unsigned long long i = cachalot_backend_index(); i < n; i += cachalot_backend_stride()) y[i] = alpha * x[i];
}

// x[i] = value, for 32-bit words
extern "C" __global__ void cachalot_fill_u32(unsigned int* x, unsigned int value, unsigned long long n) {
    for (unsigned long long i = cachalot_backend_index(); i < n; i += cachalot_backend_stride()) x[i] = value;
}

// x[i] = pattern(seed, i) for `words` 32-bit words
extern "C" __global__ void cachalot_fill_pattern(unsigned int* x, unsigned long long words, unsigned long long seed) {
    for (unsigned long long i = cachalot_backend_index(); i < words; i += cachalot_backend_stride())
        x[i] = cachalot_pattern(seed, i);
}

// errors[0] += number of words with x[i] != pattern(seed, i)
extern "C" __global__ void cachalot_check_pattern(const unsigned int* x, unsigned long long words,
                                                  unsigned long long seed, unsigned int* errors) {
    unsigned int bad = 0;
    for (unsigned long long i = cachalot_backend_index(); i < words; i += cachalot_backend_stride())
        bad += x[i] != cachalot_pattern(seed, i) ? 1u : 0u;
    if (bad != 0) atomicAdd(errors, bad);
}

// Writes pattern(seed, i) over x again and again for at least `nanoseconds`, then once more: a
// long-running kernel that keeps writing a block (the cross-stream safety test).
extern "C" __global__ void cachalot_spin_fill_pattern(unsigned int* x, unsigned long long words,
                                                      unsigned long long seed, unsigned long long nanoseconds) {
    unsigned long long start = cachalot_globaltimer();
    do {
        for (unsigned long long i = cachalot_backend_index(); i < words; i += cachalot_backend_stride())
            x[i] = cachalot_pattern(seed, i);
    } while (cachalot_globaltimer() - start < nanoseconds);
    for (unsigned long long i = cachalot_backend_index(); i < words; i += cachalot_backend_stride())
        x[i] = cachalot_pattern(seed, i);
}

__device__ float cachalot_backend_block_sum(float value) {
    __shared__ float partial[CACHALOT_BACKEND_BLOCK];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (unsigned int stride = CACHALOT_BACKEND_BLOCK / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    return partial[0];
}

// First pass of a sum: partial[blockIdx.x] = sum of this block's grid-stride share of x.
// Launch with 256 threads per block and as many blocks as `partial` holds.
extern "C" __global__ void cachalot_sum_partial(const float* x, float* partial, unsigned long long n) {
    float acc = 0.0f;
    for (unsigned long long i = cachalot_backend_index(); i < n; i += cachalot_backend_stride()) acc += x[i];
    float total = cachalot_backend_block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Second pass: out[0] = scale * sum of partial[0 .. blocks). One block of 256 threads.
extern "C" __global__ void cachalot_sum_final(const float* partial, float* out, unsigned int blocks, float scale) {
    float acc = 0.0f;
    for (unsigned int i = threadIdx.x; i < blocks; i += CACHALOT_BACKEND_BLOCK) acc += partial[i];
    float total = cachalot_backend_block_sum(acc);
    if (threadIdx.x == 0) out[0] = total * scale;
}
