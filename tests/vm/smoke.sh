#!/usr/bin/env bash
# rdma.vm_smoke, run inside the test VM by run.sh: both Soft-RoCE devices are visible through
# libibverbs, and real RC traffic flows between them (ibv_rc_pingpong, then a perftest RDMA
# WRITE) over the RoCEv2 IPv4 GID. Sizes and iterations are tiny: TCG is for correctness only.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
gid=${GS_VM_RXE_GID_INDEX:-1}
log=$(mktemp -d)

step() { printf '\n== %s\n' "$*"; }
fail() {
  echo "vm_smoke: FAIL: $*"
  for f in "$log"/*; do [[ -s $f ]] && { echo "--- $(basename "$f")"; cat "$f"; }; done
  exit 1
}

step "ibv_devices"
devices=$(ibv_devices)
echo "$devices"
for d in ${GS_VM_RXE_DEVICES:?not inside the test VM}; do
  grep -qw "$d" <<<"$devices" || fail "$d missing from ibv_devices"
done

step "ibv_devinfo -d rxe0"
ibv_devinfo -d rxe0 | grep -E 'hca_id|transport|state|active_mtu|link_layer'

# A server on rxe0, a client on rxe1 connecting over the guest's loopback; both bounded.
pair() {  # pair NAME PORT CMD ARGS... (the client gets 127.0.0.1 appended)
  local name=$1 port=$2 spid rc=0
  shift 2
  timeout 90 "$@" -d rxe0 -p "$port" >"$log/$name.server" 2>&1 &
  spid=$!
  vm_wait_listen "$port" 60 || { kill "$spid" 2>/dev/null; fail "$name server did not listen"; }
  timeout 90 "$@" -d rxe1 -p "$port" 127.0.0.1 >"$log/$name.client" 2>&1 || rc=$?
  wait "$spid" || rc=$((rc ? rc : $?))
  cat "$log/$name.client"
  ((rc == 0)) || fail "$name exited $rc"
}

step "ibv_rc_pingpong rxe0 <-> rxe1 (GID index $gid)"
pair pingpong 18515 ibv_rc_pingpong -g "$gid" -s 4096 -n 200
grep -q 'bytes in .* seconds' "$log/pingpong.client" || fail "pingpong printed no transfer"

step "ib_write_bw rxe1 -> rxe0 (GID index $gid)"
pair write_bw 18516 ib_write_bw -x "$gid" -s 65536 -n 50 -F --report_gbits
grep -qE '^ *65536 +50 ' "$log/write_bw.client" || fail "ib_write_bw printed no result line"

echo
echo "vm_smoke: OK"
