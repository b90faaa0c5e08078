"""Compiles `kernels.cu` with NVRTC (through CuPy, no headers) and checks every kernel
against PyTorch's own functions on random inputs: the semantics the WGSL kernels and the
CPU references share (exact GELU, mean-reduced MSE and cross-entropy, torch.optim SGD and
Adam). Needs a CUDA GPU, CuPy and PyTorch:

    python3 shaders/cuda/check_nvrtc.py
"""

import math
import pathlib

import cupy as cp
import torch

source = (pathlib.Path(__file__).parent / "kernels.cu").read_text()
module = cp.RawModule(code=source, options=("--std=c++17",))
k = {name: module.get_function(name) for name in [
    "fill", "copy", "add_bias", "sum_rows", "relu_forward", "relu_backward", "gelu_forward", "gelu_backward",
    "mse_loss", "mse_grad", "xent_rows", "xent_mean", "sgd_step", "adam_step"]}
torch.manual_seed(0)
failures = []


def cp_(t):
    return cp.asarray(t.detach().contiguous())


def check(name, got, want, tol=1e-5):
    got = torch.as_tensor(cp.asnumpy(got) if isinstance(got, cp.ndarray) else got).to(want.device, torch.float64)
    want = want.to(torch.float64)
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    ok = err < tol and not math.isnan(err)
    print(f"{'ok  ' if ok else 'FAIL'} {name:<14} relative error {err:.2e}")
    if not ok:
        failures.append(name)


def grid(n):
    return (min((n + 255) // 256, 65535),), (256,)


u64, u32, f32, i32 = cp.uint64, cp.uint32, cp.float32, cp.int32
n, rows, cols = 100_003, 300, 37
x = torch.randn(n, device="cuda") * 3
dy = torch.randn(n, device="cuda")

y = cp.empty(n, dtype=f32)
k["fill"](*grid(n), (y, f32(2.5), u64(n)))
check("fill", y, torch.full((n,), 2.5))
k["copy"](*grid(n), (cp_(x), y, u64(n)))
check("copy", y, x)
k["relu_forward"](*grid(n), (cp_(x), y, u64(n)))
check("relu_forward", y, torch.relu(x))
k["gelu_forward"](*grid(n), (cp_(x), y, u64(n)))
check("gelu_forward", y, torch.nn.functional.gelu(x.double()))
xr = x.clone().requires_grad_()
torch.relu(xr).backward(dy)
k["relu_backward"](*grid(n), (cp_(x), cp_(dy), y, u64(n)))
check("relu_backward", y, xr.grad)
xg = x.double().clone().requires_grad_()
torch.nn.functional.gelu(xg).backward(dy.double())
k["gelu_backward"](*grid(n), (cp_(x), cp_(dy), y, u64(n)))
check("gelu_backward", y, xg.grad)

m = torch.randn(rows, cols, device="cuda")
bias = torch.randn(cols, device="cuda")
mb = cp_(m).copy()
k["add_bias"](*grid(rows * cols), (mb, cp_(bias), u64(rows * cols), u32(cols)))
check("add_bias", mb, m + bias)
sums = cp.ones(cols, dtype=f32)
k["sum_rows"](*grid(cols), (cp_(m), sums, u32(rows), u32(cols), i32(1)))
check("sum_rows", sums, m.double().sum(0) + 1)

pred = torch.randn(n, device="cuda", requires_grad=True)
target = torch.randn(n, device="cuda")
loss = cp.empty(1, dtype=f32)
k["mse_loss"]((1,), (256,), (cp_(pred), cp_(target), loss, u64(n), f32(1.0 / n)))
mse = torch.nn.functional.mse_loss(pred.double(), target.double())
check("mse_loss", loss, mse.reshape(1))
mse.backward()
k["mse_grad"](*grid(n), (cp_(pred), cp_(target), y, u64(n), f32(2.0 / n)))
check("mse_grad", y, pred.grad)

logits = (torch.randn(rows, 1000, device="cuda") * 4).requires_grad_()
labels = torch.randint(0, 1000, (rows,), device="cuda")
grad = cp.empty((rows, 1000), dtype=f32)
row_loss = cp.empty(rows, dtype=f32)
k["xent_rows"]((rows,), (256,), (cp_(logits), cp_(labels.to(torch.int32)).view(cp.uint32), grad, row_loss,
                                 u32(rows), u32(1000), f32(1.0 / rows)))
k["xent_mean"]((1,), (256,), (row_loss, loss, u32(rows), f32(1.0 / rows)))
ce = torch.nn.functional.cross_entropy(logits.double(), labels)
check("xent loss", loss, ce.reshape(1))
ce.backward()
check("xent grad", grad, logits.grad)

for name, opt, kernel in [("sgd", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01), "sgd_step"),
                          ("sgd nesterov", dict(lr=0.05, momentum=0.9, nesterov=True), "sgd_step"),
                          ("adam", dict(lr=0.01, weight_decay=0.001), "adam_step")]:
    p = torch.randn(n, device="cuda", requires_grad=True)
    ours = cp_(p).copy()
    state = [cp.zeros(n, dtype=f32), cp.zeros(n, dtype=f32)]
    torch_opt = torch.optim.SGD([p], **opt) if kernel == "sgd_step" else torch.optim.Adam([p], **opt)
    for step in range(1, 4):
        g = torch.randn(n, device="cuda")
        p.grad = g.clone()
        torch_opt.step()
        if kernel == "sgd_step":
            k[kernel](*grid(n), (ours, cp_(g), state[0], u64(n), f32(opt["lr"]), f32(opt["momentum"]),
                                 f32(opt.get("dampening", 0.0)), f32(opt.get("weight_decay", 0.0)),
                                 i32(int(opt.get("nesterov", False))), i32(int(step == 1))))
        else:
            bc1, bc2 = 1 - 0.9**step, 1 - 0.999**step
            k[kernel](*grid(n), (ours, cp_(g), state[0], state[1], u64(n), f32(opt["lr"] / bc1), f32(0.9),
                                 f32(0.999), f32(1e-8), f32(opt["weight_decay"]), f32(math.sqrt(bc2))))
    check(name, ours, p.detach())

print(f"{len(failures)} failed: {failures}" if failures else "all CUDA kernels match PyTorch")
