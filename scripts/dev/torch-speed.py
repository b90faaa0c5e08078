#!/usr/bin/env python3
"""Speed of a PyTorch job on PyTorch's allocator and on cachalot's, measured so that the host's
own swings cancel.

    torch-speed.py BENCH [ROUNDS] [STEPS]      (BENCH: gpt_train | convnet_train | alloc)

The allocator is chosen once per process, before CUDA starts, so the two cannot share one. The
host the GPU machine runs on slows down by up to ~1.8x for seconds at a time (BENCHMARKS.md,
"How the figures are taken"), so timing one process after another measures the host as much as the
allocator (40% between processes of the same allocator: docs/journal/benchmarks-2026-11.md §9). Here
three worker processes are started side by side and kept alive: PyTorch's allocator (`native`),
cachalot (`cachalot`), and PyTorch's allocator again (`native2`, the control: what the method reads
where there is no difference). Each has built its model and run 5 warm-up steps. The coordinator
then runs short blocks of STEPS steps in one worker at a time (the others idle, waiting on a pipe),
in the order native, cachalot, native2, native2, cachalot, native per round, so a slow stretch of
the host falls on the workers of one round alike and a drift within the round cancels. Per round,
the ratio of each round's cachalot median step to the mean of the two PyTorch workers' (and the
control's, native2 to native); reported: the median of the ROUNDS ratios with its 95% confidence
interval, and the median step over all rounds. Run it pinned to two cores (`taskset -c 2,3`, as
torch-device.sh does): only one worker runs at a time, and every worker's main and autograd threads
then share the same cores, whose neighbours on the host differ from core to core.

A step is timed on the host from its start to the end of `torch.cuda.synchronize()` after it
(what a training loop waits for). `alloc` times `torch.empty(size, dtype=uint8, device="cuda");
del` for the standard sizes, STEPS x 1000 times per size per block: ns per pair.

Prints one JSON line per round, then the table (Markdown). `--worker MODE BENCH` is the worker.
"""
import json
import os
import statistics
import subprocess
import sys
import time

ORDER = ("native", "cachalot", "native2", "native2", "cachalot", "native")
SIZES = (512, 4096, 65536, 1 << 20, 4 << 20, 32 << 20)


def worker(mode, bench):
    if mode == "cachalot":
        import cachalot_torch
        cachalot_torch.enable()
    import random

    import torch

    torch.manual_seed(1)
    rnd = random.Random(1)
    torch.zeros(1, device="cuda")

    def gpt_train(d=384, layers=4, L=256, B=16, vocab=8000):
        # ../shared/traces/capture.py's gpt_train.
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
        # ../shared/traces/capture.py's convnet_train (its batch sizes vary from step to step).
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

    def alloc_block(n):
        result = {}
        for size in SIZES:
            t = time.perf_counter_ns()
            for _ in range(n * 1000):
                x = torch.empty(size, dtype=torch.uint8, device="cuda")
                del x
            result[size] = (time.perf_counter_ns() - t) / (n * 1000)
        return result

    if bench == "alloc":
        alloc_block(2)
        run = alloc_block
    else:
        step = {"gpt_train": gpt_train, "convnet_train": convnet_train}[bench]()
        for _ in range(5):
            step()
        torch.cuda.synchronize()

        def run(n):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                step()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            return times

    out = sys.stdout
    sys.stdout = sys.stderr  # anything else the job prints stays off the protocol
    print("@ready", file=out, flush=True)
    for line in sys.stdin:
        print("@" + json.dumps(run(int(line))), file=out, flush=True)


def read(proc):
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {proc.args[-2]} ended early (rc {proc.wait()})")
        if line.startswith("@"):
            return line[1:].strip()


def median_interval(values):
    """The median of the rounds' ratios and its 95% confidence interval, distribution-free: the
    order statistics n/2 -+ 0.98 sqrt(n) of the sorted ratios."""
    v = sorted(values)
    n = len(v)
    half = 0.98 * n ** 0.5
    return statistics.median(v), v[max(0, int(n / 2 - half))], v[min(n - 1, int(n / 2 + half))]


def spread(values):
    """`median_interval` and the interquartile range, as the table writes them."""
    median, lo, hi = median_interval(values)
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{median:.4f} (95% CI {lo:.4f}-{hi:.4f}; IQR {q[0]:.4f}-{q[2]:.4f})"


def coordinate(bench, rounds, steps):
    here = os.path.abspath(__file__)
    procs = {mode: subprocess.Popen([sys.executable, here, "--worker", mode, bench], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, bufsize=1)
             for mode in ("native", "cachalot", "native2")}
    for proc in procs.values():
        if read(proc) != "ready":
            raise RuntimeError("worker did not start")
    per_round = []
    for r in range(rounds):
        blocks = {mode: [] for mode in procs}
        for mode in ORDER:
            procs[mode].stdin.write(f"{steps}\n")
            procs[mode].stdin.flush()
            blocks[mode].append(json.loads(read(procs[mode])))
        per_round.append(blocks)
        print(json.dumps({"bench": bench, "round": r, "blocks": blocks}), flush=True)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()

    print(f"\n{bench}: {rounds} rounds of {' '.join(ORDER)}, {steps} "
          f"{'x 1000 pairs per size' if bench == 'alloc' else 'steps'} per block, workers side by side\n")
    if bench == "alloc":
        print("| size | PyTorch ns/op (median block) | PyTorch again | cachalot | cachalot / PyTorch (both workers), median of rounds | control: PyTorch again / PyTorch |")
        print("|---|---|---|---|---|---|")
        for size in map(str, SIZES):
            med = {m: statistics.median(b[size] for r in per_round for b in r[m]) for m in procs}
            mean = [{m: statistics.mean(b[size] for b in r[m]) for m in procs} for r in per_round]
            against_both = [b["cachalot"] / ((b["native"] + b["native2"]) / 2) for b in mean]
            control = [b["native2"] / b["native"] for b in mean]
            print(f"| {size} B | {med['native']:.0f} | {med['native2']:.0f} | {med['cachalot']:.0f} | "
                  f"{spread(against_both)} | {spread(control)} |")
    else:
        med = {m: statistics.median(t for r in per_round for b in r[m] for t in b) for m in procs}
        block = [{m: statistics.median(t for b in r[m] for t in b) for m in procs} for r in per_round]
        against_both = [b["cachalot"] / ((b["native"] + b["native2"]) / 2) for b in block]
        control = [b["native2"] / b["native"] for b in block]
        n = rounds * 2 * steps
        print("| bench | PyTorch step | PyTorch again | cachalot step | cachalot / PyTorch (both workers), median of rounds | control: PyTorch again / PyTorch |")
        print("|---|---|---|---|---|---|")
        print(f"| {bench} (median of {n} steps each) | {med['native'] * 1e3:.3f} ms | {med['native2'] * 1e3:.3f} ms | "
              f"{med['cachalot'] * 1e3:.3f} ms | {spread(against_both)} | {spread(control)} |")


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        bench = sys.argv[1]
        rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 100
        steps = int(sys.argv[3]) if len(sys.argv) > 3 else (2 if bench == "alloc" else 5)
        coordinate(bench, rounds, steps)
