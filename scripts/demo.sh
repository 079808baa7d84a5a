#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs a 2-rank and a 4-rank float32
# allreduce sweep through gradstream-perf on this machine (loopback TCP), with result checks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
perf=${GS_BUILD_DIR:-$root/build}/tools/gradstream-perf
for n in 2 4; do
  echo "== allreduce, float32, $n ranks (processes), tcp on 127.0.0.1"
  "$perf" --ranks "$n" -b 8 -e 64M -f 4 -n 10 -w 3 -c 1 --timeout 600
done
