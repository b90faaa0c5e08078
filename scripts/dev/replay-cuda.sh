#!/usr/bin/env bash
# `cachalot replay --backend cuda` on the GPU machine (issue 18 §2): builds, here (no GPU or CUDA
# toolkit needed), a release `cachalot`, copies it with the reference traces into the git-ignored
# .dev-replay/, writes .dev-replay/run.sh and prints the command to run on the device machine,
# which has no Rust.
#
#   scripts/dev/replay-cuda.sh            # then run the printed command with carry [".dev-replay"]
#
# run.sh replays every reference trace on the simulator and on CUDA device 0 and says, per trace,
# whether the CUDA replay's end state, OOMs, peaks and device calls are the simulator's (SAME) or
# not (DIFFERENT, both printed), then runs `replay --backend cuda --check` (the device's events
# against the recording's, addresses as segment + offset) and prints its MATCH/MISMATCH lines;
# it exits 1 if any differs.
#
# Environment: CARGO_TARGET_DIR (default /work/target-cuda, shared with device-cuda.sh).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-cuda}
out=.dev-replay
traces=testdata/traces/pytorch-2.11-h200

for tool in cargo strip; do
    command -v "$tool" >/dev/null || { echo "replay-cuda.sh: $tool is needed" >&2; exit 1; }
done

source scripts/dev/lib/executables.sh
echo "building cachalot (release, target dir $CARGO_TARGET_DIR) ..." >&2
exe=$(cargo build --release --locked -p cachalot-cli --bin cachalot --message-format=json-render-diagnostics \
    | executables cachalot | tail -n 1)
[[ -x $exe ]] || { echo "replay-cuda.sh: the build produced no executable" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/traces"
cp "$exe" "$out/cachalot"
strip "$out/cachalot"
cp "$traces"/*.pickle "$traces"/*.expected.json "$out/traces/"

cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Written by scripts/dev/replay-cuda.sh: every reference trace on the simulator and on CUDA.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# The replay line without its time, then the peaks line.
stats() { sed -E 's/ in [0-9.]+ s,/,/' | grep -v ': on cuda, ' | head -n 2; }
different=0
for trace in "$here"/traces/*.pickle; do
    name=$(basename "$trace" .pickle)
    sim=$("$here/cachalot" replay --backend sim "$trace" 2>&1 | stats)
    sim_peaks=$("$here/cachalot" stats "$trace" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
keys = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "num_device_alloc", "num_device_free")
allocated, reserved, allocs, frees = (s[k] for k in keys)
print(f"{sys.argv[1]}: peak allocated {allocated} B, peak reserved {reserved} B, "
      f"device allocations {allocs}, device frees {frees}")' "$name")
    cuda_all=$("$here/cachalot" replay --backend cuda "$trace" 2>&1)
    cuda=$(printf '%s\n' "$cuda_all" | stats)
    if [[ $cuda == "$(printf '%s\n%s' "$sim" "$sim_peaks")" ]]; then
        echo "SAME $name"
    else
        different=$((different + 1))
        echo "DIFFERENT $name"
        printf '  sim:  %s\n' "$sim" "$sim_peaks"
        printf '  cuda: %s\n' "$cuda_all"
    fi
done
echo "$different trace(s) differ"
echo "--- replay --backend cuda --check: the device's events against the recording's"
mismatched=0
for trace in "$here"/traces/*.pickle; do
    checked=$("$here/cachalot" replay --backend cuda --check "$trace" 2>&1) || mismatched=$((mismatched + 1))
    printf '%s\n' "$checked" | grep -E 'MATCH|best-fit|error' || true
done
echo "$mismatched trace(s) mismatch as events"
[[ $different == 0 && $mismatched == 0 ]]
RUN
chmod +x "$out/run.sh"

echo "ready: $(du -sh "$out" | cut -f1) in $out" >&2
echo 'on the device machine: run with carry [".dev-replay"]: bash .dev-replay/run.sh'
