#!/usr/bin/env bash
# Issue 17's proofs 1, 2 and 4 on the GPU machine, in one command: cachalot as PyTorch's CUDA
# allocator (bindings/torch) against PyTorch's own.
#
#   here:    scripts/dev/torch-build.sh            # the wheel, the scripts and capture.py into .dev-torch/
#   device:  bash .dev-torch/torch-device.sh [PARTS]   # with carry [".dev-torch"]; results under $OUT
#
# PARTS (default "same features speed"): any of same, features, speed, determinism (the training
# workloads with PyTorch's deterministic algorithms, twice on PyTorch's allocator, and
# multistream twice: whether PyTorch repeats itself where the first part found differences).
# SPEED_ROUNDS (default 2): native/cachalot alternations per speed bench.
#
# 1. Same bytes: capture.py's workloads, unchanged, once on each allocator (same seed; the
#    training ones a second time on PyTorch's to see whether its losses repeat at all):
#    torch-compare.py checks every mark, the peak, memory_stats and the losses. cachalot's
#    snapshots (with their expected.json) come back in $OUT/cachalot-runs.tar.gz for
#    `cachalot replay --check`, and open here in torch.cuda._memory_viz.
# 2. Speed: per-step times of gpt_train and convnet_train and ns per torch.empty/del, the modes
#    alternating (native, cachalot, native, cachalot), medians.
# 4. Cross-stream safety (and graph capture, OOM, the torch.cuda patch): torch-features.py on
#    both allocators and on cachalot without its record_stream hook.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/torch-out}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 CAPTURE_PY=$here/capture.py CACHALOT_TORCH_SHIM_DIR=$work/shim
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# The wheel, unpacked onto the path (no index on the device; nothing else to install).
python3 -m zipfile -e "$(ls "$here"/cachalot_torch-*.whl | head -1)" "$work/site"
export PYTHONPATH=$work/site
{
python3 -c 'import torch, sys, cachalot_torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0)); print(cachalot_torch.cuda_status(0))'
start=$SECONDS
python3 -c 'import cachalot_torch, torch; cachalot_torch.enable(); torch.zeros(1, device="cuda"); print("shim built and installed")'
echo "first enable (builds the C++ shim): $((SECONDS - start)) s"

parts=${1:-same features speed}
has() { [[ " $parts " == *" $1 "* ]]; }
run() { local mode=$1 dir=$2 w=$3 seed=$4; shift 4
    env "$@" timeout 120 python3 "$here/torch-proof.py" "$mode" "$w" "$work/$dir" "$seed" 2>&1 | tail -1; }
both() { run native native "$@"; run cachalot cachalot "$@"; }
if has same; then
echo "== 1. same bytes"
both seeds 0
both gpt_train 1
both kvcache_infer 2
both multistream 3
both convnet_train 4
both "random_stress@maxsplit" 5 PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64,roundup_power2_divisions:4
both "gpt_train@expandable" 6 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
both "oom_probe@fraction" 7 CAP_FRACTION=0.02 PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6
both "convnet_train@gc" 8 CAP_FRACTION=0.0025 PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.5
both lstm_train 9
both transformer_varlen 10
for w in "gpt_train 1" "convnet_train 4" "lstm_train 9" "transformer_varlen 10"; do run native native2 $w; done
python3 "$here/torch-compare.py" "$work/native" "$work/cachalot" "$work/native2" | tee "$out/same-bytes.md"
echo "compare rc=$?"
for p in "$work"/cachalot/gpt_train.pickle "$work"/cachalot/multistream.pickle; do
    python3 -m torch.cuda._memory_viz trace_plot "$p" -o "$work/$(basename "$p").trace.html" && \
    python3 -m torch.cuda._memory_viz segment_plot "$p" -o "$work/$(basename "$p").segments.html" && \
    echo "_memory_viz opened $(basename "$p"): $(stat -c %s "$work/$(basename "$p").trace.html") B trace plot"
done
tar -C "$work" -czf "$out/cachalot-runs.tar.gz" cachalot native
fi

if has determinism; then
echo "== 1b. losses with deterministic algorithms; does PyTorch repeat itself"
det=(PROOF_DETERMINISTIC=1 CUBLAS_WORKSPACE_CONFIG=:4096:8)
for w in "gpt_train 1" "convnet_train 4" "lstm_train 9" "transformer_varlen 10"; do
    run native det-native $w "${det[@]}"; run cachalot det-cachalot $w "${det[@]}"; run native det-native2 $w "${det[@]}"
done
python3 "$here/torch-compare.py" "$work/det-native" "$work/det-cachalot" "$work/det-native2" | tee "$out/determinism.md"
run native ms-native multistream 3; run native ms-native2 multistream 3; run cachalot ms-cachalot multistream 3
python3 "$here/torch-compare.py" "$work/ms-native" "$work/ms-native2" | tee "$out/multistream-repeat.md"
python3 "$here/torch-compare.py" "$work/ms-native" "$work/ms-cachalot" | tee -a "$out/multistream-repeat.md"
fi

if has features; then
echo "== 4. cross-stream safety, graph capture, OOM, the torch.cuda patch"
for mode in native cachalot cachalot-nohook; do
    timeout 120 python3 "$here/torch-features.py" $mode 2>&1 | tail -1 | tee -a "$out/features.jsonl"
done

fi

if has speed; then
echo "== 2. speed"
for bench in gpt_train convnet_train alloc; do
    for round in $(seq "${SPEED_ROUNDS:-2}"); do
        for mode in native cachalot; do
            timeout 200 python3 "$here/torch-speed.py" $mode $bench 30 2>&1 | tail -1 >> "$out/speed.jsonl"
        done
    done
done
python3 - "$out/speed.jsonl" <<'PY' | tee "$out/speed.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("| bench | PyTorch | cachalot | cachalot / PyTorch |\n|---|---|---|---|")
for bench in ("gpt_train", "convnet_train"):
    med = {m: statistics.median(t for r in rows if r["bench"] == bench and r["mode"] == m for t in r["step_seconds"]) for m in ("native", "cachalot")}
    print(f"| {bench} step (median of all runs' steps) | {med['native']*1e3:.3f} ms | {med['cachalot']*1e3:.3f} ms | {med['cachalot']/med['native']:.4f} |")
for size in rows[-1]["ns_per_empty_del"] if rows and "ns_per_empty_del" in rows[-1] else []:
    v = {m: min(r["ns_per_empty_del"][size] for r in rows if r["bench"] == "alloc" and r["mode"] == m) for m in ("native", "cachalot")}
    print(f"| torch.empty/del {size} B (best run) | {v['native']:.0f} ns | {v['cachalot']:.0f} ns | {v['cachalot']/v['native']:.3f} |")
# Each round's pair (native then cachalot, a moment apart): the ratio of their medians.
for bench in ("gpt_train", "convnet_train"):
    runs = [r for r in rows if r["bench"] == bench]
    ratios = [statistics.median(c["step_seconds"]) / statistics.median(n["step_seconds"])
              for n, c in zip(runs[0::2], runs[1::2]) if n["mode"] == "native" and c["mode"] == "cachalot"]
    if ratios:
        print(f"| {bench}: median of {len(ratios)} paired ratios | | | {statistics.median(ratios):.4f} (range {min(ratios):.3f}-{max(ratios):.3f}) |")
PY
fi
} 2>&1 | tee "$out/log"
