#!/usr/bin/env bash
# `policy:cachalot` against PyTorch's policy on one device (BENCHMARKS.md §15, "The policy on
# CUDA"): `cachalot bench` under each policy on the same op files, ROUNDS rounds, the order
# alternating, pinned to one core. Prints per file the medians of the rounds' ns per op and the
# median of the rounds' ratios (ours / PyTorch's policy); and the hot path apart: the same ratio
# over only the timed replays that made no device call (`cachalot bench --each-replay`), with
# how many of ours' timed replays did make some.
#
# With BEST=FILE (lines `OPS_NAME|SETTINGS`, OPS_NAME the op file's name without `.ops`; the
# settings of §15 are in scripts/dev/policy-best-settings.txt), each file named there is also
# timed under PyTorch's policy with SETTINGS: the setting `cachalot tune` finds for the trace
# the file was made from, the one that gives PyTorch's lowest peak.
# Its `per_process_memory_fraction` is a share of the device it was tuned for (TRACE_TOTAL
# bytes, an H200's by default), so it is rescaled to this device's total (DEVICE_TOTAL, asked
# of PyTorch when unset): the same allowed bytes on any device. The table then also gives ours
# against PyTorch's policy at that setting, both aiming at a low peak.
#
#   [BACKEND=cuda] [PIN=5] [OUT=DIR] [BEST=FILE] scripts/dev/policy-bench.sh CACHALOT ROUNDS OPS_FILE...
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: policy-bench.sh CACHALOT ROUNDS OPS_FILE..." >&2
  exit 2
fi
bin=$1 rounds=$2
shift 2
out=${OUT:-/tmp}/policy-rounds.txt
: >"$out"

# The settings of PyTorch's best for op file $1 on this device, or nothing.
best_settings() {
  [[ -n ${BEST:-} ]] || return 0
  local line
  line=$(grep -m1 "^$1|" "$BEST" || true)
  [[ -n $line ]] || return 0
  python3 - "${line#*|}" "${TRACE_TOTAL:-150109880320}" "$device_total" <<'PY'
import sys

settings, tuned_for, here = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keys = []
for item in filter(None, settings.split(",")):
    key, _, value = item.partition(":")
    if key == "per_process_memory_fraction":
        value = f"{float(value) * tuned_for / here:.9f}"
    keys.append(f"{key}:{value}")
print(",".join(keys) or "default")
PY
}

if [[ -n ${BEST:-} ]]; then
  device_total=${DEVICE_TOTAL:-$(python3 -c "import torch; print(torch.cuda.mem_get_info()[1])")}
  echo "policy-bench: PyTorch's best settings rescaled to a device of $device_total bytes" >&2
fi

for r in $(seq "$rounds"); do
  for ops in "$@"; do
    name=$(basename "$ops" .ops)
    configs=("pytorch=" "policy:cachalot=policy:cachalot")
    best=$(best_settings "$name")
    if [[ -n $best ]]; then
      [[ $best == default ]] && best=""
      configs+=("best=$best")
    fi
    # The order turns by one each round, so no policy always runs first.
    n=${#configs[@]}
    for ((i = 0; i < n; i++)); do
      entry=${configs[$(((i + r) % n))]}
      label=${entry%%=*} config=${entry#*=}
      # The median line, then the hot path: the median of the timed replays that made no
      # device call ("-" when every one did), and how many made some.
      taskset -c "${PIN:-5}" "$bin" bench --backend "${BACKEND:-cuda}" --config "$config" --each-replay "$ops" 2>/dev/null |
        python3 -c '
import statistics, sys
r, label = sys.argv[1:]
lines = sys.stdin.read().splitlines()
name, median = lines[0].split()[0].removesuffix(".ops"), lines[0].split()[-2]
replays = [(float(l.split()[4]), int(l.split()[6])) for l in lines[1:] if l.startswith("# ")]
hot = [ns for ns, calls in replays if calls == 0]
hot_median = f"{statistics.median(hot):.1f}" if hot else "-"
print(r, name, label, median, hot_median, sum(1 for _, calls in replays if calls))
' "$r" "$label" >>"$out"
    done
  done
  echo "round $r done" >&2
done
python3 - "$out" <<'PY'
import collections
import statistics
import sys

rounds = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, name, policy, ns, hot, moving = line.split()
    rounds[(name, int(r))][policy] = (float(ns), None if hot == "-" else float(hot), int(moving))
print(f"{'ops file':34} {'pytorch':>9} {'best':>9} {'cachalot':>9} {'ours/pytorch':>12} {'ours/best':>9}"
      f" {'hot path':>9} {'moving':>6}")
print("  (ns/op medians of rounds; ratios: medians of the rounds' ratios; hot path: ours / PyTorch's defaults"
      " over the timed replays that made no device call; moving: ours' timed replays with device calls, per round)")
for name in sorted({name for name, _ in rounds}):
    runs = [t for (n, _), t in rounds.items() if n == name and "pytorch" in t and "policy:cachalot" in t]
    median = lambda key: statistics.median(t[key][0] for t in runs)
    ratio = lambda key: statistics.median(t["policy:cachalot"][0] / t[key][0] for t in runs)
    has_best = all("best" in t for t in runs)
    best, versus_best = (f"{median('best'):9.1f}", f"{ratio('best'):9.3f}") if has_best else (f"{'-':>9}", f"{'-':>9}")
    hot = [t["policy:cachalot"][1] / t["pytorch"][1] for t in runs if t["policy:cachalot"][1] and t["pytorch"][1]]
    hot = f"{statistics.median(hot):9.3f}" if hot else f"{'-':>9}"
    moving = statistics.median(t["policy:cachalot"][2] for t in runs)
    print(f"{name:34} {median('pytorch'):9.1f} {best} {median('policy:cachalot'):9.1f} "
          f"{ratio('pytorch'):12.3f} {versus_best} {hot} {moving:6g}  ({len(runs)} rounds)")
PY
