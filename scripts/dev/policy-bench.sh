#!/usr/bin/env bash
# `policy:cachalot` against PyTorch's policy on one device (BENCHMARKS.md §3, "On
# CUDA"): `cachalot bench` under each policy on the same op files, ROUNDS rounds, the order
# alternating, pinned to one core. Prints per file the medians of the rounds' ns per op and the
# median of the rounds' ratios (ours / PyTorch's policy); and the hot path apart: the same ratio
# over only the timed replays in which neither policy made a device call (`cachalot bench
# --each-replay`), with how many of ours' timed replays did make some.
#
# With BEST=FILE (lines `OPS_NAME|SETTINGS`, OPS_NAME the op file's name without `.ops`; the
# settings of BENCHMARKS.md §3 are in scripts/dev/policy-best-settings.txt), each file named
# there is also timed under PyTorch's policy with SETTINGS: the setting `cachalot tune` finds for
# the trace the file was made from, the one that gives PyTorch's lowest peak.
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
      # The median line, then each timed replay as NS:CALLS (its ns per op and device calls).
      taskset -c "${PIN:-5}" "$bin" bench --backend "${BACKEND:-cuda}" --config "$config" --each-replay "$ops" 2>/dev/null |
        python3 -c '
import sys
r, label, ops = sys.argv[1:]
lines = sys.stdin.read().splitlines()
if not lines or not lines[0].endswith("ns/op"):
    sys.exit(f"policy-bench: no timing for {ops} under {label} (does the binary know --each-replay?)")
name, median = lines[0].split()[0].removesuffix(".ops"), lines[0].split()[-2]
replays = [l.split() for l in lines[1:] if l.startswith("# ")]
print(r, name, label, median, ",".join(f"{f[4]}:{f[6]}" for f in replays))
' "$r" "$label" "$ops" >>"$out"
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
    r, name, policy, ns, replays = line.split()
    replays = [(float(ns), int(calls)) for ns, calls in (item.split(":") for item in replays.split(","))]
    rounds[(name, int(r))][policy] = (float(ns), replays)


def hot_ratio(t):
    """Ours / PyTorch's defaults over the timed replays in which neither made a device call (the
    same replays on both sides, so a replay's place in the run weighs alike), or None."""
    pairs = [(ours, theirs) for (ours, a), (theirs, b) in zip(t["policy:cachalot"][1], t["pytorch"][1]) if a == b == 0]
    if not pairs:
        return None
    return statistics.median(o for o, _ in pairs) / statistics.median(p for _, p in pairs)


print(f"{'ops file':34} {'pytorch':>9} {'best':>9} {'cachalot':>9} {'ours/pytorch':>12} {'ours/best':>9}"
      f" {'hot path':>14} {'moving':>6}")
print("  (ns/op medians of rounds; ratios: medians of the rounds' ratios; hot path: ours / PyTorch's defaults"
      " over the timed replays in which neither made a device call, with the rounds that had one; moving: ours'"
      " timed replays with device calls, median of rounds)")
for name in sorted({name for name, _ in rounds}):
    runs = [t for (n, _), t in rounds.items() if n == name and "pytorch" in t and "policy:cachalot" in t]
    median = lambda key: statistics.median(t[key][0] for t in runs)
    ratio = lambda key: statistics.median(t["policy:cachalot"][0] / t[key][0] for t in runs)
    has_best = all("best" in t for t in runs)
    best, versus_best = (f"{median('best'):9.1f}", f"{ratio('best'):9.3f}") if has_best else (f"{'-':>9}", f"{'-':>9}")
    hot = [h for h in map(hot_ratio, runs) if h is not None]
    hot = f"{statistics.median(hot):.3f} ({len(hot)})" if hot else "-"
    moving = statistics.median(sum(1 for _, calls in t["policy:cachalot"][1] if calls) for t in runs)
    print(f"{name:34} {median('pytorch'):9.1f} {best} {median('policy:cachalot'):9.1f} "
          f"{ratio('pytorch'):12.3f} {versus_best} {hot:>14} {moving:6g}  ({len(runs)} rounds)")
PY
