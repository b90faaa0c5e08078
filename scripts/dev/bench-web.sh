#!/usr/bin/env bash
# BENCHMARKS.md's web section, in one run on one machine: the web page (release build, headless
# Chromium with WebGPU on SwiftShader or the machine's GPU) against the native viewer and the
# native wgpu backend.
#
# - open: gpt_train.pickle, a 3-million-entry cachalot snapshot (`cachalot view --bench
#   --bench-trace`) and issue 22's 3-million-entry PyTorch pickle (trace/examples/
#   synthetic_trace.rs, 130 MB): the native `open_time` example (read + parse + rebuild, then the
#   viewer's frames until the timeline is laid out; and that frame rendered, lavapipe here) vs
#   the page's `open_url` (fetch + parse + rebuild, then the frame that lays out the timeline,
#   until the page's next task after it); median of 3 each, with where the page's time went
#   (its performance marks);
# - ns per allocator op on a cache-hit op file (200,000 alloc/free pairs of 1 MiB, as
#   shared/bench's steady-1MiB): `cachalot run ops --backend wgpu` vs `ops` on the page's WebGPU.
#
#   scripts/dev/bench-web.sh [OUT_DIR]     (default target/bench-web; about 10 minutes)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=${1:-$target_dir/bench-web}
port=${PORT:-8799}
mkdir -p "$out"

# The page is driven by playwright-core, as in test-web.sh.
if ! [ -d scripts/dev/web-test/node_modules/playwright-core ]; then
  (cd scripts/dev/web-test && npm ci --no-audit --no-fund --silent)
fi
cargo build -q --release -p cachalot-cli --bin cachalot
cargo build -q --release -p cachalot-viewer --example open_time
cargo build -q --release -p cachalot-trace --example synthetic_trace
WEB_OUT="$out/web" scripts/build-web.sh >/dev/null
cachalot="$target_dir/release/cachalot"

mkdir -p "$out/web/traces"
cp testdata/traces/pytorch-2.11-h200/gpt_train.pickle "$out/web/traces/"
[ -f "$out/web/traces/big.json" ] || "$cachalot" view --bench --bench-trace "$out/web/traces/big.json" >/dev/null
[ -f "$out/web/traces/big.pickle" ] || "$target_dir/release/examples/synthetic_trace" 3000000 "$out/web/traces/big.pickle" >/dev/null
python3 - "$out/steady-1MiB.ops" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("# steady pairs=200000 size=1048576\n")
    f.write("a 0 1048576\nf 0\n" * 200_000)
PY

echo "native:"
"$target_dir/release/examples/open_time" "$out/web/traces/gpt_train.pickle" "$out/web/traces/big.json" "$out/web/traces/big.pickle" 2>/dev/null | tee "$out/native-open.jsonl"
native_ops=$("$cachalot" run ops "$out/steady-1MiB.ops" --backend wgpu --out "$out/ops.wgpu.json" | grep -o '[0-9.]* ns per op' | head -1)
echo "native wgpu: $native_ops"

"$cachalot" serve --port "$port" --dir "$out/web" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
echo "web page:"
node scripts/dev/web-test/bench.mjs "http://127.0.0.1:$port/" "$out/steady-1MiB.ops" traces/gpt_train.pickle traces/big.json traces/big.pickle | tee "$out/web.jsonl"
python3 - "$out/native-open.jsonl" "$out/web.jsonl" "$native_ops" <<'PY'
import json, sys
native = {j["file"]: j for j in map(json.loads, open(sys.argv[1]))}
web = [json.loads(l) for l in open(sys.argv[2])]
print(f"{'measure':<38} {'native':>9} {'web page':>9} {'ratio':>6}   where the page's time went (ms from open_url)")
for w in web:
    if "file" in w:
        n = native[w["file"]]
        name = f"open {w['file']} ({w['entries']:,} entries)"
        print(name.ljust(38), f"{n['seconds']:>7.3f} s {w['seconds']:>7.3f} s {w['seconds'] / n['seconds']:>6.2f}   {w.get('marks', {})}")
        print("  of which parse + rebuild (native: + read)".ljust(38), f"{n['load_seconds']:>7.3f} s {w['load_seconds']:>7.3f} s {w['load_seconds'] / n['load_seconds']:>6.2f}")
        print("  native frame rendered to pixels".ljust(38), f"{n['rendered_seconds']:>7.3f} s")
    else:
        n = float(sys.argv[3].split()[0])
        print(f"ns per op, {w['ops']} (cache hits)".ljust(38), f"{n:>9.0f} {w['webgpu_ns_per_op']:>9.0f} {w['webgpu_ns_per_op'] / n:>6.2f}")
PY
