#!/usr/bin/env bash
# Installs every build and test dependency of gradstream: Debian packages (apt-get), then the
# Python ones (torch 2.13.0's CPU wheel, pytest, numpy, matplotlib, scikit-learn for the
# digits data set of examples/ddp_train.py) into the interpreter the
# python tests use ($GS_PYTHON, default python3 on PATH). Idempotent: a second run installs
# nothing and returns quickly. Needs root (or sudo) for apt-get.
set -euo pipefail

python_deps() {
  local py=${GS_PYTHON:-python3}
  local wanted=(torch==2.13.0 pytest numpy matplotlib scikit-learn)
  if "$py" -c 'import torch, pytest, numpy, matplotlib, sklearn, sys
sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    echo "setup: python packages already installed ($py)"
    return
  fi
  echo "setup: installing ${wanted[*]} into $py"
  # Pinned: an unpinned torch would pull a CUDA build of several GB.
  "$py" -m pip install --quiet "${wanted[@]}" ||
    "$py" -m pip install --quiet --break-system-packages "${wanted[@]}"  # Debian's own python3
}

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
  python_deps
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
python_deps
