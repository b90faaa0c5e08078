#!/usr/bin/env bash
# Times two builds of trace/examples/replay.rs (two versions of the core) on the same op files,
# alternating A and B run by run so that both see the shared machine in the same states, and
# prints per file each one's median and the ratio of the medians (B / A).
#
#   scripts/dev/ab-replay.sh A_BINARY B_BINARY ROUNDS REPLAYS FILE...
#
# FILE: a name in testdata/bench-ops (e.g. steady-1MiB). Each run is one process replaying the
# file REPLAYS times; its wall time includes start-up and parsing, the same for both. Build a
# binary with `cargo build --release -p cachalot-trace --example replay` and copy
# target/release/examples/replay aside before changing the core; scripts/dev/icount.sh counts
# the instructions per op of the same binaries, which repeat exactly where timings do not.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 5 ]] || { echo "usage: ab-replay.sh A_BINARY B_BINARY ROUNDS REPLAYS FILE..." >&2; exit 2; }
a=$1 b=$2 rounds=$3 replays=$4
shift 4
ops_dir=${CACHALOT_OPS_DIR:-testdata/bench-ops}
seconds() { local start end; start=$(date +%s.%N); "$1" "$2" "$3" >/dev/null; end=$(date +%s.%N); echo "$end - $start" | bc; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for name in "$@"; do
  file=$ops_dir/${name%.ops}.ops
  [[ -f $file ]] || { echo "ab-replay.sh: no op file $file" >&2; exit 1; }
  times_a=() times_b=()
  for ((round = 0; round < rounds; round++)); do
    # Which goes first alternates, so neither always runs right after the other.
    if ((round % 2 == 0)); then
      times_a+=("$(seconds "$a" "$file" "$replays")"); times_b+=("$(seconds "$b" "$file" "$replays")")
    else
      times_b+=("$(seconds "$b" "$file" "$replays")"); times_a+=("$(seconds "$a" "$file" "$replays")")
    fi
  done
  median_a=$(printf '%s\n' "${times_a[@]}" | median)
  median_b=$(printf '%s\n' "${times_b[@]}" | median)
  awk -v n="$name" -v a="$median_a" -v b="$median_b" -v r="$rounds" \
    'BEGIN { printf "%-30s A %.3f s  B %.3f s  B/A %.3f  (medians of %d runs each)\n", n, a, b, b / a, r }'
done
