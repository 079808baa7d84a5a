#!/usr/bin/env bash
# Hierarchical allreduce across two "hosts": each host is a network namespace (the congestion
# testbed: a bridge, 198.19.1.0/24) running two ranks that name their host with GS_HOSTNAME, so
# the communicator groups ranks 0,1 and 2,3. GS_ALGO=hierarchical: ring inside each host,
# halving-doubling across hosts, ring allgather inside. Every element is checked (-c 1) for
# sum/float32, max/bfloat16 in place and avg/int32, and the algorithm column must say
# hierarchical for the multi-chunk sizes. GS_SHM=1: the two ranks of a host talk over shared
# memory, hosts over tcp (the veth links), so rank 0 must report "shm+tcp" (this needs the shm
# transport: where it cannot open, every link is tcp and the test fails). Root only (exit 77
# otherwise); bounded by timeouts.
#   hierarchical_netns.sh PERF_EXE
set -uo pipefail
perf=${1:?usage: hierarchical_netns.sh PERF_EXE}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root to create network namespaces"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: iproute2 missing"; exit 77; }
# shellcheck source=../congestion/testbed.sh
source "$here/../congestion/testbed.sh"
out=$(mktemp -d)
trap 'tb_cleanup; rm -rf "$out"' EXIT
tb_setup 2 || { echo "SKIP: cannot create network namespaces"; exit 77; }

failed=0
run() {  # run TAG PERF_ARGS...: 4 ranks, 2 per host
  local tag=$1 h l r port=$((20000 + RANDOM % 20000))
  shift
  for h in 0 1; do
    for l in 0 1; do
      r=$((2 * h + l))
      tb_exec "$h" env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$l MASTER_ADDR="$(tb_addr 0)" \
        MASTER_PORT=$port GS_SECRET=hier GS_HOSTNAME="host$h" GS_SHM=1 GS_ALGO=hierarchical \
        GS_TIMEOUT_MS=20000 timeout -k 5 120 "$perf" -b 1K -e 4M -f 64 -n 2 -w 1 -c 1 \
        --timeout 100 "$@" >"$out/$tag.$r" 2>&1 &
    done
  done
  wait
  if ! grep -q "Out of bounds values : 0 OK" "$out/$tag.0" ||
    awk '/^ +[0-9]/ && $9 != 0 { bad = 1 } END { exit !bad }' "$out/$tag.0"; then
    echo "FAIL: $tag"
    for r in 0 1 2 3; do echo "--- rank $r"; tail -5 "$out/$tag.$r"; done
    failed=1
    return
  fi
  # 4 MiB: many chunks, ranks on two hosts: the hierarchical schedule ran (not a fallback).
  if ! awk '/^ +[0-9]/ && $1 == 4194304 { found = 1; if ($NF != "hierarchical") bad = 1 }
            END { exit !(found && !bad) }' "$out/$tag.0"; then
    echo "FAIL: $tag did not run the hierarchical schedule"
    cat "$out/$tag.0"
    failed=1
    return
  fi
  local transport
  transport=$(sed -n 's/^# transport: //p' "$out/$tag.0")
  if [[ $transport != "shm+tcp" ]]; then
    echo "FAIL: $tag: rank 0's links are over '$transport', not shm inside its host and tcp across"
    failed=1
    return
  fi
  echo "ok: $tag ($transport)"
  grep -E '^ +[0-9]' "$out/$tag.0"
}
run sum_float32 --coll allreduce -d float32 -o sum
run max_bfloat16_inplace --coll allreduce -d bfloat16 -o max --inplace
run avg_int32 --coll allreduce -d int32 -o avg
exit "$failed"
