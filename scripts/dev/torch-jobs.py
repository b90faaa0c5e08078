#!/usr/bin/env python3
"""The proof set: real PyTorch jobs, of the shapes users run.

    torch-jobs.py JOB OUTDIR SEED      (as ../shared/traces/capture.py; CAPTURE_PY for torch-proof.py)

Run as a script, a job runs its steps, marks memory_allocated()/memory_reserved() after each
(torch.cuda.synchronize() first), and writes what capture.py writes: OUTDIR/JOB.pickle (the
snapshot with its trace, stacks recorded) and OUTDIR/JOB.expected.json (marks, memory_stats,
memory_summary), so that torch-compare.py compares a job on both allocators mark by mark and
`cachalot replay --check` checks cachalot's replay of PyTorch's own run. Run through
torch-proof.py (CAPTURE_PY=this file), which enables cachalot first in its `cachalot` mode.
Imported (torch-policy.py), it gives each job as a `Job`: set up once, then a step that can be
repeated for timing.

Each job runs under its own PYTORCH_CUDA_ALLOC_CONF (`CONF`, the settings its kind of job is
run with; `conf JOB` prints it), which the drivers put in the environment.

Jobs: amp_gpt (fp16 autocast, GradScaler, fused AdamW), checkpointing (activation
checkpointing, expandable segments), graph_step (a whole training step captured in a CUDA
graph, replayed on new data), compile_ro_train and compile_ro_infer (torch.compile
mode="reduce-overhead": CUDA-graph trees), cudnn_autotune (cudnn.benchmark = True), mempool
(MemPool + use_mem_pool: nested, several, tensors outliving their pool), ragged_server
(inference, batch 1-16, length 7-900, roundup_power2_divisions:4), moe (top-2 expert dispatch),
pinned_prefetch (a convnet fed by copies from pinned memory on a side stream, record_stream),
batch_search (the largest batch that fits under a memory fraction, found by catching OOMs, then
trained at; expandable segments), multi_gib (a large-vocabulary language-model head: logits of
1-3 GiB, max_split_size_mb:512), fsdp2_world1 (fully_shard over NCCL, one rank: a machine of
one GPU).
"""
import contextlib
import gc
import json
import os
import pickle
import random
import sys
import time

CONF = {
    "checkpointing": "expandable_segments:True",
    "ragged_server": "roundup_power2_divisions:4",
    "batch_search": "expandable_segments:True",
    "multi_gib": "max_split_size_mb:512",
}
if __name__ == "__main__" and sys.argv[1:2] == ["conf"]:
    print(CONF.get(sys.argv[2].split("@")[0], ""))
    sys.exit(0)

import torch  # noqa: E402

rnd = random.Random(0)
marks = []
memory_fraction = None  # set_per_process_memory_fraction's argument, where a job sets one


def mark(label, message=None):
    """memory_allocated/reserved now; `message`: the OOM error the job caught just before, which
    `cachalot replay --check` compares with the replay's."""
    torch.cuda.synchronize()
    marks.append({"label": label, "allocated": torch.cuda.memory_allocated(),
                  "reserved": torch.cuda.memory_reserved(), **({"message": message} if message else {})})


class Job:
    """A job after its set-up: `step(s)` runs step s (any s >= 0) and returns its mark's label;
    the proof run takes `steps` of them, then `finish()`. `timed`: its steps repeat alike, so
    their time means something (torch-policy.py)."""

    def __init__(self, step, steps, finish=None, timed=True):
        self.step, self.steps, self.finish, self.timed = step, steps, finish or (lambda: None), timed


