#!/bin/bash
# Runs inside the test VM (chroot on the overlay of the host root), started by the initramfs
# /init: sets up two Soft-RoCE devices over one veth pair (tests/vm/README.md), then runs
# the job that run.sh wrote to /run/gs-vm/job with its output on the second serial port, and
# writes its exit status to /run/gs-vm/rc. Few processes: every exec costs milliseconds under TCG.
set -u
ctl=/run/gs-vm
now() { read -r now _ </proc/uptime; }  # guest uptime in $now, without a subshell
mark() { [[ ! -f $ctl/trace ]] || { now && echo "$now $1" >>"$ctl/trace"; }; }
mark "chroot entered"

setup_rxe() {
  # New interfaces inherit conf/default: set it first so one ip batch does the rest.
  local f
  for f in all/rp_filter default/rp_filter; do echo 0 >"/proc/sys/net/ipv4/conf/$f" || return 1; done
  echo 1 >/proc/sys/net/ipv4/conf/default/accept_local || return 1
  ip -batch - <<'NET' || return 1
link set lo up
link add vrxe0 type veth peer name vrxe1
addr add 10.77.0.1/24 dev vrxe0
addr add 10.77.0.2/24 dev vrxe1
link set vrxe0 up
link set vrxe1 up
NET
  mark "veth up"
  rdma -b - <<'NET' || return 1
link add rxe0 type rxe netdev vrxe0
link add rxe1 type rxe netdev vrxe1
NET
}

# On failure no rc file: run.sh reports a failed VM with this console's tail.
setup_rxe || { echo "gs-vm guest: Soft-RoCE setup failed"; exit 1; }

# The job: GS_VM_CWD, the GS_VM_ARGV array and the caller's exported environment.
# shellcheck source=/dev/null
. "$ctl/job"
export GS_VM=1
export GS_VM_RXE_DEVICES="rxe0 rxe1"
export GS_VM_RXE_NETDEVS="vrxe0 vrxe1"
export GS_VM_RXE_IPS="10.77.0.1 10.77.0.2"
export GS_VM_RXE_GID_INDEX=1

exec 3>/dev/ttyS1  # raw mode set by /init
mark "rxe devices added"
now
ready=$now
if cd -- "$GS_VM_CWD"; then
  "${GS_VM_ARGV[@]}" </dev/null >&3 2>&3
  rc=$?
else
  echo "gs-vm guest: cannot cd to $GS_VM_CWD" >&3
  rc=125
fi
exec 3>&-
now
echo "$ready $now" >"$ctl/times"
echo "$rc" >"$ctl/rc"
