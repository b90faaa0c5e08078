"""cuBLAS SGEMM throughput through PyTorch, for comparison with `examples/matmul_bench.rs`.

Run on the same GPU in the same command as the WGSL benchmark:

    python3 backends/wgpu/benches/cublas_sgemm.py 1024 2048 4096 8192

Plain f32 (TF32 off, as the WGSL kernel computes), square n^3 products on uniform [-1, 1)
inputs, each timed with CUDA events: 3 warm-ups, then the median of 10 runs of `iters`
products (enough for ~0.2 s of work).
"""

import statistics
import sys

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")

sizes = [int(s) for s in sys.argv[1:]] or [1024, 2048, 4096, 8192]
print(f"cuBLAS via torch {torch.__version__} on {torch.cuda.get_device_name()}, TF32 off")
for n in sizes:
    a = torch.rand(n, n, device="cuda") * 2 - 1
    b = torch.rand(n, n, device="cuda") * 2 - 1
    c = torch.empty(n, n, device="cuda")
    flops = 2.0 * n**3
    iters = max(3, min(200, int(4e12 / flops + 0.999)))
    for _ in range(3):
        torch.mm(a, b, out=c)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.mm(a, b, out=c)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    t = statistics.median(times)
    print(f"{n:>6}  cuBLAS SGEMM  {t * 1e3:9.3f} ms  {flops / t / 1e9:9.1f} GFLOP/s")