def train_step(opt, loss, label):
    """One optimizer step on `loss`; returns the mark's label."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return label


def gpt(d=256, layers=3, vocab=4000):
    emb = torch.nn.Embedding(vocab, d).cuda()
    layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True, norm_first=True)
    body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).cuda()
    head = torch.nn.Linear(d, vocab).cuda()
    return emb, body, head


def amp_gpt(L=192, B=12, vocab=4000):
    emb, body, head = gpt(vocab=vocab)
    params = [*emb.parameters(), *body.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cuda")

    def step(s):
        tok = torch.randint(0, vocab, (B, L + 1), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            logits = head(body(emb(tok[:, :-1]), is_causal=False))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return f"step{s}"
    return Job(step, 6)


def checkpointing(L=256, B=8, d=256, layers=4):
    from torch.utils.checkpoint import checkpoint
    blocks = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        for _ in range(layers)).cuda()
    head = torch.nn.Linear(d, 1).cuda()
    opt = torch.optim.Adam([*blocks.parameters(), *head.parameters()], lr=1e-4)

    def step(s):
        x = torch.randn(B, L, d, device="cuda")
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return train_step(opt, head(x).square().mean(), f"step{s}")
    return Job(step, 6)


def graph_step(B=256, d=1024):
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

    def step(s):
        static_x.copy_(torch.randn(B, d, device="cuda"))
        static_y.copy_(torch.randn(B, d, device="cuda"))
        graph.replay()
        return f"replay{s}"

    def finish():
        nonlocal graph, static_loss
        at = trace_len()
        graph.reset()
        record(at, "release_pool", pool)
        del graph, static_loss
        empty_cache()
        mark("graph_deleted")
    return Job(step, 6, finish)


def compiled_mlp(d):
    model = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.ReLU(), torch.nn.Linear(2 * d, d)).cuda()
    return model, torch.compile(model, mode="reduce-overhead")


def compile_ro_train(B=64, d=512):
    model, compiled = compiled_mlp(d)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(s):
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(B, d, device="cuda")
        return train_step(opt, compiled(x).square().mean(), f"train{s}")
    return Job(step, 8)


def compile_ro_infer(B=64, d=512):
    _, compiled = compiled_mlp(d)

    def step(s):
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(torch.randn(B, d, device="cuda"))
            del out
        return f"infer{s}"
    return Job(step, 8)


def convnet(width=32):
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, width, 3, padding=1), torch.nn.BatchNorm2d(width), torch.nn.ReLU(),
        torch.nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), torch.nn.ReLU(),
        torch.nn.Conv2d(2 * width, 2 * width, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(2 * width, 10)).cuda()


def cudnn_autotune():
    torch.backends.cudnn.benchmark = True
    model = convnet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(s):
        batch = (32, 64)[s % 2]
        x = torch.randn(batch, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (batch,), device="cuda")
        return train_step(opt, torch.nn.functional.cross_entropy(model(x), y), f"step{s}")
    return Job(step, 6)


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
    return Job(None, 0, timed=False)


def ragged_server(d=256, layers=3, vocab=4000):
    emb, body, head = gpt(d=d, layers=layers, vocab=vocab)

    def step(s):
        """Five requests of random batch and length."""
        with torch.no_grad():
            for _ in range(5):
                batch, length = rnd.randint(1, 16), rnd.randint(7, 900)
                tok = torch.randint(0, vocab, (batch, length), device="cuda")
                out = head(body(emb(tok))).argmax(-1)
                del tok, out
        return f"request{5 * s + 4}"
    return Job(step, 8)


def moe(tokens=4096, d=256, experts=8):
    gate = torch.nn.Linear(d, experts).cuda()
    ffn = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        for _ in range(experts)).cuda()
    opt = torch.optim.AdamW([*gate.parameters(), *ffn.parameters()], lr=1e-4)

    def step(s):
        x = torch.randn(tokens, d, device="cuda")
        weights, chosen = gate(x).softmax(-1).topk(2, dim=-1)
        out = torch.zeros_like(x)
        for e in range(experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, ffn[e](x[rows]) * weights[rows, slot, None])
        return train_step(opt, out.square().mean(), f"step{s}")
    return Job(step, 6)


def pinned_prefetch(batches=(48, 64, 32, 96)):
    """A data loader's pattern: batch s+1 is copied from pinned host memory on a side stream
    while batch s trains; the main stream's use of the copy is declared with record_stream."""
    model = convnet(48)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    host = [(torch.randn(b, 3, 64, 64).pin_memory(), torch.randint(0, 10, (b,)).pin_memory()) for b in batches]
    side = torch.cuda.Stream()

    def prefetch(s):
        x, y = host[s % len(host)]
        with torch.cuda.stream(side):
            return x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
    ahead = [prefetch(0)]

    def step(s):
        main = torch.cuda.current_stream()
        main.wait_stream(side)
        x, y = ahead[0]
        x.record_stream(main)
        y.record_stream(main)
        ahead[0] = prefetch(s + 1)
        return train_step(opt, torch.nn.functional.cross_entropy(model(x), y), f"step{s}")
    return Job(step, 8)


