#!/usr/bin/env python3
"""Times PyTorch's caching allocator and cachalot's CUDA backend on the same op files, in pairs
taken a fraction of a second apart, round after round; prints per file the median of the pairs'
ratios. Runs on the GPU machine (`bash .device-bin/run.sh rounds N`, see scripts/dev/device-cuda.sh).

    paired-bench.py --cachalot PATH --harness torch_alloc_bench.py --rounds N [--log F] OPS...
    paired-bench.py --cachalot PATH --baseline PATH2 --rounds N OPS...   # two cachalot builds
    ... --config expandable_segments:True ...    # both sides under these settings

PyTorch is timed by the reference harness's own native code: `torch_alloc_bench.py` is imported,
its source built with the same `load_inline` call as its `main()`, and `replay(path, 0, 6)` called
as `main()` calls it (one warm-up replay dropped, the median of the other five, `empty_cache()`
after each file). Unlike `main()`, it does not replay the files on cudaMallocAsync in between:
only the caching allocator's numbers are compared. cachalot is timed by `cachalot bench --backend cuda FILE`, a fresh process per
measurement, with the same method. The two measurements of a pair are back to back, and which goes
first alternates from round to round.

Why pairs: the lent hosts have spells of several seconds in which every process runs ~1.8x slower
(the simulator as much as the CUDA backend). Starting the reference harness once per measurement put
3-4 s of Python start-up between its number and ours, so a round's two numbers often came from the
host in different states; here a pair's two calls return a fraction of a second apart (on an
H200 host: a median of 0.35 s, at most 1.1 s for the 200,000-op files).

`--baseline PATH2` pairs two builds of cachalot instead (e.g. before and after a change to the
core), each `cachalot bench --backend cuda FILE` as above; the ratio is PATH's time over PATH2's.
`--config STR` runs both sides under the same allocator settings: PyTorch's through
`PYTORCH_CUDA_ALLOC_CONF` (set before torch is imported), cachalot's through `--config`.
"""
import argparse
import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def load_reference(path):
    """The reference harness module and its native `replay`, built as its main() builds it."""
    spec = importlib.util.spec_from_file_location("torch_alloc_bench_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    native = module.load_inline(
        "torch_alloc_bench",
        cpp_sources=[module.SRC],
        functions=["replay"],
        with_cuda=True,
        extra_cflags=["-O3"],
    )
    module.torch.zeros(1, device="cuda")
    return module, native


def time_pytorch(module, native, path):
    ns = native.replay(str(path), 0, 6)[1:]
    module.torch.cuda.empty_cache()
    return statistics.median(ns)


def time_cachalot(binary, path, config):
    command = [binary, "bench", "--backend", "cuda", str(path)]
    if config:
        command += ["--config", config]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode == 0:
        for line in run.stdout.splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[1] == "cachalot-cuda":
                return float(fields[2])
    # What was measured so far is in the log.
    sys.exit(f"paired-bench: `cachalot bench` gave no time for {path} (exit {run.returncode}):\n{run.stderr}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ops", nargs="+", type=Path)
    parser.add_argument("--cachalot", required=True, help="the cachalot binary")
    reference = parser.add_mutually_exclusive_group(required=True)
    reference.add_argument("--harness", help="shared/bench/torch_alloc_bench.py: pair against PyTorch's allocator")
    reference.add_argument("--baseline", help="another cachalot binary: pair against it")
    parser.add_argument("--config", default="", help="allocator settings for both sides (PYTORCH_CUDA_ALLOC_CONF syntax)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--log", type=Path, help="append one line per measurement: round, file, side, ns per op, seconds since start"
    )
    args = parser.parse_args()

    started = time.monotonic()
    if args.baseline:
        reference_name, threshold = "baseline", None

        def time_reference(path):
            return time_cachalot(args.baseline, path, args.config)
    else:
        reference_name, threshold = "pytorch", 0.25
        if args.config:
            # Read once, when torch initialises CUDA: it must be set before the harness imports it.
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.config
        module, native = load_reference(args.harness)
        print(f"# reference harness built in {time.monotonic() - started:.0f}s", file=sys.stderr)

        def time_reference(path):
            return time_pytorch(module, native, path)

    pairs = {path.name: [] for path in args.ops}
    with open(args.log, "a") if args.log else contextlib.nullcontext() as log:
        for round_ in range(1, args.rounds + 1):
            for path in args.ops:
                # When each call returned: how far apart the two of a pair were, to within a start-up.
                if round_ % 2:
                    theirs, theirs_at = time_reference(path), time.monotonic()
                    ours, ours_at = time_cachalot(args.cachalot, path, args.config), time.monotonic()
                else:
                    ours, ours_at = time_cachalot(args.cachalot, path, args.config), time.monotonic()
                    theirs, theirs_at = time_reference(path), time.monotonic()
                pairs[path.name].append((theirs, ours))
                if log:
                    print(round_, path.name, reference_name, f"{theirs:.1f}", f"{theirs_at - started:.3f}", file=log)
                    print(round_, path.name, "cachalot", f"{ours:.1f}", f"{ours_at - started:.3f}", file=log, flush=True)
            print(f"round {round_} done", file=sys.stderr)

    # Against PyTorch: how many pairs are within the goal of 0.25; against another build: how many
    # pairs the build measured is the faster.
    column = "<=0.25" if threshold else "faster"
    print(
        f"{'ops file':<32} {reference_name:>9} {'cachalot':>9} {'ratio':>7} {'best':>7} {column:>7}"
        f"  (medians of rounds; median of the pairs' ratios; best/best; pairs {column}; each pair)"
    )
    for name in sorted(pairs):
        measured = pairs[name]
        ratios = [ours / theirs for theirs, ours in measured]
        best = min(ours for _, ours in measured) / min(theirs for theirs, _ in measured)
        within = sum(r <= threshold if threshold else r < 1 for r in ratios)
        print(
            f"{name:<32} {statistics.median(t for t, _ in measured):9.1f} "
            f"{statistics.median(o for _, o in measured):9.1f} {statistics.median(ratios):7.3f} {best:7.3f} "
            f"{within:>3}/{len(ratios):<3}  " + " ".join(f"{r:.3f}" for r in ratios)
        )


if __name__ == "__main__":
    main()
