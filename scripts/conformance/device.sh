#!/usr/bin/env bash
# One conformance round on the GPU machine: generate, capture, check, pack.
#
#   bash DIR/device.sh SEED COUNT [START]
#
# DIR holds gen.py, capture.py, check.py and a stripped release `cachalot` (see README.md for
# how to carry it there). Writes to $OUT (default /tmp/conformance-out): specs.jsonl, log,
# check.txt and traces-N.tar (the traces, mismatches first, xz-compressed; see check.py), at most
# 8 files in all (PACK_FILES tars, 5 by default), as the GPU machine gives back.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
seed=$1 count=$2 start=${3:-0}
out=${OUT:-/tmp/conformance-out}
cap=/tmp/conformance-cap-$seed
export PYTHONUNBUFFERED=1
mkdir -p "$out" "$cap"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__)'
    python3 "$dir/gen.py" --seed "$seed" --count "$count" --start "$start" >"$out/specs.jsonl"
    export CAPTURE_DEADLINE=$(( $(date +%s) + ${CAPTURE_SECONDS:-400} ))
    python3 "$dir/capture.py" "$out/specs.jsonl" "$cap" -j "${CAPTURE_JOBS:-16}" --chunk "${CAPTURE_CHUNK:-8}"
    grep -v ' 0 ' "$cap/capture.log" | head -20
    cat "$cap"/*.error.txt 2>/dev/null | sort | uniq -c | sort -rn | head -10
    if [[ -x $dir/cachalot ]]; then
        python3 "$dir/check.py" --cachalot "$dir/cachalot" "$cap" --pack "$out" --pack-files "${PACK_FILES:-5}"
        cp "$cap/check.txt" "$out/"
    else
        echo "no cachalot binary in $dir: packing without a check"
        python3 -c "import sys; sys.path.insert(0, '$dir'); import check, os; \
names = sorted(f[:-7] for f in os.listdir('$cap') if f.endswith('.pickle')); \
print(check.pack('$cap', names, [], '$out', 15 << 20, 6))"
    fi
} 2>&1 | tee "$out/log"
