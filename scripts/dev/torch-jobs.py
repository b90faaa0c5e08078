#!/usr/bin/env python3
"""The proof set: real PyTorch jobs, of the shapes users run, in capture.py's form.

    torch-jobs.py JOB OUTDIR SEED      (as ../shared/traces/capture.py; CAPTURE_PY for torch-proof.py)

Each job marks memory_allocated()/memory_reserved() after every step (torch.cuda.synchronize()
first), and writes what capture.py writes: OUTDIR/JOB.pickle (the snapshot with its trace, stacks
recorded) and OUTDIR/JOB.expected.json (marks, memory_stats, memory_summary), so that
torch-compare.py compares a job on both allocators mark by mark and `cachalot replay --check`
checks cachalot's replay of PyTorch's own run. Run through torch-proof.py (CAPTURE_PY=this file),
which enables cachalot first in its `cachalot` mode.

Jobs: amp_gpt (fp16 autocast, GradScaler, fused AdamW), checkpointing (activation
checkpointing), graph_step (a whole training step captured in a CUDA graph, replayed on new
data), compile_ro_train and compile_ro_infer (torch.compile mode="reduce-overhead": CUDA-graph
trees), cudnn_autotune
(cudnn.benchmark = True), mempool (MemPool + use_mem_pool: nested, several, tensors outliving
their pool), ragged_server (inference, batch 1-16, length 7-900), moe (top-2 expert dispatch),
fsdp2_world1 (fully_shard over NCCL, one rank: a machine of one GPU).
"""
import json
import os
import pickle
import random
import sys
import time

import torch

name, outdir, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(outdir, exist_ok=True)
torch.manual_seed(seed)
rnd = random.Random(seed)
torch.zeros(1, device="cuda")
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
torch.cuda.reset_accumulated_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
marks = []


def mark(label):
    torch.cuda.synchronize()
    marks.append({"label": label, "allocated": torch.cuda.memory_allocated(),
                  "reserved": torch.cuda.memory_reserved()})


