#!/usr/bin/env bash
# The web viewer in headless Chromium: builds it (scripts/build-web.sh), serves it with
# `cachalot serve`, opens it on a reference trace and a broken file with Debian's chromium
# driven by playwright-core, and checks: no console errors, the trace loads and its timeline is
# drawn, the broken file shows an error, a screenshot (target/web-test.png) shows the page.
#
# Then the first two screens a visitor sees (web-test/screens.mjs), checked by their screenshots
# (target/web-first.png, web-after-seeds.png): the welcome screen with nothing over it, and the
# screen after a `seeds` run on the page's WebGPU showing the whole run at its peak, the window
# that started it closed; and an out-of-memory error naming the page's device.
#
# Then the experiments on the page's WebGPU (web-test/webgpu.mjs; Chromium's WebGPU runs on its
# bundled SwiftShader without a GPU): `seeds` and a 5-step `mlp-train` against native runs made
# here first — marks against `cachalot run --backend wgpu` (lavapipe), losses and allocator
# events against `--backend sim --profile wgpu` — an OOM past a small budget, and a screenshot
# (target/web-test-webgpu.png) with the segment map; then an uploaded op file (`ops`) and a
# two-shape `matmul-sweep` against their native wgpu runs, the two downloads (snapshot and
# PyTorch pickle) read back by `cachalot summary` / `cachalot replay` and Python's pickle, and
# the page's `seeds` against PyTorch's seeds.expected.json, through `cachalot compare` and in the
# page's own Compare tab (the same marks table and reasons as `cachalot compare` of the native
# wgpu run); then GPU faults injected during and after runs (a validation error, the device
# destroyed), each shown by the page, with runs that work afterwards.
# About 3 minutes on 2 cores (most of it SwiftShader running the kernels).
#
# Installs what it needs if missing: Debian's chromium (apt) and playwright-core (npm, into
# scripts/dev/web-test/node_modules). Skips with a message where neither apt nor chromium exists.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=${WEB_OUT:-$target_dir/web}
port=${PORT:-8765}
shot=${SCREENSHOT:-$target_dir/web-test.png}

if ! [ -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test-web: installing Debian's chromium" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "test-web: skipped (no /usr/bin/chromium and no way to install it)" >&2
    # Where a run must prove the web build (CI), a skip is a failure.
    [ "${CACHALOT_REQUIRE_GPU:-0}" = 0 ] && exit 0
    exit 1
  fi
fi
if ! [ -d scripts/dev/web-test/node_modules/playwright-core ]; then
  (cd scripts/dev/web-test && npm ci --no-audit --no-fund --silent)
fi

WEB_OUT="$out" scripts/build-web.sh
mkdir -p "$out/traces"
cp "$root/testdata/traces/pytorch-2.11-h200/seeds.pickle" "$out/traces/seeds.pickle"
printf '\x80\x04\x95not really a pickle' > "$out/traces/broken.pickle"

cargo build -q -p cachalot-cli --bin cachalot
"$target_dir/debug/cachalot" serve --port "$port" --dir "$out" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
node scripts/dev/web-test/test.mjs "http://127.0.0.1:$port/" "$shot"
echo "test-web: screenshot in $shot"
node scripts/dev/web-test/screens.mjs "http://127.0.0.1:$port/" "$(dirname "$shot")"
echo "test-web: the first screens in $(dirname "$shot")/web-first.png and web-after-seeds.png"

# The native references of the WebGPU runs.
refs="$target_dir/web-test-refs"
mkdir -p "$refs"
cachalot="$target_dir/debug/cachalot"
if ! "$cachalot" run seeds --backend wgpu --out "$refs/seeds.wgpu.json" >/dev/null; then
  # No native wgpu adapter (no lavapipe): nothing to compare the page's runs with.
  echo "test-web: the WebGPU checks skipped: no native wgpu adapter for the reference runs" >&2
  [ "${CACHALOT_REQUIRE_GPU:-0}" = 0 ] && exit 0
  exit 1
fi
"$cachalot" run mlp-train --steps 5 --backend wgpu --out "$refs/mlp.wgpu.json" >/dev/null
"$cachalot" run seeds --backend sim --profile wgpu --out "$refs/seeds.sim-wgpu.json" >/dev/null
"$cachalot" run mlp-train --steps 5 --backend sim --profile wgpu --out "$refs/mlp.sim-wgpu.json" >/dev/null
# An op file to upload (small and large blocks, frees out of order, a second stream) and a
# two-shape matmul-sweep, with their native wgpu runs.
python3 - "$refs/mixed.ops" <<'PY'
import sys
sizes = [512, 4096, 1 << 20, 3 << 20, 700_000, 25 << 20, 2 << 20, 96]
with open(sys.argv[1], "w") as f:
    f.write("# mixed sizes, two streams (test-web.sh)\n")
    live = []
    for i in range(120):
        f.write(f"a {i} {sizes[i * 7 % len(sizes)] + i * 64} {i % 5 == 4 and 1 or 0}\n")
        live.append(i)
        if i % 3 == 2:
            f.write(f"f {live.pop(len(live) // 2)}\n")
    for i in live:
        f.write(f"f {i}\n")
PY
cp "$root/testdata/traces/pytorch-2.11-h200/seeds.expected.json" "$refs/"
"$cachalot" run ops "$refs/mixed.ops" --backend wgpu --out "$refs/ops.wgpu.json" >/dev/null
"$cachalot" run matmul-sweep --shapes 64x64x64,127x33x65 --backend wgpu --out "$refs/matmul.wgpu.json" >/dev/null
gpu_shot="${shot%.png}-webgpu.png"
CACHALOT="$cachalot" node scripts/dev/web-test/webgpu.mjs "http://127.0.0.1:$port/" "$refs" "$gpu_shot"
echo "test-web: WebGPU screenshots in $gpu_shot and ${gpu_shot%.png}-compare.png"
