#!/usr/bin/env python3
"""Proof that `cachalot tune` predicts PyTorch to the byte (issue 18): for each workload of
testdata/traces/capture.py listed in tune-proof.expected.json, run it under PyTorch with the
setting tune recommends for its reference trace, and compare PyTorch's peak reserved
(`max_memory_reserved()`, read from the run's memory_stats) and OOM count with tune's prediction.

    tune_proof.py run [--cachalot PATH] [--out DIR] [--only NAME...]   # on the GPU machine
    tune_proof.py expect --cachalot PATH                              # here: rewrite the figures

`expect` runs `cachalot tune --json` on each reference trace and writes the recommended setting
and its predicted peak into tune-proof.expected.json (the committed figures). `run` needs a CUDA
GPU and PyTorch 2.11. A recommendation that includes `per_process_memory_fraction` is a share of
the device's memory, so the figures hold for a device of the reference traces' size (an H200,
150,109,880,320 bytes); on another device, `--cachalot PATH` (the binary of
scripts/dev/device-cuda.sh) tunes again for the device's size before running. With `--cachalot`,
each new run's trace is also replayed with `cachalot replay --check`, which says where PyTorch and
the replay part if the peaks differ.

Exit status: 0 when every workload's peak matches, 1 when one differs, 2 on a setup error.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).resolve().with_name("tune-proof.expected.json")
TRACES = ROOT / "testdata" / "traces"

# The workloads proved: capture.py's name, its seed and extra environment as capture_all.sh runs
# them, and the reference trace they made. Chosen because tune's winner differs from the trace's
# own settings in a different key for each.
WORKLOADS = [
    {"workload": "convnet_train", "seed": 4, "env": {}, "trace": "convnet_train"},
    {"workload": "kvcache_infer", "seed": 2, "env": {}, "trace": "kvcache_infer"},
    {"workload": "gpt_train", "seed": 1, "env": {}, "trace": "gpt_train"},
    {"workload": "random_stress@maxsplit", "seed": 5, "env": {}, "trace": "random_stress_maxsplit"},
]


def tune(cachalot, trace, device_total=None):
    """tune's winner for `trace`: (settings, predicted peak reserved, predicted OOMs, device total)."""
    command = [cachalot, "tune", "--json", "--top", "1", str(trace)]
    if device_total is not None:
        command[2:2] = ["--device-total", str(device_total)]
    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    winner = result["winner"]
    return winner["settings"], winner["peak_reserved"], winner["ooms"], result["device_total"]


def expect(args):
    figures = []
    for w in WORKLOADS:
        trace = TRACES / "pytorch-2.11-h200" / f"{w['trace']}.pickle"
        settings, peak, ooms, total = tune(args.cachalot, trace)
        figures.append({**w, "settings": settings, "peak_reserved": peak, "ooms": ooms, "device_total": total})
        print(f"{w['workload']}: PYTORCH_CUDA_ALLOC_CONF={settings} -> peak reserved {peak:,} B, {ooms} OOMs")
    EXPECTED.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


def run(args):
    import torch  # only the GPU machine needs PyTorch

    if not torch.cuda.is_available():
        print("tune_proof.py: no CUDA device", file=sys.stderr)
        return 2
    device_total = torch.cuda.get_device_properties(0).total_memory
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}, total_memory {device_total:,} B")
    figures = json.loads(EXPECTED.read_text())
    if args.only:
        figures = [f for f in figures if f["workload"] in args.only or f["trace"] in args.only]
    out = Path(args.out or tempfile.mkdtemp(prefix="tune-proof-"))
    failures = 0
    for f in figures:
        trace = TRACES / "pytorch-2.11-h200" / f"{f['trace']}.pickle"
        settings, peak = f["settings"], f["peak_reserved"]
        uses_fraction = "per_process_memory_fraction" in settings
        if uses_fraction and device_total != f["device_total"]:
            if not args.cachalot:
                print(f"{f['workload']}: the committed setting is a share of a {f['device_total']:,} B device; "
                      f"this one has {device_total:,} B: give --cachalot to tune for it", file=sys.stderr)
                return 2
            settings, peak, f["ooms"], _ = tune(args.cachalot, trace, device_total)
            print(f"{f['workload']}: tuned again for {device_total:,} B")
        env = {**os.environ, **f["env"], "PYTORCH_CUDA_ALLOC_CONF": settings}
        capture = subprocess.run([sys.executable, str(TRACES / "capture.py"), f["workload"], str(out), str(f["seed"])],
                                 env=env, capture_output=True, text=True, timeout=600)
        if capture.returncode != 0:
            print(f"{f['workload']}: capture.py failed:\n{capture.stdout}{capture.stderr}", file=sys.stderr)
            failures += 1
            continue
        tag = f["workload"].replace("@", "_")
        stats = json.loads((out / f"{tag}.expected.json").read_text())["memory_stats"]
        measured, ooms = stats["reserved_bytes.all.peak"], stats.get("num_ooms", 0)
        same = measured == peak and ooms == f["ooms"]
        failures += not same
        print(f"{'MATCH' if same else 'DIFFER'} {f['workload']}: PYTORCH_CUDA_ALLOC_CONF={settings}\n"
              f"  tune predicted peak reserved {peak:,} B, {f['ooms']} OOMs; PyTorch reached {measured:,} B, {ooms} OOMs"
              + ("" if same else f" ({measured - peak:+,} B)"))
        if args.cachalot:
            check = subprocess.run([args.cachalot, "replay", "--check", str(out / f"{tag}.pickle")],
                                   capture_output=True, text=True)
            print("  cachalot replay --check of the new run: " + (check.stdout + check.stderr).strip().splitlines()[-1]
                  if (check.stdout + check.stderr).strip() else "  (no output)")
    print(f"{len(figures) - failures} of {len(figures)} workloads match tune's prediction to the byte; runs in {out}")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the workloads under PyTorch and compare (GPU machine)")
    r.add_argument("--cachalot", help="a cachalot binary: tunes again for this device where needed, checks the runs")
    r.add_argument("--out", help="where the runs' pickles and expected.json go (default: a new temporary dir)")
    r.add_argument("--only", nargs="*", help="workloads or trace names to run (default: all)")
    e = sub.add_parser("expect", help="recompute the committed figures with cachalot tune (here)")
    e.add_argument("--cachalot", required=True, help="the cachalot binary")
    args = parser.parse_args()
    return run(args) if args.command == "run" else expect(args)


if __name__ == "__main__":
    sys.exit(main())
