#!/usr/bin/env python3
"""Runs `cachalot replay --check` over every captured trace of a directory and reports.

    check.py --cachalot PATH DIR [-j 16] [--pack OUT --pack-limit-mib 15 --pack-files 6]

Prints one line per trace that does not MATCH, then a table: MATCH / MISMATCH / error counts, the
mismatches by what differed first, and the outcome by allocator setting (each key of
PYTORCH_CUDA_ALLOC_CONF, the memory fraction, the workload kind). Writes DIR/check.txt with every
trace's line. Exit status 1 when any trace did not MATCH.

With --pack, the traces are brought together for the trip back from the GPU machine: each
NAME.pickle and NAME.expected.json xz-compressed, mismatches first, in tar files of at most
--pack-limit-mib each (at most --pack-files of them; what does not fit is left out and counted).
"""

import argparse
import collections
import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor


def check(cachalot, paths):
    """`cachalot replay --check` of a few traces: {name: line}."""
    r = subprocess.run([cachalot, "replay", "--check", *paths], capture_output=True, text=True)
    lines = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(MATCH|MISMATCH) ([^:\s]+)", line)
        if m:
            lines[m.group(2)] = line
    for p in paths:
        name = os.path.basename(p)[: -len(".pickle")]
        if name not in lines:
            err = [e for e in r.stderr.splitlines() if name in e] or r.stderr.splitlines()[-1:] or ["no output"]
            lines[name] = f"ERROR {name}: {err[0]}"
    return lines


def category(line):
    """What differed first, without the numbers: `segment event`, `memory_stats[KEY]`, ..."""
    if line.startswith("MATCH"):
        return "MATCH"
    body = line.split(": ", 1)[1] if ": " in line else line
    if line.startswith("ERROR"):
        return "error: " + re.sub(r"0x[0-9a-f]+|\d+", "N", body)[:80]
    m = re.match(r"(memory_stats\[[^\]]+\])", body)
    if m:
        return m.group(1)
    body = re.sub(r"^entry \d+: ", "", body)
    return re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "N", body.split(",")[0])[:70]


def pack(directory, names, order, out, limit, files):
    """Tars of xz-compressed traces, those in `order` first."""
    os.makedirs(out, exist_ok=True)
    tars, current, size, left = [], None, 0, 0
    ordered = order + [n for n in names if n not in set(order)]

    def compressed(name):
        blobs = []
        for ext in (".pickle", ".expected.json"):
            path = os.path.join(directory, name + ext)
            if os.path.exists(path):
                blobs.append((name + ext + ".xz", lzma.compress(open(path, "rb").read(), preset=3)))
        return blobs

    with ThreadPoolExecutor(os.cpu_count()) as threads:
        everything = list(threads.map(compressed, ordered))
    for blobs in everything:
        need = sum(len(b) + 1024 for _, b in blobs)
        if need > limit:
            left += 1
            continue
        if current is None or size + need > limit:
            if current is not None:
                current.close()
                current = None
            if len(tars) == files:
                left += 1
                continue
            tars.append(os.path.join(out, f"traces-{len(tars)}.tar"))
            current, size = tarfile.open(tars[-1], "w"), 0
        for arcname, blob in blobs:
            info = tarfile.TarInfo(arcname)
            info.size = len(blob)
            current.addfile(info, io.BytesIO(blob))
        size += need
    if current is not None:
        current.close()
    return tars, left


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--cachalot", default="cachalot")
    ap.add_argument("-j", type=int, default=16)
    ap.add_argument("--pack")
    ap.add_argument("--pack-limit-mib", type=float, default=15)
    ap.add_argument("--pack-files", type=int, default=6)
    a = ap.parse_args()
    names = sorted(f[: -len(".pickle")] for f in os.listdir(a.dir) if f.endswith(".pickle"))
    paths = [os.path.join(a.dir, n + ".pickle") for n in names]
    batches = [paths[i:i + 8] for i in range(0, len(paths), 8)]
    results = {}
    with ThreadPoolExecutor(a.j) as pool:
        for lines in pool.map(lambda b: check(a.cachalot, b), batches):
            results.update(lines)
    with open(os.path.join(a.dir, "check.txt"), "w") as f:
        f.writelines(results[n] + "\n" for n in names)
    bad = [n for n in names if not results[n].startswith("MATCH ")]
    for n in bad:
        print(results[n][:400])
    outcome = collections.Counter(results[n].split(" ", 1)[0] for n in names)
    print(f"\n{outcome['MATCH']} MATCH, {outcome['MISMATCH']} MISMATCH, {outcome['ERROR']} ERROR of {len(names)} traces")
    for cat, count in collections.Counter(category(results[n]) for n in bad).most_common():
        print(f"  {count:5d}  {cat}")
    # Outcome by setting.
    by_key = collections.defaultdict(collections.Counter)
    for n in names:
        try:
            e = json.load(open(os.path.join(a.dir, n + ".expected.json")))
        except (OSError, ValueError):
            continue
        conf = e.get("PYTORCH_CUDA_ALLOC_CONF") or ""
        keys = re.findall(r"([a-z_0-9]+):", re.sub(r"\[[^\]]*\]", "L", conf)) or ["(defaults)"]
        if e.get("memory_fraction"):
            keys.append("set_per_process_memory_fraction")
        spec = e.get("spec") or {}
        keys.append("kind=" + (spec.get("model") or spec.get("kind") or "?"))
        for call in {c["call"] for c in e.get("calls", [])}:
            keys.append("call=" + call)
        if any(m.get("message") for m in e.get("marks", [])):
            keys.append("OOM caught")
        for k in keys:
            by_key[k][results[n].split(" ", 1)[0]] += 1
    print("\n  setting / feature                     traces  MATCH")
    for k in sorted(by_key):
        c = by_key[k]
        print(f"  {k:38s} {sum(c.values()):6d} {c['MATCH']:6d}")
    if a.pack:
        tars, left = pack(a.dir, names, bad, a.pack, int(a.pack_limit_mib * (1 << 20)), a.pack_files)
        print(f"\npacked into {len(tars)} tar files; {left} traces left out")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
