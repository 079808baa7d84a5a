#!/usr/bin/env bash
# Exits 0 when the Soft-RoCE VM harness can run here (QEMU and the tools present, the kernel
# cache built or buildable with tests/vm/setup.sh), else prints one line saying why and exits 77
# (ctest's SKIP_RETURN_CODE for the rdma tests).
set -euo pipefail
cache=${GS_VM_CACHE:-${HOME:?}/.cache/gradstream-vm}
skip() {
  echo "$*"
  exit 77
}
for tool in qemu-system-x86_64 timeout; do
  command -v "$tool" >/dev/null || skip "$tool not found (run tests/vm/setup.sh)"
done
if [[ -f $cache/current ]]; then
  kver=$(<"$cache/current")
  if [[ -f $cache/$kver/kernel-done ]]; then exit 0; fi
fi
# Not built yet: buildable when the tools setup.sh uses are here.
for tool in busybox apt-get apt-cache dpkg depmod modprobe; do
  command -v "$tool" >/dev/null || skip "no VM kernel in $cache and $tool not found to build one (run tests/vm/setup.sh)"
done
exit 0
