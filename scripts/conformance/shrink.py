#!/usr/bin/env python3
"""Cuts a workload whose trace mismatches to the smallest that still mismatches (on the GPU
machine: every candidate is captured by PyTorch anew, so each step's trace is ground truth).

    shrink.py --cachalot PATH SPECS.jsonl NAME WORKDIR [--rounds 12] [-j 16]

NAME is a spec of SPECS.jsonl (see gen.py). A model-shaped workload is first turned into an op
program: the allocations and frees its trace recorded, on the same streams, with a
`record_stream` where a free completed late (`ops_from_trace`). Then, delta-debugging style, each
round captures the program with one of n parts left out, for every part at once (in parallel
processes, through capture.py), and keeps the first candidate whose replay still differs the
same way (the same first difference, numbers aside; see check.category); with none, the parts
are halved. WORKDIR/NAME.min.pickle and .expected.json are the smallest trace found, ready to
commit as a regression test (testdata/conformance/).
"""

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check  # noqa: E402


def ops_from_trace(path):
    """An op program of the allocations and frees of a captured trace."""
    snap = pickle.load(open(path, "rb"))
    trace = snap["device_traces"][0]
    streams, ops, slots, next_slot = {0: 0}, [], {}, 0
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            s = streams.setdefault(e["stream"], len(streams))
            slots[e["addr"]] = next_slot
            ops.append(["a", next_slot, e["size"], s])
            next_slot += 1
        elif e["action"] == "free_requested" and e["addr"] in slots:
            slot = slots.pop(e["addr"])
            late = not (i + 1 < len(trace) and trace[i + 1]["action"] == "free_completed"
                        and trace[i + 1]["addr"] == e["addr"])
            if late:
                side = streams.setdefault(("side", e["stream"]), len(streams))
                ops.append(["r", slot, side])
            ops.append(["f", slot])
        elif e["action"] == "oom":
            ops.append(["o", e["size"], streams.setdefault(e["stream"], len(streams))])
    return ops, len(streams)


def attempt(cachalot, specs, workdir, jobs):
    """Captures and checks candidate specs: {name: check line or None when not captured}."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "candidates.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in specs)
    subprocess.run([sys.executable, os.path.join(HERE, "capture.py"), path, workdir, "-j", str(jobs), "--chunk", "1"],
                   capture_output=True, text=True)
    out = {}
    for s in specs:
        p = os.path.join(workdir, s["name"] + ".pickle")
        out[s["name"]] = check.check(cachalot, [p])[s["name"]] if os.path.exists(p) else None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs")
    ap.add_argument("name")
    ap.add_argument("workdir")
    ap.add_argument("--cachalot", required=True)
    ap.add_argument("--trace", help="the mismatching capture of NAME (needed for a model workload)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("-j", type=int, default=16)
    a = ap.parse_args()
    spec = next(json.loads(line) for line in open(a.specs) if json.loads(line)["name"] == a.name)
    if spec["kind"] != "ops":
        ops, streams = ops_from_trace(a.trace)
        spec = dict(spec, kind="ops", ops=ops, streams=streams)
    base = attempt(a.cachalot, [dict(spec, name=f"{a.name}_r0")], a.workdir, a.j)[f"{a.name}_r0"]
    if base is None or base.startswith("MATCH"):
        print(f"{a.name}: the program does not mismatch ({base}); nothing to shrink")
        return 1
    want = check.category(base)
    print(f"{a.name}: {len(spec['ops'])} ops, {want}")
    ops, n, best = spec["ops"], 2, f"{a.name}_r0"
    for r in range(1, a.rounds + 1):
        if len(ops) < 2:
            break
        size = -(-len(ops) // n)
        parts = [(k, k + size) for k in range(0, len(ops), size)]
        cands = [dict(spec, name=f"{a.name}_r{r}c{k}", ops=ops[:lo] + ops[hi:]) for k, (lo, hi) in enumerate(parts)]
        results = attempt(a.cachalot, cands[: a.j * 2], a.workdir, a.j)
        hit = next((c for c in cands if results.get(c["name"]) and not results[c["name"]].startswith("MATCH")
                    and check.category(results[c["name"]]) == want), None)
        if hit:
            ops, n, best = hit["ops"], max(n - 1, 2), hit["name"]
        elif n >= len(ops):
            break
        else:
            n = min(2 * n, len(ops))
        print(f"round {r}: {len(ops)} ops (parts {n})", flush=True)
    for ext in (".pickle", ".expected.json"):
        shutil.copy(os.path.join(a.workdir, best + ext), os.path.join(a.workdir, a.name + ".min" + ext))
    print(f"{a.name}: smallest {len(ops)} ops -> {a.workdir}/{a.name}.min.pickle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
