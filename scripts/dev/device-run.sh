#!/usr/bin/env bash
# Builds, here (no GPU, CUDA toolkit or Vulkan driver needed), the `cachalot` binary and the
# runtime's integration tests in the benchmark profile (fat LTO), strips them into the
# git-ignored .device-bin-run/ with the reference data they read (PyTorch's seeds marks and
# trace), writes
# .device-bin-run/run.sh, and prints the command to run on the device machine, which has no Rust.
#
#   scripts/dev/device-run.sh        # then run the printed command with carry [".device-bin-run", ".gl"]
#
# On the GPU machine, in one run: `cachalot run seeds` on CUDA, on wgpu (Vulkan on the same
# NVIDIA GPU) and on the simulator; `cachalot compare` of them against PyTorch's
# seeds.expected.json (marks equal on CUDA; every wgpu difference explained); `mlp-train` on
# CUDA, wgpu and the simulator (the CPU reference) with the per-step loss comparison (1e-3
# relative); `matmul-sweep` on CUDA and wgpu; and the runtime's tests with CUDA and a GPU
# required.
#
# Environment: CARGO_TARGET_DIR (default /work/target-runtime), CACHALOT_SHARED_DIR (default
# ../shared beside the checkout).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-runtime}
shared=${CACHALOT_SHARED_DIR:-$root/../shared}
bin=.device-bin-run
traces=traces/pytorch-2.11-h200

for tool in cargo strip; do
    command -v "$tool" >/dev/null || { echo "device-run.sh: $tool is needed" >&2; exit 1; }
done
[[ -f $shared/$traces/seeds.expected.json && -f $shared/$traces/seeds.pickle ]] || {
    echo "device-run.sh: no shared data at $shared (set CACHALOT_SHARED_DIR)" >&2
    exit 1
}

source scripts/dev/lib/executables.sh
# The benchmark profile (fat LTO) is what BENCHMARKS.md's timings use; a check of behaviour alone
# builds faster with CACHALOT_DEVICE_PROFILE=release.
profile=${CACHALOT_DEVICE_PROFILE:-benchmark}

echo "building cachalot and the runtime tests (profile $profile, target dir $CARGO_TARGET_DIR) ..." >&2
cli_exe=$(cargo build --profile "$profile" --locked -p cachalot-cli --bin cachalot --message-format=json-render-diagnostics \
    | executables cachalot | tail -n 1)
tests_exe=$(cargo test --profile "$profile" --locked -p cachalot-runtime --test runtime --no-run \
    --message-format=json-render-diagnostics | executables runtime | tail -n 1)
[[ -x $cli_exe && -x $tests_exe ]] || { echo "device-run.sh: build produced no executables" >&2; exit 1; }

rm -rf "$bin"
mkdir -p "$bin/shared/$traces"
strip -o "$bin/cachalot" "$cli_exe"
strip -o "$bin/runtime-tests" "$tests_exe"
cp "$shared/$traces/seeds.expected.json" "$shared/$traces/seeds.pickle" "$bin/shared/$traces/"
chmod -R u+w "$bin"

cat >"$bin/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the device machine, from the repository root (after unpacking the Vulkan loader, see the
# device command printed by scripts/dev/device-run.sh):
#   bash .device-bin-run/run.sh
# Writes to $OUT: summary.txt (every step's output), compare-seeds.txt, compare-mlp.txt,
# tests.log and results.tar.gz (the snapshots, openable with `cachalot view`, and per-step logs).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/cachalot-run-out}
work=$(mktemp -d)
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
# wgpu through Vulkan on the NVIDIA driver: the proof is about the same GPU, so no OpenGL or
# software fallback.
export WGPU_BACKEND=${WGPU_BACKEND:-vulkan}
export CACHALOT_SHARED_DIR="$here/shared" RUST_BACKTRACE=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
cachalot="$here/cachalot"
expected="$here/shared/traces/pytorch-2.11-h200/seeds.expected.json"
status=0
failed=()

# step NAME COMMAND...: runs it, logs to $work/NAME.txt and the summary, notes a failure.
step() {
    local name=$1
    shift
    local started=$SECONDS
    { echo "===== $name: $*"; } >>"$out/summary.txt"
    "$@" >"$work/$name.txt" 2>&1
    local rc=$?
    cat "$work/$name.txt" >>"$out/summary.txt"
    echo "===== $name: exit $rc ($((SECONDS - started)) s)" | tee -a "$out/summary.txt"
    if [[ $rc != 0 ]]; then
        status=1
        failed+=("$name")
    fi
    return 0
}

