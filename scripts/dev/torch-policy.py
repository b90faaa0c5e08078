#!/usr/bin/env python3
"""The proof set's jobs (torch-jobs.py) under four allocators, measured where users live.

    torch-policy.py speed JOB OUTFILE [ROUNDS] [STEPS]   step time, paired (one JSON line per round, then a summary line)
    torch-policy.py table CAPTURES SPEED_DIR             the Markdown table of BENCHMARKS.md

The four: PyTorch's allocator under the job's own settings (`native`, torch-jobs.py's CONF),
PyTorch's allocator under the best setting `cachalot tune` found for the job (`best`, from
BEST_CONF in the environment; the job's own settings where it is unset), cachalot's exact policy
(`cachalot`) and cachalot with `policy:cachalot` added (`policy`).

**speed** follows torch-speed.py's paired method: one worker process per allocator, plus a second
on PyTorch's (`native2`, the control), started side by side and kept alive; each builds its job
and runs 3 warm-up steps, then the coordinator runs blocks of STEPS steps in one worker at a
time, in the palindrome order ORDER per round, so that the host's slow stretches fall alike on
every worker of a round. A step is timed from its start to the end of torch.cuda.synchronize()
after it. Per round and worker, the median step; per round, each worker's ratio to the mean of
the two PyTorch workers; reported: the median of the rounds' ratios with its 95% confidence
interval. Each worker also counts device calls (num_device_alloc + num_device_free) over its
timed steps: the steady state's calls per step. Workers pin themselves to CPUs 2 and 3 after
set-up (only one runs at a time).

**table** reads CAPTURES/MODE/JOB.expected.json (torch-proof.py's runs of torch-jobs.py: peaks and
device calls of the proof run) for MODE in native, best, cachalot, policy, and SPEED_DIR/JOB.jsonl.
"""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("native", "best", "cachalot", "policy", "native2")
ORDER = ("native", "cachalot", "policy", "best", "native2", "native2", "best", "policy", "cachalot", "native")
HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, module):
    """The script `name` beside this one, as a module."""
    spec = importlib.util.spec_from_file_location(module, os.path.join(HERE, name))
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def load_jobs():
    return load("torch-jobs.py", "torch_jobs")


def device_calls(torch):
    stats = torch.cuda.memory_stats()
    return stats.get("num_device_alloc", 0) + stats.get("num_device_free", 0)


def pin_every_thread(cpus):
    """The worker's threads (the main one, autograd's, CUDA's) onto `cpus`, where there are such."""
    available = os.sched_getaffinity(0)
    if not set(cpus) <= available:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # a thread that ended meanwhile


def worker(mode, name):
    base = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if mode in ("cachalot", "policy"):
        import cachalot_torch
        cachalot_torch.enable(config=",".join(filter(None, [base, "policy:cachalot" if mode == "policy" else ""])))
    jobs = load_jobs()
    torch = jobs.torch
    torch.manual_seed(1)
    jobs.rnd.seed(1)
    torch.zeros(1, device="cuda")
    job = jobs.JOBS[name]()
    s = 0
    for _ in range(3):
        job.step(s)
        s += 1
    torch.cuda.synchronize()
    pin_every_thread({2, 3})
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the job prints stays off the protocol
    print("@ready", file=out, flush=True)
    for line in sys.stdin:
        times = []
        before = device_calls(torch)
        for _ in range(int(line)):
            t = time.perf_counter()
            job.step(s)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            s += 1
        print("@" + json.dumps({"times": times, "device_calls": device_calls(torch) - before}), file=out, flush=True)


def read(proc, mode):
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {mode} ended early (rc {proc.wait()})")
        if line.startswith("@"):
            return line[1:].strip()


