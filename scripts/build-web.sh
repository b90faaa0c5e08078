#!/usr/bin/env bash
# Builds the web viewer: the cachalot-viewer library for wasm32-unknown-unknown, bound with
# wasm-bindgen --target web, plus viewer/web/index.html, into target/web (or $WEB_OUT).
#
# wasm-bindgen-cli must match the wasm-bindgen version in Cargo.lock exactly; if the one on
# PATH does not, it is installed from crates.io with `cargo install --locked` (no other
# downloads). Serve the result with `cachalot serve` (http://127.0.0.1:8765/).
#
#   scripts/build-web.sh            # release build
#   PROFILE=dev scripts/build-web.sh   # faster to build, slower to run
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
profile=${PROFILE:-release}
case "$profile" in
  dev) profile_dir=debug ;;
  *) profile_dir=$profile ;;
esac
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=${WEB_OUT:-$root/target/web}

version=$(awk '$0 == "name = \"wasm-bindgen\"" { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if [ -z "$version" ]; then
  echo "build-web: no wasm-bindgen in Cargo.lock" >&2
  exit 1
fi
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" != "$version" ]; then
  echo "build-web: installing wasm-bindgen-cli $version (found '${have:-none}')"
  # The tool's own version is what must match the crate, and it is pinned exactly. Its lock file
  # is not used (no --locked): 0.2.130's pins a webpki-roots that crates.io has yanked, so a
  # locked install fails to resolve before anything is built.
  cargo install wasm-bindgen-cli --version "=$version"
fi
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi

# A cdylib only for this build: native builds of the crate stay rlib-only (faster links).
cargo rustc -p cachalot-viewer --lib --crate-type cdylib --target wasm32-unknown-unknown --profile "$profile"

mkdir -p "$out"
wasm-bindgen --target web --no-typescript --out-dir "$out" --out-name cachalot_viewer \
  "$target_dir/wasm32-unknown-unknown/$profile_dir/cachalot_viewer.wasm"
cp viewer/web/index.html "$out/index.html"
echo "build-web: wrote $out ($(du -sh "$out" | cut -f1)); serve it with: cachalot serve --dir $out"
