#!/usr/bin/env bash
# Installs what cachalot needs on a fresh Debian/Ubuntu machine, if it is missing:
# Mesa's software Vulkan (lavapipe) and the Vulkan loader, so the wgpu backend and the viewer
# work without a GPU. Sourced by scripts/main and scripts/test. Needs root (or sudo) to install;
# without it, says what to install and carries on (wgpu then falls back to the simulator).
# SETUP_EXTRA_PACKAGES adds more (scripts/test: a virtual display and Mesa's OpenGL for the
# window test).
missing=()
for pkg in mesa-vulkan-drivers libvulkan1 ${SETUP_EXTRA_PACKAGES:-}; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else sudo="none"; fi
  if [ "$sudo" != none ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: please install ${missing[*]}; continuing without" >&2
  fi
fi
# lavapipe warns about this on every start when it is unset.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
