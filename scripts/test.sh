#!/usr/bin/env bash
# Installs dependencies, builds with tests, and runs the whole test suite (ctest). Tests that
# need a GPU or an RDMA device carry the labels gpu/rdma and skip with a reason where absent.
# Extra arguments go to ctest (e.g. -L unit, -R Collectives).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/tests/vm/setup.sh" || echo "test: Soft-RoCE VM unavailable; the rdma tests will be skipped" >&2
"$root/scripts/build.sh" -DGS_BUILD_TESTS=ON
cd "${GS_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j2 --timeout 300 "$@"
