"""The command line of the capture scripts that list their workloads by name
(`capture_pools.py`, `capture_devices.py`): `SCRIPT OUTDIR [--only NAME,...]` runs each workload
in a process of its own (a new CUDA context, so the allocator starts empty with the workload's
PYTORCH_CUDA_ALLOC_CONF), which runs `SCRIPT OUTDIR --one NAME`."""

import argparse
import os
import subprocess
import sys


def main(script, doc, workloads, capture_one, timeout, before=None):
    """Parses the command line of `script` (described by the first paragraph of `doc`); in a
    workload's own process captures it with `capture_one(name, outdir)`, else calls
    `before(outdir)` if given and runs each workload named, with `workloads[name]` as
    PYTORCH_CUDA_ALLOC_CONF (unset where empty), printing `NAME ok` or the exit and its stderr."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    if a.one:
        capture_one(a.one, a.outdir)
        return
    if before:
        before(a.outdir)
    for name in a.only.split(",") if a.only else list(workloads):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=workloads[name])
        if not workloads[name]:
            env.pop("PYTORCH_CUDA_ALLOC_CONF")
        r = subprocess.run([sys.executable, script, a.outdir, "--one", name], env=env, capture_output=True,
                           text=True, timeout=timeout)
        status = "ok" if r.returncode == 0 else f"exit {r.returncode}: {r.stderr[-1500:]}"
        print(f"{name} {status}", flush=True)
