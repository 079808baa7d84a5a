#!/usr/bin/env bash
# The simulator's predictions (tools/sim, cost model with the measured tcp defaults) against
# gradstream-perf runs on this machine: N = 2, 3, 4 processes over tcp on 127.0.0.1, ring and
# halving-doubling allreduce of 64 KiB and 4 MiB. Every prediction must be within a factor of 4
# of the measured median time (the machines are shared and noisy: 10-30 % between runs, up to
# 3x at 1 MiB, see peers.md). Prints both for the record.
set -euo pipefail
perf=${GS_PERF:?set GS_PERF to gradstream-perf}
sim=${GS_SIM:?set GS_SIM to gradstream-sim}
factor=4
fail=0
for n in 2 3 4; do
  for algo in ring halving_doubling; do
    measured=$(GS_ALGO=$algo GS_TRANSPORT=tcp GS_SHM=0 timeout 60 "$perf" --ranks "$n" -b 64K -e 4M -f 64 -n 20 -w 3 |
      awk '!/^#/ && NF >= 10 { print $1, $6 }')
    predicted=$("$sim" --ranks "$n" --per-host "$n" --transport tcp -b 64K -e 4M -f 64 |
      awk -v a="$algo" '!/^#/ && $2 == a { print $1, $3 }')
    while read -r size us; do
      p=$(awk -v s="$size" '$1 == s { print $2 }' <<<"$predicted")
      ratio=$(awk -v m="$us" -v p="$p" 'BEGIN { printf "%.2f", m / p }')
      ok=$(awk -v r="$ratio" -v f="$factor" 'BEGIN { print (r <= f && r >= 1 / f) ? "ok" : "FAIL" }')
      printf 'N=%d %-16s %8s B  measured %9.1f us  predicted %9.1f us  measured/predicted %5s %s\n' \
        "$n" "$algo" "$size" "$us" "$p" "$ratio" "$ok"
      [[ $ok == ok ]] || fail=1
    done <<<"$measured"
    [[ -n $measured ]] || { echo "N=$n $algo: gradstream-perf printed no rows"; fail=1; }
  done
done
exit $fail
