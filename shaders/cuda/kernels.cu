// cachalot element-wise, loss and optimiser kernels in CUDA C, the same functions as the WGSL
// kernels of `shaders/wgsl/` (matrix products go to cuBLAS). Compiled at run time by NVRTC;
// no headers are included, so the source builds with no CUDA toolkit on the include path.
//
// Conventions: f32 tensors, flat and row-major; `n` counts elements; 1-D launches use any
// block size with a grid that covers `n` (grid-stride loops make any grid correct).
// Reductions that write a scalar (mse_loss, xent_mean) and xent_rows use blockDim.x == 256.
// Every kernel is `extern "C"` so NVRTC keeps its name.

#define CACHALOT_BLOCK 256

__device__ __forceinline__ unsigned long long cachalot_index() {
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ unsigned long long cachalot_stride() {
    return (unsigned long long)gridDim.x * blockDim.x;
}

// Standard normal CDF through erfcf, which keeps relative precision in the lower tail.
__device__ __forceinline__ float cachalot_phi(float x) {
    return 0.5f * erfcf(-x * 0.70710678118654752f);
}

// x[i] = value
extern "C" __global__ void fill(float* x, float value, unsigned long long n) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride()) x[i] = value;
}

// y[i] = x[i]
extern "C" __global__ void copy(const float* x, float* y, unsigned long long n) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride()) y[i] = x[i];
}

// x[r, c] += bias[c] for x of [rows, cols] (n = rows * cols)
extern "C" __global__ void add_bias(float* x, const float* bias, unsigned long long n, unsigned int cols) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride()) x[i] += bias[i % cols];
}

// out[c] = sum_r x[r, c] (+ out[c] when accumulate != 0): the bias gradient of a linear layer.
// One thread per column.
extern "C" __global__ void sum_rows(const float* x, float* out, unsigned int rows, unsigned int cols, int accumulate) {
    for (unsigned long long j = cachalot_index(); j < cols; j += cachalot_stride()) {
        float acc = 0.0f;
        for (unsigned int r = 0; r < rows; ++r) acc += x[(unsigned long long)r * cols + j];
        out[j] = accumulate ? out[j] + acc : acc;
    }
}

// y = max(x, 0)
extern "C" __global__ void relu_forward(const float* x, float* y, unsigned long long n) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride()) y[i] = fmaxf(x[i], 0.0f);
}

// grad_in = grad_out where input > 0, else 0 (PyTorch's threshold_backward)
extern "C" __global__ void relu_backward(const float* input, const float* grad_out, float* grad_in,
                                         unsigned long long n) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride())
        grad_in[i] = input[i] > 0.0f ? grad_out[i] : 0.0f;
}

// y = x * Phi(x) (exact GELU, approximate='none')
extern "C" __global__ void gelu_forward(const float* x, float* y, unsigned long long n) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride()) y[i] = x[i] * cachalot_phi(x[i]);
}

// grad_in = grad_out * (Phi(x) + x * phi(x))
extern "C" __global__ void gelu_backward(const float* input, const float* grad_out, float* grad_in,
                                         unsigned long long n) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride()) {
        float v = input[i];
        float density = 0.39894228040143268f * expf(-0.5f * v * v);
        grad_in[i] = grad_out[i] * (cachalot_phi(v) + v * density);
    }
}

__device__ float cachalot_block_sum(float value) {
    __shared__ float partial[CACHALOT_BLOCK];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (unsigned int stride = CACHALOT_BLOCK / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    float result = partial[0];
    __syncthreads();
    return result;
}

__device__ float cachalot_block_max(float value) {
    __shared__ float partial[CACHALOT_BLOCK];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (unsigned int stride = CACHALOT_BLOCK / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
        __syncthreads();
    }
    float result = partial[0];
    __syncthreads();
    return result;
}

// loss[0] = scale * sum_i (pred[i] - target[i])^2, scale = 1 / n for the mean.
// Launch with one block of 256 threads.
extern "C" __global__ void mse_loss(const float* pred, const float* target, float* loss, unsigned long long n,
                                    float scale) {
    float acc = 0.0f;
    for (unsigned long long i = threadIdx.x; i < n; i += CACHALOT_BLOCK) {
        float d = pred[i] - target[i];
        acc = fmaf(d, d, acc);
    }
    float total = cachalot_block_sum(acc);
    if (threadIdx.x == 0) loss[0] = total * scale;
}

// grad[i] = scale * (pred[i] - target[i]), scale = 2 / n times the incoming gradient.
extern "C" __global__ void mse_grad(const float* pred, const float* target, float* grad, unsigned long long n,
                                    float scale) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride())
        grad[i] = scale * (pred[i] - target[i]);
}

