#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for SECONDS each (default 5), starting from its committed
# corpus (fuzz/corpus/TARGET, seeded from the reference files). What a run finds new goes to a
# scratch copy, so the committed seeds stay as they are; a crash leaves its input under
# fuzz/artifacts/TARGET/ and fails the script.
#
# Only the stable toolchain is needed: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags, and
# `--sanitizer none` leaves out AddressSanitizer, which needs a nightly standard library. The
# targets are safe Rust, so the checks that matter (panics, overflow checks and debug assertions,
# which fuzz/Cargo.toml keeps on; libFuzzer's memory and time limits) all still apply.
#
# Cost on two cores: building the fuzz crate about 6 minutes from scratch, then 6 x SECONDS.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-5}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
cd fuzz
cargo fuzz build --sanitizer none
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in $(cargo fuzz list); do
  mkdir -p "$scratch/$target"
  echo "fuzz: $target for ${seconds}s"
  # -rss_limit_mb: a reader that sizes memory by a number in its input is a finding.
  cargo fuzz run --sanitizer none "$target" "$scratch/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 2>&1 |
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY|.*panicked)" || true
  # cargo fuzz run fails on a crash; the pipeline's status is grep's, so check for artifacts.
  if compgen -G "artifacts/$target/*" >/dev/null; then
    echo "fuzz: $target found a failing input: fuzz/artifacts/$target/" >&2
    exit 1
  fi
done
