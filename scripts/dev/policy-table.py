#!/usr/bin/env python3
"""The per-trace table of BENCHMARKS.md §3: peak reserved under PyTorch's default
settings, under PyTorch's best setting (`cachalot tune`), under cachalot's own policy
(`policy:cachalot` on top of the trace's settings) and the lower bound, peak allocated with every
request rounded up to 512 B alone (from the trace's alloc / free_completed entries).

    scripts/dev/policy-table.py [--cachalot PATH] [TRACE.pickle ...]   # default: testdata's nine
"""
import argparse
import json
import pickle
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lower_bound(trace):
    """Peak of live bytes, each request rounded up to 512 B, in the recorded order of events."""
    with open(trace, "rb") as f:
        snapshot = pickle.load(f)
    live = peak = 0
    for entry in snapshot["device_traces"][0]:
        size = max(512, -(-entry["size"] // 512) * 512)
        if entry["action"] == "alloc":
            live += size
            peak = max(peak, live)
        elif entry["action"] == "free_completed":
            live -= size
    return peak


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cachalot", default=str(ROOT / "target" / "debug" / "cachalot"))
    parser.add_argument("traces", nargs="*")
    args = parser.parse_args()
    traces = args.traces or sorted(str(p) for p in (ROOT / "testdata/traces/pytorch-2.11-h200").glob("*.pickle"))
    print("| trace | PyTorch default | PyTorch best (tune) | policy:cachalot | lower bound | ours / lower bound "
          "| ours / peak allocated | ours / PyTorch best | device allocs + frees, best → ours |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for trace in traces:
        out = subprocess.run([args.cachalot, "tune", "--json", "--top", "1", "--own-policy", trace],
                             check=True, capture_output=True, text=True).stdout
        tuning = json.loads(out)
        best, own = tuning["winner"], tuning["own_policy"]
        default = subprocess.run([args.cachalot, "stats", "--json", "--config", "", trace],
                                 check=True, capture_output=True, text=True).stdout
        default_peak = json.loads(default)["reserved_bytes.all.peak"]
        bound = lower_bound(trace)
        name = Path(trace).stem
        assert own["new_ooms"] == 0, f"{name}: policy:cachalot runs out of memory where PyTorch did not"
        print(f"| {name} | {default_peak:,} | {best['peak_reserved']:,} | {own['peak_reserved']:,} | {bound:,} "
              f"| {own['peak_reserved'] / bound:.3f} | {own['reserved_per_allocated']:.3f} "
              f"| {own['peak_reserved'] / best['peak_reserved']:.3f} "
              f"| {best['device_allocs'] + best['device_frees']} → {own['device_allocs'] + own['device_frees']} |")


if __name__ == "__main__":
    main()
