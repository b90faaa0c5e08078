#!/usr/bin/env bash
# The device proof of live runs (issue 16): builds, here (no GPU, CUDA toolkit or Vulkan driver
# needed), the `cachalot` binary, strips it into the git-ignored .device-bin-live/ with PyTorch's
# seeds marks, writes .device-bin-live/run.sh, and prints the command to run on the device machine.
#
#   scripts/dev/live-cuda.sh        # then run the printed command with carry [".device-bin-live", ".gl"]
#
# On the GPU machine, run.sh:
#   1. `cachalot view --run seeds --backend cuda` headless: the window's frame loop in egui_kittest,
#      rendered through wgpu (Vulkan on the NVIDIA driver), the seeds experiment on CUDA on a
#      worker thread streaming its allocator events into it. A picture mid-run (the experiment
#      held on the device once it has sent --mid-event entries) and one at the end; the window's
#      rebuilt end state checked against the run's; the run saved from the window (--out).
#   2. `cachalot compare` of PyTorch's seeds.expected.json with that saved run: the marks (and
#      the allocator events) must equal PyTorch 2.11's on the H200.
#   3. The same live run saved as a PyTorch snapshot pickle, read back by `cachalot stats`.
#   4. An `mlp-train` live run on CUDA (pictures at the middle and the end).
# $OUT gets summary.txt, the PNGs, the saved runs and every step's log. Exit status 0 only if all passed.
#
# Environment: CARGO_TARGET_DIR (default /work/target-runtime), CACHALOT_SHARED_DIR (default
# ../shared beside the checkout), CACHALOT_DEVICE_PROFILE (default release; benchmark for fat LTO).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-runtime}
shared=${CACHALOT_SHARED_DIR:-$root/../shared}
bin=.device-bin-live
traces=traces/pytorch-2.11-h200

for tool in cargo strip; do
    command -v "$tool" >/dev/null || { echo "live-cuda.sh: $tool is needed" >&2; exit 1; }
done
[[ -f $shared/$traces/seeds.expected.json ]] || {
    echo "live-cuda.sh: no shared data at $shared (set CACHALOT_SHARED_DIR)" >&2
    exit 1
}

source scripts/dev/lib/executables.sh
# Only behaviour is checked here, so the quicker release profile is the default.
profile=${CACHALOT_DEVICE_PROFILE:-release}

echo "building cachalot (profile $profile, target dir $CARGO_TARGET_DIR) ..." >&2
cli_exe=$(cargo build --profile "$profile" --locked -p cachalot-cli --bin cachalot --message-format=json-render-diagnostics \
    | executables cachalot | tail -n 1)
[[ -x $cli_exe ]] || { echo "live-cuda.sh: build produced no executable" >&2; exit 1; }

rm -rf "$bin"
mkdir -p "$bin/shared/$traces"
strip -o "$bin/cachalot" "$cli_exe"
cp "$shared/$traces/seeds.expected.json" "$bin/shared/$traces/"
chmod -R u+w "$bin"

cat >"$bin/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the device machine, from the repository root (after unpacking the Vulkan loader, see the
# device command printed by scripts/dev/live-cuda.sh):
#   bash .device-bin-live/run.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/cachalot-live-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export CACHALOT_REQUIRE_CUDA=1 RUST_BACKTRACE=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# No display: the pictures are rendered headless; make sure nothing tries to open a window.
unset DISPLAY WAYLAND_DISPLAY
cachalot="$here/cachalot"
expected="$here/shared/traces/pytorch-2.11-h200/seeds.expected.json"
status=0
failed=()

# step NAME COMMAND...: runs it in $out, logs to $out/NAME.txt and the summary, notes a failure.
step() {
    local name=$1
    shift
    local started=$SECONDS
    echo "===== $name: $*" | tee -a "$out/summary.txt"
    (cd "$out" && "$@") >"$out/$name.txt" 2>&1
    local rc=$?
    cat "$out/$name.txt" >>"$out/summary.txt"
    echo "===== $name: exit $rc ($((SECONDS - started)) s)" | tee -a "$out/summary.txt"
    if [[ $rc != 0 ]]; then
        status=1
        failed+=("$name")
    fi
    return 0
}

