#!/usr/bin/env bash
# Builds, here, what torch-device.sh needs on the GPU machine (which has no Rust): the
# cachalot_torch wheel (maturin, release, abi3: CPython >= 3.9), the `cachalot` binary, the device scripts and
# ../shared/traces/capture.py, into the git-ignored carry folder (default /work/main/.dev-torch).
#
#   scripts/dev/torch-build.sh [CARRY_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${1:-/work/main/.dev-torch}
shared=${CACHALOT_SHARED_DIR:-$root/../shared}
command -v maturin >/dev/null || { echo "torch-build.sh: maturin is needed (pip install maturin)" >&2; exit 1; }
mkdir -p "$carry"
rm -f "$carry"/cachalot_torch-*.whl
(cd "$root/bindings/torch" && maturin build --release --strip -o "$carry")
cp "$root"/scripts/dev/torch-{device.sh,proof.py,compare.py,speed.py,features.py,graph-probe.py,stacks.py,ddp.py,jobs.py,policy.py,checkpoint-job.py,oom-causes.py} \
    "$root"/scripts/dev/vmm-cost.cu "$carry/"
# The command line, for `cachalot tune` of the jobs' captures there (torch-device.sh policy).
cargo build --release --quiet -p cachalot-cli --manifest-path "$root/Cargo.toml"
cp "${CARGO_TARGET_DIR:-$root/target}/release/cachalot" "$carry/" && strip "$carry/cachalot"
cp "$shared/traces/capture.py" "$carry/"
cp "$root/scripts/conformance/pool_calls.py" "$carry/"
du -sh "$carry"
