#!/bin/bash
# codec=auto against fixed codecs on real (namespaced, tc-shaped) links, in one run:
#   bench/adaptive.sh [PERF_EXE] [ITERS]
# Conditions: fast (unshaped veth), shaped (tbf 1 Gbit/s both ways), shaped + competing flow
# (iperf3 -P 4 sharing rank 0's shaped uplink). 2 ranks, 64 MiB float32 allreduce, median time
# per collective from gradstream-perf; prints auto / best fixed (< 1: auto is faster). Root only.
set -u
PERF=${1:-build/tools/gradstream-perf}
ITERS=${2:-8}
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; exit 77; }
source "$(dirname "$0")/../tests/congestion/testbed.sh"
OUT=$(mktemp -d)
trap 'tb_cleanup; rm -rf "$OUT"' EXIT
tb_setup 3 || exit 1
run() {
  local codec=$1 r port=$((20000 + RANDOM % 20000))
  for r in 0 1; do
    tb_exec $r env RANK=$r WORLD_SIZE=2 MASTER_ADDR="$(tb_addr 0)" MASTER_PORT=$port \
      GS_SECRET=bench GS_TIMEOUT_MS=30000 GS_CODEC="$codec" GS_SHM=0 \
      timeout 300 "$PERF" -b 64M -e 64M -n "$ITERS" -w 1 -c 0 >"$OUT/$codec.$r" 2>&1 &
  done
  wait
  awk '/^ +[0-9]/ {printf "%.1f", $6 / 1000}' "$OUT/$codec.0"
}
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg), 2 ranks, 64 MiB, -n $ITERS"
printf "%-22s %10s %10s %10s %10s\n" condition "raw(ms)" "int8(ms)" "auto(ms)" auto/best
for cond in fast shaped shaped+flow; do
  case $cond in
    fast) tb_unshape 0; tb_unshape 1 ;;
    shaped) tb_shape 0 1gbit; tb_shape 1 1gbit ;;
    shaped+flow)
      tb_exec 2 timeout 600 iperf3 -s -B "$(tb_addr 2)" >/dev/null 2>&1 &
      sleep 0.5
      tb_exec 0 timeout 600 iperf3 -c "$(tb_addr 2)" -t 600 -P 4 >/dev/null 2>&1 &
      sleep 1 ;;
  esac
  raw=$(run raw); int8=$(run int8); auto=$(run auto)
  ratio=$(awk -v a="$auto" -v r="$raw" -v i="$int8" 'BEGIN { b = r < i ? r : i; if (a > 0 && b > 0) printf "%.2f", a / b; else print "-" }')
  printf "%-22s %10s %10s %10s %10s\n" "$cond" "${raw:--}" "${int8:--}" "${auto:--}" "$ratio"
done
