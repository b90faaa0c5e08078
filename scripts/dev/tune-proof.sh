#!/usr/bin/env bash
# Proof of `cachalot tune` on a GPU (issue 18): for each workload of tune-proof.expected.json,
# runs testdata/traces/capture.py under PyTorch with the PYTORCH_CUDA_ALLOC_CONF that tune
# recommends for the workload's reference trace, and compares PyTorch's peak reserved with tune's
# prediction, to the byte (scripts/dev/tune_proof.py says how).
#
# On the device machine (PyTorch 2.11 with CUDA, no Rust needed), from the repository root:
#   bash scripts/dev/tune-proof.sh [--only NAME ...]
# With .device-bin/cachalot there (scripts/dev/device-cuda.sh builds it, carry [".device-bin"]),
# each run's trace is also replayed with `cachalot replay --check`, and a device of another size
# than the reference traces' H200 is tuned for again. Runs go to $OUT (default a temporary dir).
# Here, to recompute the committed figures: scripts/dev/tune-proof.sh expect
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
if [[ ${1:-} == expect ]]; then
    cachalot=${CACHALOT:-target/debug/cachalot}
    [[ -x $cachalot ]] || cargo build -p cachalot-cli
    exec python3 scripts/dev/tune_proof.py expect --cachalot "$cachalot"
fi
args=(run)
[[ -x .device-bin/cachalot ]] && args+=(--cachalot .device-bin/cachalot)
[[ -n ${OUT:-} ]] && args+=(--out "$OUT")
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
exec python3 scripts/dev/tune_proof.py "${args[@]}" "$@"
