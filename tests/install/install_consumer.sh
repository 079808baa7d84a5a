#!/usr/bin/env bash
# usage: install_consumer.sh BUILD_DIR CONSUMER_SRC C_COMPILER
set -euo pipefail
build=$1 src=$2 cc=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# Only gs_* symbols are exported.
if nm -D --defined-only "$work/prefix/lib/libgradstream.so" | awk '{print $3}' | grep -v '^gs_' | grep -q .; then
  echo "non-gs_ symbols exported:"; nm -D --defined-only "$work/prefix/lib/libgradstream.so" | grep -v ' gs_'
  exit 1
fi
cmake -S "$src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/consumer" | grep -q 'GS_ERR_TIMEOUT'
pc="$work/prefix/lib/pkgconfig"
"$cc" -std=c99 -Wall -Wextra -Wpedantic -Werror "$src/main.c" -o "$work/pc-consumer" \
  $(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs gradstream) -Wl,-rpath,"$work/prefix/lib"
"$work/pc-consumer" | grep -q 'GS_ERR_TIMEOUT'
# The installed tool finds the installed library.
"$work/prefix/bin/gradstream-perf" --ranks 2 -b 1K -e 1K -n 2 -w 1 -c 1 | grep -q 'Out of bounds values : 0 OK'
echo "install_consumer: ok"