def train_step(opt, loss, label):
    """One optimizer step on `loss`, then a mark."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    mark(label)


def gpt(d=256, layers=3, vocab=4000):
    emb = torch.nn.Embedding(vocab, d).cuda()
    layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True, norm_first=True)
    body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).cuda()
    head = torch.nn.Linear(d, vocab).cuda()
    return emb, body, head


def amp_gpt(steps=6, L=192, B=12, vocab=4000):
    emb, body, head = gpt(vocab=vocab)
    params = [*emb.parameters(), *body.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    for s in range(steps):
        tok = torch.randint(0, vocab, (B, L + 1), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            logits = head(body(emb(tok[:, :-1]), is_causal=False))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        mark(f"step{s}")


def checkpointing(steps=6, L=256, B=8, d=256, layers=4):
    from torch.utils.checkpoint import checkpoint
    blocks = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        for _ in range(layers)).cuda()
    head = torch.nn.Linear(d, 1).cuda()
    opt = torch.optim.Adam([*blocks.parameters(), *head.parameters()], lr=1e-4)
    for s in range(steps):
        x = torch.randn(B, L, d, device="cuda")
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False)
        loss = head(x).square().mean()
        train_step(opt, loss, f"step{s}")


def graph_step(steps=6, B=256, d=1024):
    model = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)
    static_x = torch.randn(B, d, device="cuda")
    static_y = torch.randn(B, d, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream, as PyTorch's docs do before capture
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    mark("warm")
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    # torch.cuda.graph(graph)'s entry and exit spelled out, so that the routing's start and end
    # are listed for the replay (capture_begin allocates the RNG's graph-state tensors before it
    # routes to the pool, so the routing begins after it).
    torch.cuda.synchronize()
    empty_cache()
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        graph.capture_begin()
        begun = trace_len()  # a snapshot during the capture: host-side only
        static_loss = torch.nn.functional.mse_loss(model(static_x), static_y)
        # Not static_loss.backward(): torch-proof.py's loss recorder reads the loss on the host,
        # which a capture forbids.
        torch.autograd.backward(static_loss)
        opt.step()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(capture)
    pool = tuple(graph.pool())
    record(begun, "begin_allocate_to_pool", pool, stream=capture.cuda_stream)
    record(trace_len(), "end_allocate_to_pool", pool)
    mark("captured")
    for s in range(steps):
        static_x.copy_(torch.randn(B, d, device="cuda"))
        static_y.copy_(torch.randn(B, d, device="cuda"))
        graph.replay()
        mark(f"replay{s}")
    at = trace_len()
    graph.reset()
    record(at, "release_pool", pool)
    del graph, static_loss
    empty_cache()
    mark("graph_deleted")


def compiled_mlp(d):
    model = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.ReLU(), torch.nn.Linear(2 * d, d)).cuda()
    return model, torch.compile(model, mode="reduce-overhead")


def compile_ro_train(steps=8, B=64, d=512):
    model, compiled = compiled_mlp(d)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for s in range(steps):
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(B, d, device="cuda")
        loss = compiled(x).square().mean()
        train_step(opt, loss, f"train{s}")


def compile_ro_infer(steps=8, B=64, d=512):
    _, compiled = compiled_mlp(d)
    with torch.no_grad():
        for s in range(steps):
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(torch.randn(B, d, device="cuda"))
            del out
            mark(f"infer{s}")


def cudnn_autotune(steps=6):
    torch.backends.cudnn.benchmark = True
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1, stride=2), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for s in range(steps):
        batch = (32, 64)[s % 2]
        x = torch.randn(batch, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (batch,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        train_step(opt, loss, f"step{s}")


# The private-pool calls, which a trace does not show (scripts/conformance/pool_calls.py; beside
# this file where torch-build.sh copied both).
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "conformance")]
from pool_calls import PoolCalls  # noqa: E402

recorder = PoolCalls(torch)
calls, trace_len, record, empty_cache, Pool = (recorder.calls, recorder.trace_len, recorder.record,
                                               recorder.empty_cache, recorder.pool)


def mempool():
    outer, inner = Pool(), Pool()
    keep = []
    with outer:
        a = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        with inner:
            b = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
            small = torch.empty(1000, device="cuda")
        c = torch.empty(700, dtype=torch.uint8, device="cuda")
    mark("inside_pools")
    d = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")  # the default pools again
    mark("default")
    keep.append(b)  # outlives its pool
    del a, c, small
    mark("freed_outer")
    inner.delete()
    empty_cache()
    mark("inner_pool_deleted")
    again = Pool()
    for s in range(3):
        with again:
            xs = [torch.empty(rnd.choice((512, 4096, 1 << 20, 3 << 20)), dtype=torch.uint8, device="cuda")
                  for _ in range(8)]
        del xs
        mark(f"again{s}")
    outer.delete()
    again.delete()
    del d
    keep.clear()
    empty_cache()
    mark("end")


def ragged_server(requests=40, d=256, layers=3, vocab=4000):
    emb, body, head = gpt(d=d, layers=layers, vocab=vocab)
    with torch.no_grad():
        for r in range(requests):
            batch, length = rnd.randint(1, 16), rnd.randint(7, 900)
            tok = torch.randint(0, vocab, (batch, length), device="cuda")
            out = head(body(emb(tok))).argmax(-1)
            del tok, out
            if r % 5 == 4:
                mark(f"request{r}")


def moe(steps=6, tokens=4096, d=256, experts=8):
    gate = torch.nn.Linear(d, experts).cuda()
    ffn = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        for _ in range(experts)).cuda()
    opt = torch.optim.AdamW([*gate.parameters(), *ffn.parameters()], lr=1e-4)
    for s in range(steps):
        x = torch.randn(tokens, d, device="cuda")
        weights, chosen = gate(x).softmax(-1).topk(2, dim=-1)
        out = torch.zeros_like(x)
        for e in range(experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, ffn[e](x[rows]) * weights[rows, slot, None])
        loss = out.square().mean()
        train_step(opt, loss, f"step{s}")


def fsdp2_world1(steps=4, d=512):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + seed))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    model = torch.nn.Sequential(*(torch.nn.Linear(d, d) for _ in range(4))).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for s in range(steps):
        loss = model(torch.randn(64, d, device="cuda")).square().mean()
        train_step(opt, loss, f"step{s}")
    dist.destroy_process_group()


JOBS = {f.__name__: f for f in (amp_gpt, checkpointing, graph_step, compile_ro_train, compile_ro_infer,
                                cudnn_autotune, mempool,
                                ragged_server, moe, fsdp2_world1)}
started = time.time()
JOBS[name.split("@")[0]]()
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
stats = dict(torch.cuda.memory_stats())
tag = name.replace("@", "_")
with open(f"{outdir}/{tag}.pickle", "wb") as f:
    pickle.dump(snap, f)
with open(f"{outdir}/{tag}.expected.json", "w") as f:
    json.dump({"workload": name, "seed": seed, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
               "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "memory_fraction": None,
               "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
               "marks": marks, "memory_stats": stats, "memory_summary": torch.cuda.memory_summary(),
               **({"calls": calls} if calls else {})}, f, indent=1)
events = sum(len(x) for x in snap["device_traces"])
print(f"{tag}: {events} events peak_alloc={stats.get('allocated_bytes.all.peak')} "
      f"peak_res={stats.get('reserved_bytes.all.peak')} {time.time() - started:.1f}s")
