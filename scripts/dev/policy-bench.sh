#!/usr/bin/env bash
# `policy:cachalot` against PyTorch's policy on one device (BENCHMARKS.md §15, "The policy on
# CUDA"): `cachalot bench` under each policy on the same op files, ROUNDS rounds, the order
# alternating, pinned to one core. Prints per file the medians of the rounds' ns per op and the
# median of the rounds' ratios (ours / PyTorch's policy).
#
#   [BACKEND=cuda] [PIN=5] [OUT=DIR] scripts/dev/policy-bench.sh CACHALOT ROUNDS OPS_FILE...
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: policy-bench.sh CACHALOT ROUNDS OPS_FILE..." >&2
  exit 2
fi
bin=$1 rounds=$2
shift 2
out=${OUT:-/tmp}/policy-rounds.txt
: >"$out"
for r in $(seq "$rounds"); do
  if ((r % 2)); then order=("" "policy:cachalot"); else order=("policy:cachalot" ""); fi
  for config in "${order[@]}"; do
    taskset -c "${PIN:-5}" "$bin" bench --backend "${BACKEND:-cuda}" --config "$config" "$@" 2>/dev/null |
      awk -v r="$r" -v c="${config:-pytorch}" '/ns\/op/ { sub(/\.ops$/, "", $1); print r, $1, c, $(NF-1) }' >>"$out"
  done
  echo "round $r done" >&2
done
python3 - "$out" <<'PY'
import collections
import statistics
import sys

rounds = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, name, policy, ns = line.split()
    rounds[(name, int(r))][policy] = float(ns)
print(f"{'ops file':34} {'pytorch':>9} {'cachalot':>9} {'ratio':>7}  (ns/op medians of rounds; median of the rounds' ratios)")
for name in sorted({name for name, _ in rounds}):
    both = [t for (n, _), t in rounds.items() if n == name and len(t) == 2]
    ours = statistics.median(t["policy:cachalot"] for t in both)
    theirs = statistics.median(t["pytorch"] for t in both)
    ratio = statistics.median(t["policy:cachalot"] / t["pytorch"] for t in both)
    print(f"{name:34} {theirs:9.1f} {ours:9.1f} {ratio:7.3f}  ({len(both)} rounds)")
PY