// One block of 256 threads per row b of logits [rows, cols] (grid = rows):
//   row_loss[b] = logsumexp(logits[b, :]) - logits[b, targets[b]]   (NaN if the target is out of range)
//   grad[b, j]  = scale * (softmax(logits[b, :])[j] - (j == targets[b])),  scale = 1 / rows.
extern "C" __global__ void xent_rows(const float* logits, const unsigned int* targets, float* grad, float* row_loss,
                                     unsigned int rows, unsigned int cols, float scale) {
    unsigned int row = blockIdx.x;
    if (row >= rows) return;  // whole blocks only: the barriers below stay uniform
    const float* x = logits + (unsigned long long)row * cols;
    float* g = grad + (unsigned long long)row * cols;
    float m = -3.402823e38f;
    for (unsigned int j = threadIdx.x; j < cols; j += CACHALOT_BLOCK) m = fmaxf(m, x[j]);
    m = cachalot_block_max(m);
    float s = 0.0f;
    for (unsigned int j = threadIdx.x; j < cols; j += CACHALOT_BLOCK) s += expf(x[j] - m);
    s = cachalot_block_sum(s);
    unsigned int t = targets[row];
    float inv = 1.0f / s;
    for (unsigned int j = threadIdx.x; j < cols; j += CACHALOT_BLOCK)
        g[j] = scale * (expf(x[j] - m) * inv - (j == t ? 1.0f : 0.0f));
    if (threadIdx.x == 0) row_loss[row] = t < cols ? logf(s) + m - x[t] : __int_as_float(0x7fc00000);
}

// loss[0] = scale * sum_b row_loss[b], scale = 1 / rows. One block of 256 threads.
extern "C" __global__ void xent_mean(const float* row_loss, float* loss, unsigned int rows, float scale) {
    float acc = 0.0f;
    for (unsigned int i = threadIdx.x; i < rows; i += CACHALOT_BLOCK) acc += row_loss[i];
    float total = cachalot_block_sum(acc);
    if (threadIdx.x == 0) loss[0] = total * scale;
}

// torch.optim.SGD step (see optim.wgsl); momentum_buf may be null when momentum == 0.
extern "C" __global__ void sgd_step(float* param, const float* grad, float* momentum_buf, unsigned long long n,
                                    float lr, float momentum, float dampening, float weight_decay, int nesterov,
                                    int first_step) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride()) {
        float g = grad[i];
        if (weight_decay != 0.0f) g += weight_decay * param[i];
        if (momentum != 0.0f) {
            float buf = first_step ? g : momentum * momentum_buf[i] + (1.0f - dampening) * g;
            momentum_buf[i] = buf;
            g = nesterov ? g + momentum * buf : buf;
        }
        param[i] -= lr * g;
    }
}

// torch.optim.Adam step (see optim.wgsl): step_size = lr / (1 - beta1^t), sqrt_bc2 = sqrt(1 - beta2^t).
extern "C" __global__ void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                                     unsigned long long n, float step_size, float beta1, float beta2, float eps,
                                     float weight_decay, float sqrt_bc2) {
    for (unsigned long long i = cachalot_index(); i < n; i += cachalot_stride()) {
        float g = grad[i];
        if (weight_decay != 0.0f) g += weight_decay * param[i];
        float m = exp_avg[i] + (1.0f - beta1) * (g - exp_avg[i]);
        float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        param[i] -= step_size * m / (sqrtf(v) / sqrt_bc2 + eps);
    }
}