# check NAME FILE PATTERN WHAT: FILE must contain PATTERN (extended regex); prints WHAT either way.
check() {
    if grep -Eq "$3" "$out/$2"; then
        echo "ok:   $4" | tee -a "$out/summary.txt"
    else
        echo "FAIL: $4 (no '$3' in $2)" | tee -a "$out/summary.txt"
        status=1
        failed+=("$1")
    fi
}

: >"$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$out/summary.txt"
ldconfig -p | grep libvulkan >/dev/null || echo "warning: no Vulkan loader (unpack .gl/*.deb first)" | tee -a "$out/summary.txt"

# 1. seeds live on CUDA, pictured mid-run (held at entry 30 of 60) and at the end, saved.
step live-seeds "$cachalot" view --run seeds --backend cuda --screenshot live-seeds-end.png \
    --mid-screenshot live-seeds-mid.png --mid-event 30 --out seeds.live.cuda.json
check live-seeds-backend live-seeds.txt '^live run: seeds on cuda' "the live run ran on CUDA"
check live-seeds-mid live-seeds.txt 'wrote live-seeds-mid.png \(cursor at entry [0-9]+, while the experiment was held there\)' \
    "the mid-run picture was taken while the experiment was running (held on the device)"
check live-seeds-end live-seeds.txt "end state: the window's rebuilt state matches the run's" \
    "the window's end state (rebuilt from the streamed events) equals the allocator's"
for png in live-seeds-mid.png live-seeds-end.png; do
    if [[ -s $out/$png ]]; then echo "ok:   $png written" | tee -a "$out/summary.txt"
    else echo "FAIL: $png missing" | tee -a "$out/summary.txt"; status=1; failed+=("$png"); fi
done

# 2. The live run's marks (as the window received them, saved from it) against PyTorch's.
if [[ -f $out/seeds.live.cuda.json ]]; then
    step compare-seeds "$cachalot" compare "$expected" seeds.live.cuda.json
    if grep -Eq 'marks differ|no marks in common' "$out/compare-seeds.txt"; then
        echo "FAIL: the live CUDA run's marks differ from PyTorch's" | tee -a "$out/summary.txt"
        status=1
        failed+=("seeds-marks")
    else
        echo "ok:   every mark of the live CUDA run equals PyTorch 2.11's (seeds.expected.json)" | tee -a "$out/summary.txt"
    fi
    # The events are reported, not required: the issue's proof is the marks.
    if grep -Eq 'B vs A: identical' "$out/compare-seeds.txt"; then
        echo "ok:   the live CUDA run's allocator events equal PyTorch's too" | tee -a "$out/summary.txt"
    else
        echo "note: the live CUDA run's allocator events differ from PyTorch's (see compare-seeds.txt for the reasons)" | tee -a "$out/summary.txt"
    fi
else
    echo "FAIL: no seeds.live.cuda.json to compare" | tee -a "$out/summary.txt"
    status=1
    failed+=("compare-seeds")
fi

# 3. Saved as a PyTorch snapshot pickle, read back.
step live-seeds-pickle "$cachalot" view --run seeds --backend cuda --screenshot live-seeds-pickle.png --out seeds.live.cuda.pickle
step stats-pickle "$cachalot" stats seeds.live.cuda.pickle

# 4. mlp-train live on CUDA.
step live-mlp "$cachalot" view --run mlp-train --steps 6 --widths 512,1024,1024,10 --batches 256,512,128 \
    --backend cuda --screenshot live-mlp-end.png --mid-screenshot live-mlp-mid.png --mid-event 200 --out mlp.live.cuda.json
check live-mlp-end live-mlp.txt "end state: the window's rebuilt state matches the run's" "mlp-train: the window's end state equals the allocator's"

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
.device-bin-live/ is ready ($size): cachalot, run.sh, shared/ (PyTorch's seeds marks); $gl_note.

Device command (device tool: command as below, carry [".device-bin-live", ".gl"], timeout_s 600):

  for f in .gl/*.deb; do dpkg -x \$f /; done; ldconfig; export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; bash .device-bin-live/run.sh

It runs seeds live on CUDA in the headless window (pictures mid-run and at the end, the window's
end state checked), compares the saved run's marks and events with PyTorch's seeds.expected.json,
saves and reads back a PyTorch pickle, and runs mlp-train live on CUDA. \$OUT gets summary.txt,
the PNGs, the saved runs and every step's log. Exit status 0 only if all passed.
EOF
