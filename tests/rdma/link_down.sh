#!/usr/bin/env bash
# rdma.link_down, run inside the Soft-RoCE VM: the RoCE link of one rank goes down in the
# middle of a run of allreduces. Both ranks must stop with a clear error naming the RDMA
# device (a port-down async event or a work completion that ran out of retries), well within
# the collective timeout, and nothing may hang.
#   link_down.sh PERF_EXE
set -euo pipefail
perf=${1:?usage: link_down.sh PERF_EXE}
netdevs=(${GS_VM_RXE_NETDEVS:?not inside the test VM})
# ACK timeout 4.096 us x 2^16 = 268 ms, 3 retries: long enough for a loaded emulated guest (12
# gave spurious retry-exceeded errors under load), short enough to notice a dead link in ~1 s.
# GS_SHM=0: both ranks share the guest; the link that goes down must be the one they use.
export GS_TRANSPORT=verbs GS_SHM=0 GS_TIMEOUT_MS=30000 GS_IB_TIMEOUT=16 GS_IB_RETRY_CNT=3
ipcmd=$(command -v ip || echo /usr/sbin/ip)
out=$(mktemp)
"$perf" --ranks 2 -b 256K -e 256K -n 100000 -w 1 -c 0 --timeout 90 >"$out" 2>&1 &
pid=$!
# Let the ranks connect and run a few collectives first.
for _ in $(seq 1 100); do
  grep -q "size(B)" "$out" && break
  sleep 0.2
done
sleep 2
kill -0 "$pid" 2>/dev/null || { echo "FAIL: perf ended before the link went down"; cat "$out"; exit 1; }
start=$(date +%s%N)
"$ipcmd" link set "${netdevs[1]}" down
status=0
# Bounded wait: well inside GS_TIMEOUT_MS (30 s).
for _ in $(seq 1 200); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: still running 20 s after the link went down"
  kill -9 "$pid"
  cat "$out"
  exit 1
fi
wait "$pid" || status=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
"$ipcmd" link set "${netdevs[1]}" up
cat "$out"
echo "perf exited with status $status, ${elapsed_ms} ms after the link went down"
[[ $status -ne 0 ]] || { echo "FAIL: perf succeeded"; exit 1; }
grep -Eq "GS_ERR_(REMOTE|SYSTEM)" "$out" || { echo "FAIL: no GS_ERR_REMOTE/SYSTEM"; exit 1; }
grep -Eq "rxe[01]" "$out" || { echo "FAIL: the error does not name the RDMA device"; exit 1; }
echo "ok"
