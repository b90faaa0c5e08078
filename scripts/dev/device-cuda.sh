#!/usr/bin/env bash
# Builds, here (no GPU or CUDA toolkit needed), the CUDA backend's GPU tests and the `cachalot`
# binary (for `cachalot bench`) in the benchmark profile (fat LTO), strips them into the
# git-ignored .device-bin/ together with the shared data they read (reference marks, bench
# scripts, trace pickles),
# writes .device-bin/run.sh, and prints the command to run on the device machine, which has no Rust.
#
#   scripts/dev/device-cuda.sh            # then run the printed command with carry [".device-bin"]
#
# Environment: CARGO_TARGET_DIR (default /work/target-cuda), CACHALOT_SHARED_DIR (default
# ../shared beside the checkout).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-cuda}
shared=${CACHALOT_SHARED_DIR:-$root/../shared}
bin=.device-bin

for tool in cargo strip; do
    command -v "$tool" >/dev/null || { echo "device-cuda.sh: $tool is needed" >&2; exit 1; }
done
[[ -f $shared/traces/pytorch-2.11-h200/seeds.expected.json ]] || {
    echo "device-cuda.sh: no shared data at $shared (set CACHALOT_SHARED_DIR)" >&2
    exit 1
}

source scripts/dev/lib/executables.sh
# The benchmark profile (fat LTO) is what BENCHMARKS.md's timings use; a check of behaviour alone
# builds faster with CACHALOT_DEVICE_PROFILE=release.
profile=${CACHALOT_DEVICE_PROFILE:-benchmark}

echo "building the GPU tests and the benchmark (profile $profile, target dir $CARGO_TARGET_DIR) ..." >&2
tests_exe=$(cargo test --profile "$profile" -p cachalot-cuda --test cuda --no-run --message-format=json-render-diagnostics \
    | executables cuda | tail -n 1)
bench_exe=$(cargo build --profile "$profile" --locked -p cachalot-cli --bin cachalot --message-format=json-render-diagnostics \
    | executables cachalot | tail -n 1)
[[ -x $tests_exe && -x $bench_exe ]] || { echo "device-cuda.sh: build produced no executables" >&2; exit 1; }

rm -rf "$bin"
mkdir -p "$bin/shared/traces" "$bin/shared/bench"
strip -o "$bin/cuda-tests" "$tests_exe"
strip -o "$bin/cachalot" "$bench_exe"
cp -r "$shared/traces/pytorch-2.11-h200" "$bin/shared/traces/"
cp "$shared"/bench/*.py "$shared"/bench/*.sh "$bin/shared/bench/"
cp scripts/dev/paired-bench.py "$bin/"
chmod -R u+w "$bin"

cat >"$bin/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the device machine, from the repository root:
#   bash .device-bin/run.sh [all|tests|bench|rounds N] [test-name filter ...]
# tests: every GPU test with CACHALOT_REQUIRE_CUDA=1 (a missing GPU fails them), one at a time.
# bench: the standard op files (shared/bench/workloads.sh), PyTorch's caching allocator
#        (torch_alloc_bench.py), cachalot's CUDA backend and the simulator (`cachalot bench`)
#        in the same run, and the ratio per file. Logs and results go to $OUT.
# rounds N: N rounds in which every op file is timed on PyTorch's caching allocator (the
#        reference harness's native code, loaded once) and on `cachalot bench --backend cuda`,
#        back to back (the order alternating by round), pinned to one core; per file, the
#        median of the pairs' ratios, the ratio of each side's best, and how many pairs are at
#        <= 0.25 (paired-bench.py: the host slows everything down for seconds at a time, so
#        only measurements a moment apart compare; BENCHMARKS.md §2).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:-all}
shift || true
if [[ $mode == rounds ]]; then
    rounds=${1:-4}
    shift || true
fi
out=${OUT:-/tmp/cachalot-device-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CACHALOT_REQUIRE_CUDA=1 CACHALOT_SHARED_DIR="$here/shared" RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
# The standard op files, for either benchmark mode.
ops=/tmp/cachalot-ops
if [[ $mode != tests ]]; then
    bash "$here/shared/bench/workloads.sh" "$ops" >"$out/workloads.log" 2>&1 || status=1
fi
if [[ $mode == all || $mode == tests ]]; then
    "$here/cuda-tests" --test-threads=1 "$@" 2>&1 | tee "$out/tests.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
if [[ $mode == all || $mode == bench ]]; then
    python3 "$here/shared/bench/torch_alloc_bench.py" "$ops"/*.ops --skip-cudamalloc --json "$out/torch.json" 2>&1 \
        | tee "$out/torch.txt"
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1
    for backend in cuda sim; do
        "$here/cachalot" bench --backend $backend "$ops"/*.ops 2>&1 | tee -a "$out/cachalot.txt"
        [[ ${PIPESTATUS[0]} == 0 ]] || status=1
    done
    awk '$2 == "pytorch-caching" { t[$1] = $3 } $2 == "cachalot-cuda" { c[$1] = $3 }
         END { for (f in c) if (f in t) printf "%-28s %12.1f %12.1f %8.3f\n", f, t[f], c[f], c[f] / t[f] }' \
        "$out/torch.txt" "$out/cachalot.txt" | sort >"$out/ratios.body"
    { printf "%-28s %12s %12s %8s\n" "ops file" "pytorch ns" "cachalot ns" "ratio"; cat "$out/ratios.body"; } \
        | tee "$out/ratios.txt"
    rm -f "$out/ratios.body"
fi
if [[ $mode == rounds ]]; then
    # One core, the same for both, away from core 0's interrupts; PyTorch's harness is loaded
    # once and each of its measurements paired with one of ours a fraction of a second apart
    # (paired-bench.py says why).
    pin=()
    command -v taskset >/dev/null && [[ $(nproc) -gt 5 ]] && pin=(taskset -c 5)
    : >"$out/rounds.log"
    "${pin[@]}" python3 "$here/paired-bench.py" --cachalot "$here/cachalot" \
        --harness "$here/shared/bench/torch_alloc_bench.py" --rounds "$rounds" --log "$out/rounds.log" \
        "$ops"/*.ops 2>"$out/rounds.err" | tee "$out/rounds.txt"
    [[ ${PIPESTATUS[0]} == 0 ]] || { status=1; tail -5 "$out/rounds.err"; }
fi
exit $status
RUN
chmod +x "$bin/run.sh"

size=$(du -sh "$bin" | cut -f1)
cat <<EOF
.device-bin/ is ready ($size): cuda-tests, cachalot, run.sh, shared/ (reference marks, bench scripts, trace pickles).

Device command (device tool: command as below, carry [".device-bin"], timeout_s 600):

  bash .device-bin/run.sh

It runs the GPU tests (CACHALOT_REQUIRE_CUDA=1: a missing GPU fails them), then PyTorch's caching
allocator and cachalot's CUDA backend on the standard op files in the same run, and writes
gpu.txt, tests.log, workloads.log, torch.txt, torch.json, cachalot.txt and ratios.txt to \$OUT.
'bash .device-bin/run.sh tests [filter]' or 'bash .device-bin/run.sh bench' run one half;
'bash .device-bin/run.sh rounds 16' times the two in 16 rounds of pairs a moment apart (rounds.txt).

The test half alone, spelled out:

  LD_LIBRARY_PATH=/usr/local/cuda/lib64:\$LD_LIBRARY_PATH CACHALOT_REQUIRE_CUDA=1 CACHALOT_SHARED_DIR=.device-bin/shared .device-bin/cuda-tests --test-threads=1 2>&1 | tee \$OUT/tests.log
EOF
