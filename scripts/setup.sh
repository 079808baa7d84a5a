#!/usr/bin/env bash
# Installs every build and test dependency of gradstream from Debian packages. Idempotent: a
# second run installs nothing and returns quickly. Needs root (or sudo) for apt-get.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkgconf git
  libboost-dev              # Boost.Asio (header-only)
  libgtest-dev libgmock-dev # GoogleTest
  clang clang-format libclang-rt-14-dev  # fuzzers and sanitizers
  iproute2 iperf3 procps    # network namespaces and congestion tests
  libgloo-dev openmpi-bin libopenmpi-dev # peers measured by bench/
  libibverbs-dev ibverbs-providers rdma-core  # verbs transport (optional at build time)
  prometheus-cpp-dev        # metrics exporter (optional at build time)
  prometheus                # real Prometheus server and promtool for tests/monitoring
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
