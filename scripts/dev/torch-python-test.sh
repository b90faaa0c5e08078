#!/usr/bin/env bash
# Builds the cachalot_torch wheel (maturin, debug profile: only pyo3 and the crate compile beyond
# what `cargo build` has) and runs its Python tests without a GPU, from the unpacked wheel.
#
#   scripts/dev/torch-python-test.sh          (needs python3 and maturin: pip install maturin)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python3 -m maturin --version >/dev/null 2>&1 || { echo "torch-python-test.sh: maturin is needed (pip install maturin)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$root/bindings/torch" && python3 -m maturin build -q -o "$work/wheel")
python3 -m zipfile -e "$work"/wheel/cachalot_torch-*.whl "$work/site"
PYTHONPATH="$work/site" python3 -m unittest discover -v -s "$root/bindings/torch/python/tests"
