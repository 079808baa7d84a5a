#!/usr/bin/env bash
# rdma.collectives, run inside the Soft-RoCE VM: every collective over the verbs transport
# through the C API (gradstream-perf), 2 and 4 ranks, each rank on rxe0 or rxe1, results
# checked element by element (-c 1). Sizes stay small: TCG emulation is for correctness only.
#   collectives.sh PERF_EXE
set -euo pipefail
perf=${1:?usage: collectives.sh PERF_EXE}
# GS_SHM=0: the ranks share the guest, where shared memory would otherwise carry their links.
export GS_TRANSPORT=verbs GS_SHM=0 GS_TIMEOUT_MS=30000
failed=0
run() {  # run RANKS COLL DTYPE OP [extra...]
  local ranks=$1 coll=$2 dtype=$3 op=$4
  shift 4
  local out
  if ! out=$("$perf" --ranks "$ranks" -b 1K -e 1M -f 32 -n 2 -w 1 -c 1 --timeout 120 \
    --coll "$coll" -d "$dtype" -o "$op" "$@" 2>&1); then
    echo "FAIL: $ranks ranks $coll $dtype $op $*"
    echo "$out"
    failed=1
    return
  fi
  # Every size row must report 0 wrong elements, and the run must end with the OK line.
  if ! grep -q "Out of bounds values : 0 OK" <<<"$out" ||
    awk '/^ +[0-9]/ && $9 != 0 { bad = 1 } END { exit !bad }' <<<"$out"; then
    echo "FAIL (wrong elements): $ranks ranks $coll $dtype $op $*"
    echo "$out"
    failed=1
    return
  fi
  if ! grep -qx "# transport: verbs" <<<"$out"; then
    echo "FAIL (not over verbs): $ranks ranks $coll $dtype $op $*"
    echo "$out"
    failed=1
    return
  fi
  echo "ok: $ranks ranks $coll $dtype $op $* ($(grep -c '^ \+[0-9]' <<<"$out") sizes)"
}
for ranks in 2 4; do
  run "$ranks" allreduce float32 sum
  run "$ranks" reduce_scatter bfloat16 max --inplace
  run "$ranks" allgather int32 sum
  run "$ranks" broadcast float64 sum -r 1
  run "$ranks" reduce float32 sum -r 1
  run "$ranks" alltoall int64 sum
  run "$ranks" sendrecv bfloat16 sum
done
# Several QPs per peer and a small chunk: many chunks in flight, spread over 4 queue pairs.
GS_IB_QPS_PER_PEER=4 GS_CHUNK_BYTES=16K run 2 allreduce float32 sum
# A lossy codec over verbs: decoded replicas stay identical (checked with -c 0: values differ
# from the exact sum by design; the C API tests cover bit-identical replicas).
GS_CODEC=int8 "$perf" --ranks 2 -b 64K -e 64K -n 2 -w 1 -c 0 --timeout 120 >/dev/null ||
  { echo "FAIL: int8 allreduce over verbs"; failed=1; }
exit "$failed"
