#!/usr/bin/env python3
"""Captures PyTorch caching-allocator traces of generated workloads (see gen.py), many at once.

    capture.py SPECS.jsonl OUTDIR [-j 16] [--chunk 8] [--timeout 90]

With CAPTURE_DEADLINE (seconds since the epoch) set, workloads not started by then are skipped.

For each spec NAME it writes OUTDIR/NAME.pickle (`torch.cuda.memory._snapshot()` with the full
trace) and OUTDIR/NAME.expected.json (the format of shared/traces/capture.py: settings, memory
fraction, device total, marks with every OOM message, memory_stats(), memory_summary()), and one
line per spec to OUTDIR/capture.log.

Every workload runs in a process of its own whose CUDA context is new, so the allocator starts
empty and its PYTORCH_CUDA_ALLOC_CONF applies, as in shared/traces/capture.py. To pay for
`import torch` once per chunk rather than once per workload, a chunk process imports torch
(without touching CUDA) with the chunk's PYTORCH_CUDA_ALLOC_CONF in its environment and forks one
child per spec; CUDA is first initialised in the child. Each child checks that the settings
PyTorch parsed are the spec's (`allocator_settings` of the snapshot) and fails otherwise.

Calls that leave no entry of their own in the trace (`empty_cache`, `reset_peak_memory_stats`)
are preceded by a `_snapshot()` call, which records a `snapshot` entry; the expected.json's
`calls` list names them in order with the trace length at that point, so a replay knows where
they happened.
"""

