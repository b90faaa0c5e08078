#!/usr/bin/env bash
# Runs the hostile-input classes of issue 20 against a debug build of `cachalot` and prints the
# table of BENCHMARKS.md ("Hostile input"). Arguments go to hostile.py (--mutants N, --seed N).
# About a minute on two cores after the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -p cachalot-cli --locked
exec python3 scripts/dev/hostile.py target/debug/cachalot "$@"
