#!/usr/bin/env bash
# Runs one command inside the Soft-RoCE test VM (tests/vm/README.md) and exits with its status.
#
#   tests/vm/run.sh [--cwd DIR] [--timeout SEC] [--share DIR]... -- CMD ARGS...
#
# The guest (Debian's kernel under QEMU TCG, 2 vCPUs, 2 GiB) sees the host's root read-only
# with a tmpfs overlay on top, and these host directories writable at the same paths: the
# repository, the working directory (--cwd, default: the current one) and each --share. It has
# two Soft-RoCE devices rxe0/rxe1 over a veth pair (10.77.0.1/10.77.0.2) and its own loopback.
# CMD runs as root in DIR with stdout and stderr on this script's stdout, with GS_VM=1,
# GS_VM_RXE_DEVICES, GS_VM_RXE_NETDEVS, GS_VM_RXE_IPS, GS_VM_RXE_GID_INDEX set and these of the
# caller's variables passed through: GS_*, PATH, HOME, USER, LOGNAME, LANG, LC_*, TZ, TERM,
# LD_LIBRARY_PATH, *SAN_OPTIONS, GTEST_*, RDMAV_*, IBV_*, PYTHONPATH, and any named in
# GS_VM_PASS_ENV (space-separated names).
#
# Exit status: CMD's; 77 when the harness cannot run here (reason on stderr; ctest: skipped);
# 124 when --timeout (default 300 s, boot included) passed and QEMU was killed; 125 when the VM
# failed to boot or to set up (either way the guest's phase marks, QEMU's errors and the console
# log's tail go to stderr). GS_VM_VERBOSE=1 also copies the guest console to stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GS_VM_CACHE:-${HOME:?}/.cache/gradstream-vm}