def speed(name, outfile, rounds, steps):
    native_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    best_conf = os.environ.get("BEST_CONF", native_conf)
    procs = {}
    for mode in MODES:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=best_conf if mode == "best" else native_conf,
                   MASTER_PORT=str(29600 + MODES.index(mode)))
        procs[mode] = subprocess.Popen([sys.executable, __file__, "--worker", mode, name], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
    # A worker other than PyTorch's two that fails (an OOM under a setting tuned to the proof
    # run's peak, say) is left out from then on, and the summary says so.
    failed = {}

    def ask(mode, line):
        try:
            if line is not None:
                procs[mode].stdin.write(line)
                procs[mode].stdin.flush()
            return read(procs[mode], mode)
        except (RuntimeError, OSError) as e:
            if mode in ("native", "native2"):
                raise
            failed[mode] = str(e)
            procs[mode].kill()
            return None
    for mode in MODES:
        if ask(mode, None) not in ("ready", None):
            raise RuntimeError(f"worker {mode} did not start")
    with open(outfile, "w") as out:
        per_round = []
        for r in range(rounds):
            blocks = {mode: [] for mode in MODES}
            for mode in ORDER:
                if mode not in failed and (reply := ask(mode, f"{steps}\n")) is not None:
                    blocks[mode].append(json.loads(reply))
            per_round.append(blocks)
            out.write(json.dumps({"job": name, "round": r, "blocks": blocks}) + "\n")
        for mode, proc in procs.items():
            if mode not in failed:
                proc.stdin.close()
            proc.wait()
        summary = summarize(name, [{m: r[m] for m in MODES if m not in failed} for r in per_round], steps,
                            native_conf, best_conf)
        summary["failed"] = failed
        out.write(json.dumps(summary) + "\n")
    print(json.dumps(summary))


def summarize(name, per_round, steps, native_conf, best_conf):
    modes = [m for m in MODES if m in per_round[0]]
    median_step = {m: statistics.median(t for r in per_round for b in r[m] for t in b["times"]) for m in modes}
    per_block = [{m: statistics.median(t for b in r[m] for t in b["times"]) for m in modes} for r in per_round]
    median_interval = load("torch-speed.py", "torch_speed").median_interval
    ratio = {}
    for m in modes:
        if m == "native":
            continue
        against = "native" if m == "native2" else None
        values = [b[m] / (b["native"] if against else (b["native"] + b["native2"]) / 2) for b in per_block]
        ratio[m] = median_interval(values)
    calls = {m: sum(b["device_calls"] for r in per_round for b in r[m]) / (len(per_round) * 2 * steps) for m in modes}
    return {"job": name, "summary": True, "rounds": len(per_round), "steps_per_block": steps, "conf": native_conf,
            "best_conf": best_conf, "median_step_s": median_step, "ratio": ratio, "device_calls_per_step": calls}


def table(captures, speed_dir):
    jobs = load_jobs_names()
    print("| job (settings) | PyTorch peak reserved / allocated | PyTorch's best setting (tune) | best / default | "
          "cachalot exact / default | policy:cachalot / default | policy / best | policy peak allocated / default | "
          "device calls per step, steady (default · best · exact · policy) | step time / PyTorch's, median of rounds "
          "(best · exact · policy; control) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for name in jobs:
        runs, confs = {}, {}
        for mode in ("native", "best", "cachalot", "policy"):
            try:
                with open(f"{captures}/{mode}/{name}.expected.json") as f:
                    expected = json.load(f)
                runs[mode], confs[mode] = expected["memory_stats"], expected.get("PYTORCH_CUDA_ALLOC_CONF", "")
            except (OSError, ValueError, KeyError):
                runs[mode] = None
        if runs["native"] is None:
            continue
        summary = None
        try:
            with open(f"{speed_dir}/{name}.jsonl") as f:
                summary = [json.loads(line) for line in f if '"summary"' in line][-1]
        except (OSError, IndexError, ValueError):
            pass
        reserved = {m: s["reserved_bytes.all.peak"] for m, s in runs.items() if s}
        native = runs["native"]
        conf, best = confs["native"], confs.get("best", "not run")

        def rel(m, to="native"):
            return f"{reserved[m] / reserved[to]:.3f}" if m in reserved and to in reserved else "—"
        if "policy" in reserved:
            ratios.append(reserved["policy"] / reserved["native"])
        policy_alloc = (f"{runs['policy']['allocated_bytes.all.peak'] / native['allocated_bytes.all.peak']:.3f}"
                        if runs["policy"] else "—")
        if summary:
            calls = " · ".join(f"{summary['device_calls_per_step'][m]:.2f}" if m in summary["ratio"] or m == "native"
                               else "failed" for m in ("native", "best", "cachalot", "policy"))
            times = " · ".join(f"{summary['ratio'][m][0]:.3f}" if m in summary["ratio"] else "failed"
                               for m in ("best", "cachalot", "policy"))
            times += f"; {summary['ratio']['native2'][0]:.3f} (PyTorch step {summary['median_step_s']['native'] * 1e3:.2f} ms)"
        else:
            calls = times = "not measured"
        print(f"| {name} ({conf or 'defaults'}) | {reserved['native']:,} / {native['allocated_bytes.all.peak']:,} "
              f"({reserved['native'] / native['allocated_bytes.all.peak']:.3f}) | {best or 'defaults'} | {rel('best')} | "
              f"{rel('cachalot')} | {rel('policy')} | {rel('policy', 'best')} | {policy_alloc} | {calls} | {times} |")
    if ratios:
        geomean = 1.0
        for r in ratios:
            geomean *= r
        geomean **= 1 / len(ratios)
        print(f"\npolicy:cachalot peak reserved / PyTorch's default: geometric mean {geomean:.3f} over {len(ratios)} "
              f"jobs, highest {max(ratios):.3f}")


def load_jobs_names():
    # The table's rows in torch-jobs.py's order, without importing torch.
    source = open(os.path.join(HERE, "torch-jobs.py")).read()
    start = source.index("JOBS = {f.__name__: f for f in (")
    names = source[start:source.index(")}", start)].split("(", 1)[1]
    return [n.strip() for n in names.replace("\n", " ").split(",") if n.strip()]


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "speed":
        speed(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 12,
              int(sys.argv[5]) if len(sys.argv) > 5 else 4)
    elif sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
