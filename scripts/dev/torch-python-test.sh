#!/usr/bin/env bash
# Installs the cachalot_torch package as its README says, `pip install ./bindings/torch` (PEP 517:
# pip fetches maturin and builds the wheel with cargo), into a fresh virtual environment, and runs
# its Python tests there without a GPU: it imports, says CUDA is missing, and its C ABI answers on
# a simulated device.
#
#   scripts/dev/torch-python-test.sh          (needs python3 with venv, cargo, and PyPI for maturin)
#
# The wheel is built with cargo's dev profile (MATURIN_PEP517_ARGS), which reuses what
# `cargo test` compiled; a user's `pip install` builds the release profile, the same code.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! python3 -m venv "$work/venv" >/dev/null 2>&1; then
  echo "torch-python-test.sh: python3 -m venv failed: install python3-venv (Debian/Ubuntu: apt install python3-venv)" >&2
  exit 1
fi
python=$work/venv/bin/python
cd "$root"
echo "torch-python-test.sh: pip install ./bindings/torch into a fresh venv (builds the wheel: a minute or more)"
MATURIN_PEP517_ARGS="--profile dev" "$python" -m pip install -q ./bindings/torch
# The package the tests import is the installed one, not the source tree.
"$python" -c 'import sys, cachalot_torch; assert cachalot_torch.__file__.startswith(sys.prefix), cachalot_torch.__file__; print("imported", cachalot_torch.__file__); print(cachalot_torch.cuda_status(0))'
"$python" -m unittest discover -v -s bindings/torch/python/tests