import argparse
import json
import os
import pickle
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def run_chunk(specs, outdir, timeout):
    """In a chunk process (torch imported, CUDA untouched): fork a child per spec."""
    import torch  # noqa: F401  (imported before forking, so each child has it)

    results = []
    deadline = float(os.environ.get("CAPTURE_DEADLINE", "inf"))
    for s in specs:
        started = time.time()
        if started > deadline:
            print(f"{s['name']} skipped (past CAPTURE_DEADLINE)", flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                capture_one(s, outdir)
                code = 0
            except BaseException as e:  # the child reports, whatever it was
                with open(f"{outdir}/{s['name']}.error.txt", "w") as f:
                    f.write(f"{type(e).__name__}: {e}\n")
            finally:
                os._exit(code)
        status = None
        while time.time() - started < timeout:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(st)
                break
            time.sleep(0.05)
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = "timeout"
        results.append((s["name"], status, time.time() - started))
        print(f"{s['name']} {status} {time.time() - started:.1f}s", flush=True)
    return results


def capture_one(s, outdir):
    import torch

    torch.manual_seed(s["seed"])
    rnd = random.Random(s["seed"])
    torch.zeros(1, device="cuda")
    torch.cuda.empty_cache()
    if s.get("fraction"):
        torch.cuda.set_per_process_memory_fraction(float(s["fraction"]))
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    marks, calls = [], []

    def call(name, fn):
        snap = torch.cuda.memory._snapshot()
        calls.append({"call": name, "trace_len": len(snap["device_traces"][0])})
        fn()

    def oom(label, e):
        marks.append({"label": label, "message": str(e), "allocated": torch.cuda.memory_allocated(),
                      "reserved": torch.cuda.memory_reserved()})

    if s["kind"] == "ops":
        run_ops(torch, s, call, oom)
    else:
        Models(torch, rnd, marks, oom).run(s["model"], s["params"])
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    settings = snap.get("allocator_settings", {})
    if settings.get("PYTORCH_CUDA_ALLOC_CONF", "") != s["conf"]:
        raise RuntimeError(f"PyTorch parsed {settings.get('PYTORCH_CUDA_ALLOC_CONF')!r}, the spec says {s['conf']!r}")
    if settings.get("expandable_segments") != ("expandable_segments:True" in s["conf"]):
        raise RuntimeError(f"expandable_segments is {settings.get('expandable_segments')} against the spec")
    stats = dict(torch.cuda.memory_stats())
    with open(f"{outdir}/{s['name']}.pickle", "wb") as f:
        pickle.dump(snap, f)
    with open(f"{outdir}/{s['name']}.expected.json", "w") as f:
        json.dump({"workload": s["name"], "seed": s["seed"], "torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(0), "PYTORCH_CUDA_ALLOC_CONF": s["conf"],
                   "memory_fraction": s.get("fraction"),
                   "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
                   "marks": marks, "calls": calls, "memory_stats": stats,
                   "memory_summary": torch.cuda.memory_summary(), "spec": s}, f, indent=1)


def run_ops(torch, s, call, oom):
    streams = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(s.get("streams", 1) - 1)]
    live = {}
    for i, op in enumerate(s["ops"]):
        c = op[0]
        if c == "a":
            _, slot, n, st = op
            try:
                with torch.cuda.stream(streams[st]):
                    live[slot] = torch.empty(n, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as e:
                oom(f"op{i}", e)
        elif c == "f":
            live.pop(op[1], None)
        elif c == "r":
            t = live.get(op[1])
            if t is not None:
                other = streams[op[2]]
                other.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(other):
                    t.fill_(1)
                t.record_stream(other)
        elif c == "w":
            streams[op[1]].wait_stream(streams[op[2]])
        elif c == "s":
            torch.cuda.synchronize()
        elif c == "e":
            call("empty_cache", torch.cuda.empty_cache)
        elif c == "p":
            call("reset_peak_memory_stats", torch.cuda.reset_peak_memory_stats)
        elif c == "o":
            try:
                with torch.cuda.stream(streams[op[2]]):
                    torch.empty(op[1], dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as e:
                oom(f"op{i}", e)
        else:
            raise ValueError(f"ops[{i}]: unknown op {op!r}")
    live.clear()


class Models:
    """The model-shaped workloads of shared/traces/capture.py, with their sizes as parameters."""

    def __init__(self, torch, rnd, marks, oom):
        self.torch, self.rnd, self.marks, self.oom = torch, rnd, marks, oom

    def run(self, model, params):
        getattr(self, model)(**params)

    def gpt_train(self, steps, d, layers, L, B, vocab):
        torch = self.torch
        emb = torch.nn.Embedding(vocab, d).cuda()
        layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True, norm_first=True)
        body = torch.nn.TransformerEncoder(layer, layers).cuda()
        head = torch.nn.Linear(d, vocab).cuda()
        opt = torch.optim.AdamW(list(emb.parameters()) + list(body.parameters()) + list(head.parameters()), lr=1e-3)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(L, device="cuda")
        for _ in range(steps):
            tok = torch.randint(0, vocab, (B, L + 1), device="cuda")
            logits = head(body(emb(tok[:, :-1]), mask=mask, is_causal=True))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tok[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    def kvcache_infer(self, d, layers, new_tokens, B, prompt):
        torch = self.torch
        with torch.no_grad():
            Ws = [torch.randn(d, 3 * d, device="cuda") / d**0.5 for _ in range(layers)]
            x = torch.randn(B, prompt, d, device="cuda")
            ks, vs = [None] * layers, [None] * layers
            for t in range(new_tokens):
                h = x if t == 0 else x[:, -1:]
                for i in range(layers):
                    q, k, v = (h @ Ws[i]).split(d, dim=-1)
                    ks[i] = k if ks[i] is None else torch.cat([ks[i], k], 1)
                    vs[i] = v if vs[i] is None else torch.cat([vs[i], v], 1)
                    h = torch.softmax(q @ ks[i].transpose(1, 2) / d**0.5, -1) @ vs[i]
                x = torch.cat([x, h], 1)

    def multistream(self, iters):
        torch, rnd = self.torch, self.rnd
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        for _ in range(iters):
            a = torch.randn(rnd.choice([256, 512, 1024]), 1024, device="cuda")
            with torch.cuda.stream(s1):
                s1.wait_stream(torch.cuda.current_stream())
                b = a @ a.T
                a.record_stream(s1)
            with torch.cuda.stream(s2):
                c = torch.empty(rnd.randint(1, 8) << 20, dtype=torch.uint8, device="cuda")
                c.fill_(1)
            del a
            torch.cuda.current_stream().wait_stream(s1)
            del b, c
        torch.cuda.synchronize()

    def convnet_train(self, steps):
        torch, rnd = self.torch, self.rnd
        nn = torch.nn
        net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 16 * 16, 10)).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        for _ in range(steps):
            bs = rnd.choice([16, 32, 48, 64, 96])
            x = torch.randn(bs, 3, 64, 64, device="cuda")
            y = torch.randint(0, 10, (bs,), device="cuda")
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    def lstm_train(self, steps):
        torch, rnd = self.torch, self.rnd
        lstm = torch.nn.LSTM(256, 512, num_layers=2, batch_first=True).cuda()
        head = torch.nn.Linear(512, 1).cuda()
        opt = torch.optim.Adam(list(lstm.parameters()) + list(head.parameters()))
        for _ in range(steps):
            x = torch.randn(32, rnd.choice([32, 64, 100, 128]), 256, device="cuda")
            out, _ = lstm(x)
            loss = head(out).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def transformer_varlen(self, steps, layers):
        torch, rnd = self.torch, self.rnd
        layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, num_layers=layers).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(steps):
            L, B = rnd.choice([64, 128, 200, 256, 333]), rnd.choice([8, 16, 24])
            loss = model(torch.randn(B, L, 256, device="cuda")).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def mlp_train(self, steps):
        torch, rnd = self.torch, self.rnd
        nn = torch.nn
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                              nn.Linear(4096, 10)).cuda()
        opt = torch.optim.Adam(model.parameters())
        for _ in range(steps):
            x = torch.randn(rnd.choice([512, 1024, 2048]), 1024, device="cuda")
            y = torch.randint(0, 10, (x.shape[0],), device="cuda")
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    def random_stress(self, n, maxlog, live_cap):
        torch, rnd = self.torch, self.rnd
        live = []
        for i in range(n):
            if live and (len(live) > live_cap or rnd.random() < 0.47):
                live.pop(rnd.randrange(len(live)))
            else:
                try:
                    live.append(torch.empty(int(2 ** rnd.uniform(0, maxlog)), dtype=torch.uint8, device="cuda"))
                except torch.OutOfMemoryError as e:
                    self.oom(f"alloc{i}", e)
        live.clear()

    def oom_probe(self, chunk_mb, again_mb):
        torch = self.torch
        held = []
        try:
            while True:
                held.append(torch.empty(chunk_mb << 20, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as e:
            self.oom("oom", e)
        del held[::2]
        try:
            torch.empty(again_mb << 20, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            self.oom("oom2", e)
        held.clear()
        torch.empty(3 << 20, dtype=torch.uint8, device="cuda")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs")
    ap.add_argument("outdir")
    ap.add_argument("-j", type=int, default=16, help="chunk processes at once")
    ap.add_argument("--chunk", type=int, default=8, help="specs per chunk process")
    ap.add_argument("--timeout", type=float, default=90, help="seconds one workload may take")
    ap.add_argument("--only", help="comma-separated spec names")
    ap.add_argument("--chunk-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    specs = [json.loads(line) for line in open(a.specs) if line.strip()]
    if a.only:
        keep = set(a.only.split(","))
        specs = [s for s in specs if s["name"] in keep]
    if a.chunk_worker:
        run_chunk(specs, a.outdir, a.timeout)
        return
    # Chunks of one setting each: a chunk process's environment is its children's.
    by_conf = {}
    for s in specs:
        by_conf.setdefault(s["conf"], []).append(s)
    chunks = [group[i:i + a.chunk] for group in by_conf.values() for i in range(0, len(group), a.chunk)]
    chunks.sort(key=len, reverse=True)
    tmp = os.path.join(a.outdir, ".chunks")
    os.makedirs(tmp, exist_ok=True)
    started = time.time()

    def launch(n_chunk):
        n, chunk = n_chunk
        path = os.path.join(tmp, f"{n}.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in chunk)
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=chunk[0]["conf"])
        if not chunk[0]["conf"]:
            env.pop("PYTORCH_CUDA_ALLOC_CONF")
        r = subprocess.run([sys.executable, __file__, path, a.outdir, "--chunk-worker", "--timeout", str(a.timeout)],
                           env=env, capture_output=True, text=True)
        return r.stdout + (f"chunk {n}: exit {r.returncode}: {r.stderr[-2000:]}\n" if r.returncode else "")

    with open(os.path.join(a.outdir, "capture.log"), "a") as log, ThreadPoolExecutor(a.j) as pool:
        for out in pool.map(launch, enumerate(chunks)):
            log.write(out)
            log.flush()
    ok = sum(1 for s in specs if os.path.exists(os.path.join(a.outdir, s["name"] + ".expected.json")))
    print(f"captured {ok} of {len(specs)} workloads in {time.time() - started:.0f} s ({len(chunks)} chunk processes)")


if __name__ == "__main__":
    main()