usage() {
  echo "usage: $0 [--cwd DIR] [--timeout SEC] [--share DIR]... -- CMD ARGS..." >&2
  exit 2
}
cwd=$PWD
timeout=300
shares=("$repo")
while (($#)); do
  case $1 in
    --cwd) (($# >= 2)) || usage; cwd=$2; shift 2 ;;
    --timeout) (($# >= 2)) || usage; timeout=$2; shift 2 ;;
    --share) (($# >= 2)) || usage; shares+=("$2"); shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) usage ;;
  esac
done
(($#)) || usage
[[ $timeout =~ ^[0-9]+$ && $timeout -gt 0 ]] || { echo "vm: bad --timeout '$timeout'" >&2; exit 2; }
cwd=$(cd "$cwd" && pwd) || { echo "vm: no directory '$cwd'" >&2; exit 2; }
shares+=("$cwd")

# Skip (77) with the reason when the harness cannot run; build a missing or stale cache.
if ! reason=$("$here/available.sh" 2>&1); then
  echo "vm: SKIP: $reason" >&2
  exit 77
fi
paths=$("$here/setup.sh" --no-install --print) ||
  { echo "vm: SKIP: cannot build the VM cache in $cache (tests/vm/setup.sh failed)" >&2; exit 77; }
kernel=$(sed -n 's/^kernel=//p' <<<"$paths")
initrd=$(sed -n 's/^initrd=//p' <<<"$paths")

# Writable shares: absolute, existing, none inside another (the outer one carries it).
mapfile -t shares < <(for s in "${shares[@]}"; do (cd "$s" && pwd); done | LC_ALL=C sort -u)
kept=()
for s in "${shares[@]}"; do
  inner=0
  for k in "${kept[@]}"; do
    if [[ $k == / || $s == "$k" || $s == "$k"/* ]]; then inner=1; fi
  done
  ((inner)) || kept+=("$s")
done

ctl=$(mktemp -d "${TMPDIR:-/tmp}/gs-vm.XXXXXX")
qemu_pid=
# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  # timeout(1) leads its own process group (itself and QEMU): kill the whole group.
  if [[ -n $qemu_pid ]]; then kill -KILL -- "-$qemu_pid" 2>/dev/null || true; fi
  rm -rf "$ctl"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }  # single-quoted for the guest's busybox sh
{
  echo "GS_VM_GUEST=$(q "$here/guest.sh")"
  echo "GS_VM_HOSTNAME=$(q "${HOSTNAME:-gs-vm}")"
  if [[ -t 1 ]]; then echo "GS_VM_ONLCR=1"; fi
} >"$ctl/config"
virtfs=()
i=0
: >"$ctl/shares"
for s in "${kept[@]}"; do
  [[ $s != *$'\n'* && $s != *,* ]] || { echo "vm: cannot share '$s' (comma or newline)" >&2; exit 2; }
  echo "gsw$i $s" >>"$ctl/shares"
  virtfs+=(-virtfs "local,path=$s,mount_tag=gsw$i,security_model=none,multidevs=remap")
  i=$((i + 1))
done

# The job for guest.sh (bash): directory, argv, environment.
{
  printf 'GS_VM_CWD=%q\n' "$cwd"
  GS_VM_ARGV=("$@")
  declare -p GS_VM_ARGV
  extra=" ${GS_VM_PASS_ENV:-} "
  while IFS= read -r name; do
    case $name in
      GS_VM_PASS_ENV | GS_VM_CACHE | GS_VM_VERBOSE) ;;
      GS_* | PATH | HOME | USER | LOGNAME | LANG | LC_* | TZ | TERM | LD_LIBRARY_PATH | \
        *SAN_OPTIONS | GTEST_* | RDMAV_* | IBV_* | PYTHONPATH)
        printf 'export %s=%q\n' "$name" "${!name}" ;;
      *) if [[ $extra == *" $name "* ]]; then printf 'export %s=%q\n' "$name" "${!name}"; fi ;;
    esac
  done < <(compgen -e)
} >"$ctl/job"

# The guest's ttyS1 is our stdout. QEMU gets the descriptor itself (fd 3, a dup sharing the
# offset): reopening /dev/stdout would write over our own lines when stdout is a plain file.
exec 3>&1
# shellcheck disable=SC2054
out_chardev=(-add-fd fd=3,set=1 -chardev file,id=out,path=/dev/fdset/1,append=on)
# shellcheck disable=SC2054
if [[ -t 1 ]]; then out_chardev=(-chardev file,id=out,path=/dev/stdout,append=on); fi
# shellcheck disable=SC2054  # commas belong to QEMU's option syntax
qemu=(qemu-system-x86_64 -accel tcg,thread=multi -cpu max -machine q35 -smp 2 -m 2G
  -nodefaults -display none -nic none -no-reboot
  -kernel "$kernel" -initrd "$initrd" -append "console=ttyS0 panic=-1 printk.time=1 ${GS_VM_KERNEL_ARGS-mitigations=off}"
  -chardev "file,id=con,path=$ctl/console.log" -serial chardev:con
  "${out_chardev[@]}" -serial chardev:out
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,multidevs=remap,readonly=on"
  -virtfs "local,path=$ctl,mount_tag=gsctl,security_model=none"
  "${virtfs[@]}")

# The guest's phase marks (init and guest.sh append "UPTIME PHASE" to the control share).
show_trace() {
  if [[ -s $ctl/trace ]]; then
    sed 's/^/vm trace: /' "$ctl/trace" >&2
  else
    echo "vm trace: (no phase reached: stalled in the kernel or before the control share mounted)" >&2
  fi
}

start=$(date +%s.%N)
# timeout(1) sends TERM to QEMU at the deadline and KILL 5 s later; $! is timeout itself, the
# leader of the process group that cleanup() kills if this script is interrupted.
timeout -k 5 "$timeout" "${qemu[@]}" </dev/null 2>"$ctl/qemu.err" &
qemu_pid=$!
if [[ ${GS_VM_VERBOSE:-0} == 1 ]]; then
  tail -n +1 --pid="$qemu_pid" -F "$ctl/console.log" >&2 2>/dev/null &
fi
status=0
wait "$qemu_pid" || status=$?
qemu_pid=
wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')

if [[ -f $ctl/rc ]]; then
  rc=$(<"$ctl/rc")
  times=$(cat "$ctl/times" 2>/dev/null || true)
  read -r ready end <<<"${times:-? ?}"
  if [[ ${GS_VM_VERBOSE:-0} == 1 ]]; then show_trace; fi
  echo "vm: exit $rc; guest ready at ${ready} s, command done at ${end} s (guest clock), ${wall} s wall" >&2
  [[ $rc =~ ^[0-9]+$ ]] || rc=125
  exit "$rc"
fi
# A VM that stalled or failed: how far the guest got (its phase marks; none: the kernel or the
# initramfs before the control share), QEMU's own complaints, and the kernel's last lines.
post_mortem() {
  show_trace
  tail -n 5 "$ctl/qemu.err" 2>/dev/null | sed 's/^/vm qemu: /' >&2 || true
  tail -n 30 "$ctl/console.log" 2>/dev/null | sed 's/^/vm console: /' >&2 || true
}
if ((status == 124 || status == 137)); then
  echo "vm: TIMEOUT: killed QEMU after ${timeout} s (${wall} s wall): $*" >&2
  post_mortem
  exit 124
fi
echo "vm: FAILED: the VM ended (QEMU status $status, ${wall} s) without running the command" >&2
post_mortem
exit 125
