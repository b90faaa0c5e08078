#!/usr/bin/env python3
"""Speed of a PyTorch job on PyTorch's allocator and on cachalot's (one process per run).

    torch-speed.py MODE BENCH [STEPS]    (MODE: native | cachalot; BENCH: gpt_train | convnet_train | alloc)

gpt_train and convnet_train are ../shared/traces/capture.py's models and optimisers; each step is
timed on the host between torch.cuda.synchronize() calls, after 5 warm-up steps, and the per-step
times are printed as JSON. alloc times `x = torch.empty(size, dtype=uint8, device="cuda"); del x`
for the standard sizes (the Python and dispatcher overhead around the allocator is the same in
both modes). torch-device.sh alternates the modes and takes medians.
"""
import json
import random
import sys
import time

mode, bench = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 30
if mode == "cachalot":
    import cachalot_torch
    cachalot_torch.enable()
import torch  # noqa: E402

torch.manual_seed(1)
rnd = random.Random(1)
torch.zeros(1, device="cuda")


def gpt_train(d=384, layers=4, L=256, B=16, vocab=8000):
    emb = torch.nn.Embedding(vocab, d).cuda()
    layer = torch.nn.TransformerEncoderLayer(d, 6, 4 * d, batch_first=True, norm_first=True)
    body = torch.nn.TransformerEncoder(layer, layers).cuda()
    head = torch.nn.Linear(d, vocab).cuda()
    params = list(emb.parameters()) + list(body.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L, device="cuda")

    def step():
        tok = torch.randint(0, vocab, (B, L + 1), device="cuda")
        logits = head(body(emb(tok[:, :-1]), mask=mask, is_causal=True))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def convnet_train():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Flatten(), torch.nn.Linear(64 * 16 * 16, 10)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step():
        bs = rnd.choice([16, 32, 48, 64, 96])
        x = torch.randn(bs, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (bs,), device="cuda")
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


if bench == "alloc":
    sizes = [512, 4096, 65536, 1 << 20, 4 << 20, 32 << 20]
    result = {}
    for size in sizes:
        for _ in range(2000):
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
        n = 100_000
        t = time.perf_counter_ns()
        for _ in range(n):
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
        result[size] = (time.perf_counter_ns() - t) / n
    print(json.dumps({"mode": mode, "bench": bench, "ns_per_empty_del": result}))
else:
    step = {"gpt_train": gpt_train, "convnet_train": convnet_train}[bench]()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    print(json.dumps({"mode": mode, "bench": bench, "step_seconds": times}))
