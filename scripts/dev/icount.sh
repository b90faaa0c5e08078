#!/usr/bin/env bash
# Instructions per op of the allocator on op files, counted by callgrind (valgrind): exact and
# repeatable, where timings on a shared 2-core machine move by 5-10% between runs. Each file is
# replayed once and three times; the difference over two replays' ops is one warm op's cost.
#
#   scripts/dev/icount.sh [BINARY] FILE...   (FILE: a name in testdata/bench-ops, e.g. steady-1MiB)
#
# BINARY defaults to a fresh build of trace/examples/replay.rs in the benchmark profile (fat LTO);
# pass a saved copy to compare two versions of the core. CACHALOT_SETTINGS is the allocator's
# configuration (e.g. policy:cachalot; PyTorch's defaults without it); ICOUNT_REPLAYS="4 6"
# counts replays 5-6 instead of 2-3, for files that settle only after a few replays.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "icount.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
if [[ $# -gt 0 && -x "$1" && ! -d "$1" && "$1" == */* ]]; then
  binary=$1; shift
else
  cargo build --profile benchmark --quiet -p cachalot-trace --example replay
  binary=${CARGO_TARGET_DIR:-target}/benchmark/examples/replay
fi
ops_dir=${CACHALOT_OPS_DIR:-testdata/bench-ops}
[[ -d $ops_dir ]] || { echo "icount.sh: no $ops_dir (set CACHALOT_OPS_DIR to a folder of op files)" >&2; exit 1; }
settings=${CACHALOT_SETTINGS:-}
read -r first last <<<"${ICOUNT_REPLAYS:-1 3}"
# The example's per-replay report (a stats() call) stays out of the count.
export CACHALOT_REPLAY_QUIET=1
count() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$binary" "$1" "$2" ${settings:+"$settings"} 2>&1 | awk '/Collected/ {print $4}'; }
for name in "$@"; do
  file=$ops_dir/${name%.ops}.ops
  [[ -f $file ]] || { echo "icount.sh: no op file $file" >&2; exit 1; }
  ops=$(grep -c '^[af]' "$file")
  a=$(count "$file" "$first")
  b=$(count "$file" "$last")
  awk -v n="$name" -v a="$a" -v b="$b" -v k=$((last - first)) -v ops="$ops" 'BEGIN { printf "%-30s %8.1f instructions/op\n", n, (b - a) / k / ops }'
done
