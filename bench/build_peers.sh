#!/usr/bin/env bash
# Builds the peer benchmarks (Gloo, MPI) into a build directory, default build/bench.
# They are not part of the CMake build: Gloo and MPI are optional and only the bench needs them.
# Rebuilds a program only when its sources are newer than the binary.
#
#   bench/build_peers.sh [BUILD_DIR]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
out=${1:-$root/build/bench}
mkdir -p "$out"
src=$here/peers
flags=(-O2 -g -Wall -Wextra -I"$src")

# up_to_date BIN SRC...: true when BIN exists and is newer than every SRC.
up_to_date() {
  local bin=$1 f
  shift
  [[ -x $bin ]] || return 1
  for f in "$@"; do
    [[ $f -nt $bin ]] && return 1
  done
  return 0
}

status=0
gloo_src=("$src/gloo_allreduce.cc" "$src/bench_common.h" "$here/build_peers.sh")
if up_to_date "$out/gloo_allreduce" "${gloo_src[@]}"; then
  echo "build_peers: gloo_allreduce up to date"
elif [[ ! -f /usr/include/gloo/allreduce.h ]]; then
  echo "build_peers: Gloo headers not found (apt-get install libgloo-dev); skipping gloo_allreduce" >&2
  status=1
else
  echo "build_peers: building $out/gloo_allreduce"
  ${CXX:-g++} -std=c++17 "${flags[@]}" -o "$out/gloo_allreduce.tmp" "$src/gloo_allreduce.cc" \
    -lgloo -pthread
  mv "$out/gloo_allreduce.tmp" "$out/gloo_allreduce"
fi

mpi_src=("$src/mpi_allreduce.c" "$src/bench_common.h" "$here/build_peers.sh")
if up_to_date "$out/mpi_allreduce" "${mpi_src[@]}"; then
  echo "build_peers: mpi_allreduce up to date"
elif ! command -v "${MPICC:-mpicc}" >/dev/null; then
  echo "build_peers: mpicc not found (apt-get install libopenmpi-dev); skipping mpi_allreduce" >&2
  status=1
else
  echo "build_peers: building $out/mpi_allreduce"
  "${MPICC:-mpicc}" -std=c11 -D_POSIX_C_SOURCE=200809L "${flags[@]}" -o "$out/mpi_allreduce.tmp" \
    "$src/mpi_allreduce.c"
  mv "$out/mpi_allreduce.tmp" "$out/mpi_allreduce"
fi
exit $status