# compare_step NAME FILE...: `cachalot compare` of the files that exist (a failed run wrote none).
compare_step() {
    local name=$1
    shift
    local files=()
    for f in "$@"; do
        if [[ -f $f ]]; then files+=("$f"); else echo "$name: $f is missing" | tee -a "$out/summary.txt"; fi
    done
    if (( ${#files[@]} < 2 )); then
        echo "===== $name: fewer than two runs to compare" | tee -a "$out/summary.txt"
        status=1
        failed+=("$name")
        return 0
    fi
    step "$name" "$cachalot" compare "${files[@]}"
}

: >"$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$out/summary.txt" 2>&1
ldconfig -p | grep libvulkan >/dev/null || echo "warning: no Vulkan loader (unpack .gl/*.deb first)" | tee -a "$out/summary.txt"

cd "$work"
# seeds: CUDA must give PyTorch's marks; wgpu may differ only where compare explains why.
step seeds-cuda "$cachalot" run seeds --backend cuda --out seeds.cuda.json
step seeds-wgpu "$cachalot" run seeds --backend wgpu --out seeds.wgpu.json
step seeds-sim "$cachalot" run seeds --backend sim --out seeds.sim.json
compare_step compare-seeds "$expected" seeds.cuda.json seeds.wgpu.json seeds.sim.json
cp compare-seeds.txt "$out/compare-seeds.txt" 2>/dev/null
# The CUDA marks must equal PyTorch's exactly, not only with a reason.
if [[ -f seeds.cuda.json ]] && grep -Eq '^  B vs A: [0-9]+ of [0-9]+ marks differ' compare-seeds.txt; then
    echo "FAIL: the CUDA run's marks differ from PyTorch's" | tee -a "$out/summary.txt"
    status=1
    failed+=("seeds-cuda-marks")
fi

# mlp-train: losses per step on CUDA and wgpu against the simulator's CPU reference (1e-3).
mlp=(mlp-train --steps 12 --widths 512,1024,1024,10 --batches 256,512,128 --optimizer adam --lr 1e-3)
step mlp-sim "$cachalot" run "${mlp[@]}" --backend sim --out mlp.sim.json
step mlp-cuda "$cachalot" run "${mlp[@]}" --backend cuda --out mlp.cuda.json
step mlp-wgpu "$cachalot" run "${mlp[@]}" --backend wgpu --out mlp.wgpu.json
compare_step compare-mlp mlp.sim.json mlp.cuda.json mlp.wgpu.json
sgd=(mlp-train --steps 8 --widths 256,512,512,16 --batches 128,64 --optimizer sgd --lr 0.02 --activation gelu --loss mse)
step sgd-sim "$cachalot" run "${sgd[@]}" --backend sim --out sgd.sim.json
step sgd-cuda "$cachalot" run "${sgd[@]}" --backend cuda --out sgd.cuda.json
step sgd-wgpu "$cachalot" run "${sgd[@]}" --backend wgpu --out sgd.wgpu.json
compare_step compare-sgd sgd.sim.json sgd.cuda.json sgd.wgpu.json
cat compare-mlp.txt compare-sgd.txt >"$out/compare-mlp.txt" 2>/dev/null

# matmul-sweep: every product checked against the CPU.
step sweep-cuda "$cachalot" run matmul-sweep --backend cuda --out sweep.cuda.json
step sweep-wgpu "$cachalot" run matmul-sweep --backend wgpu --out sweep.wgpu.json
compare_step compare-sweep sweep.cuda.json sweep.wgpu.json

# The runtime's tests, with CUDA and a GPU adapter required (a missing one fails).
CACHALOT_REQUIRE_CUDA=1 CACHALOT_REQUIRE_GPU=1 "$here/runtime-tests" --test-threads=1 >"$out/tests.log" 2>&1
rc=$?
echo "===== runtime tests: exit $rc" | tee -a "$out/summary.txt"
tail -n 3 "$out/tests.log" >>"$out/summary.txt"
[[ $rc == 0 ]] || { status=1; failed+=("runtime-tests"); }

tar -czf "$out/results.tar.gz" -C "$work" .
if [[ $status == 0 ]]; then
    echo "ALL PASSED" | tee -a "$out/summary.txt"
else
    echo "FAILED: ${failed[*]}" | tee -a "$out/summary.txt"
fi
exit $status
RUN
chmod +x "$bin/run.sh"

size=$(du -sh "$bin" | cut -f1)
gl_note="the Vulkan loader debs are in .gl/"
ls .gl/libvulkan1_*.deb >/dev/null 2>&1 || gl_note="NO .gl/ yet: fetch the loader debs once (see /work/.library/device/README.md) before running"
cat <<EOF
.device-bin-run/ is ready ($size): cachalot, runtime-tests, run.sh, shared/ (PyTorch's seeds marks and trace); $gl_note.

Device command (device tool: command as below, carry [".device-bin-run", ".gl"], timeout_s 600):

  for f in .gl/*.deb; do dpkg -x \$f /; done; ldconfig; export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; bash .device-bin-run/run.sh

It runs seeds on cuda, wgpu (Vulkan on the NVIDIA driver) and the simulator and compares them with
PyTorch's seeds.expected.json (and its trace, seeds.pickle); mlp-train (Adam/ReLU/cross-entropy and
SGD/GELU/MSE) on the simulator's CPU reference, cuda and wgpu with the per-step loss comparison;
matmul-sweep on cuda and wgpu; then the runtime's tests with CACHALOT_REQUIRE_CUDA=1 and
CACHALOT_REQUIRE_GPU=1. \$OUT gets summary.txt, compare-seeds.txt, compare-mlp.txt, tests.log and
results.tar.gz (snapshots for 'cachalot view' and every step's log). Exit status 0 only if all passed.
EOF
