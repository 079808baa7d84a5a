#!/usr/bin/env bash
# Configures and builds gradstream into build/ (or $GS_BUILD_DIR). Extra arguments go to cmake.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GS_BUILD_DIR:-$root/build}
# GS_CMAKE_ARGS: extra cmake arguments from the environment (CI uses it for GS_WITH_CUDA=ON).
extra=()
if [[ -n "${GS_CMAKE_ARGS:-}" ]]; then
  read -r -a extra <<<"$GS_CMAKE_ARGS"
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" "${extra[@]}" >/dev/null
ninja -C "$build" -j"$(nproc)"