def batch_search(fraction=0.01, d=2048, layers=4):
    """Lightning's batch-size finder in plain PyTorch: double the batch until a step runs out of
    memory under the process's memory fraction, halve the step between the last fit and the
    first failure three times, then train at the largest batch that fitted."""
    global memory_fraction
    memory_fraction = fraction
    torch.cuda.set_per_process_memory_fraction(fraction)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = torch.nn.Sequential(*(m for _ in range(layers) for m in (torch.nn.Linear(d, d), torch.nn.GELU()))).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def train(batch, label):
        x = torch.randn(batch, d, device="cuda")
        return train_step(opt, model(x).square().mean(), label)

    def fits(batch):
        try:
            train(batch, "")
            message = None
        except torch.OutOfMemoryError as e:
            message = str(e)
        gc.collect()  # the failed step's frames hold its tensors until collected
        empty_cache()  # as Lightning's garbage_collection_cuda() does after every try
        mark(f"batch{batch}_{'oom' if message else 'fits'}", message)
        return message is None
    low, high = 0, 1024
    while fits(high):
        low, high = high, 2 * high
    for _ in range(3):
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    best = low

    def step(s):
        return train(best, f"step{s}_batch{best}")
    return Job(step, 4)


def multi_gib(d=1024, vocab=65536, token_counts=(8192, 12288, 4096, 10240)):
    """A language-model head over a 64k vocabulary: fp32 logits of tokens x vocab are 1-3 GiB,
    and cross-entropy's softmax and the gradient as many again (five such jobs side by side in
    torch-policy.py's speed fit on one H200)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    emb = torch.nn.Embedding(vocab, d).cuda()
    body = torch.nn.Linear(d, d).cuda()
    head = torch.nn.Linear(d, vocab, bias=False).cuda()
    opt = torch.optim.SGD([*emb.parameters(), *body.parameters(), *head.parameters()], lr=1e-3)

    def step(s):
        tokens = token_counts[s % len(token_counts)]
        tok = torch.randint(0, vocab, (tokens + 1,), device="cuda")
        logits = head(torch.relu(body(emb(tok[:-1]))))
        loss = torch.nn.functional.cross_entropy(logits, tok[1:])
        del logits
        return train_step(opt, loss, f"step{s}_tokens{tokens}")
    return Job(step, 6)


def fsdp2_world1(d=512):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    model = torch.nn.Sequential(*(torch.nn.Linear(d, d) for _ in range(4))).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(s):
        return train_step(opt, model(torch.randn(64, d, device="cuda")).square().mean(), f"step{s}")
    return Job(step, 4, dist.destroy_process_group)


JOBS = {f.__name__: f for f in (amp_gpt, checkpointing, graph_step, compile_ro_train, compile_ro_infer,
                                cudnn_autotune, mempool, ragged_server, moe, pinned_prefetch, batch_search,
                                multi_gib, fsdp2_world1)}


def capture(name, outdir, seed):
    """The proof run of job `name`: its steps with a mark after each, then PyTorch's snapshot
    and capture.py's expected.json."""
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(seed)
    rnd.seed(seed)
    torch.zeros(1, device="cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    started = time.time()
    # The CUDA-graph trees of torch.compile's reduce-overhead jobs make their pool calls inside
    # PyTorch; listed for the replay (graph_step lists its own).
    with recorder.graph_trees() if name.startswith("compile") else contextlib.nullcontext():
        job = JOBS[name.split("@")[0]]()
        for s in range(job.steps):
            mark(job.step(s))
        job.finish()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = dict(torch.cuda.memory_stats())
    tag = name.replace("@", "_")
    with open(f"{outdir}/{tag}.pickle", "wb") as f:
        pickle.dump(snap, f)
    with open(f"{outdir}/{tag}.expected.json", "w") as f:
        json.dump({"workload": name, "seed": seed, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                   "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                   "memory_fraction": memory_fraction,
                   "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
                   "marks": marks, "memory_stats": stats, "memory_summary": torch.cuda.memory_summary(),
                   "steps": job.steps, "seconds": round(time.time() - started, 2),
                   **({"calls": calls} if calls else {})}, f, indent=1)
    events = sum(len(x) for x in snap["device_traces"])
    print(f"{tag}: {events} events peak_alloc={stats.get('allocated_bytes.all.peak')} "
          f"peak_res={stats.get('reserved_bytes.all.peak')} {time.time() - started:.1f}s")


if __name__ == "__main__":
    capture(sys.argv[1], sys.argv[2], int(sys.argv[3]))
