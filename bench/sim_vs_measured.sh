#!/usr/bin/env bash
# The simulator's predictions (tools/sim, cost model with the measured defaults) against
# gradstream-perf runs on this machine: N = 2, 3, 4 processes over tcp on 127.0.0.1, and N = 2
# over shm (the model assumes a core per rank: more shm ranks than this machine's 2 cores wait
# on the scheduler, not on the link), ring and halving-doubling allreduce of 64 KiB and 4 MiB.
# Every prediction must be within a factor of 4 of the measured median time (the machines are
# shared and noisy: 10-30 % between runs, up to 3x at 1 MiB, see docs/PERFORMANCE.md), or of 8
# where the ranks outnumber the cores (the model has a core per rank; here 3-4 processes share 2
# cores and wait for the scheduler, 2-3x slower than predicted on a quiet machine). Prints both
# for the record; exits 1 when a ratio is outside its factor. A benchmark, not a test: run it on
# a quiet machine (a CI run beside other jobs measured 6.3x at shm 64 KiB once).
#   bench/sim_vs_measured.sh     (GS_BUILD_DIR=dir: build tree, default <repo>/build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GS_BUILD_DIR:-$root/build}
perf=${GS_PERF:-$build/tools/gradstream-perf}
sim=${GS_SIM:-$build/tools/gradstream-sim}
[[ -x $perf && -x $sim ]] || { echo "sim_vs_measured.sh: $perf or $sim missing (build first)" >&2; exit 1; }
cores=$(nproc)
fail=0
for run in tcp:2 tcp:3 tcp:4 shm:2; do
  transport=${run%:*} n=${run#*:}
  shm=0
  [[ $transport == shm ]] && shm=1
  factor=4
  ((n <= cores)) || factor=8
  for algo in ring halving_doubling; do
    measured=$(GS_ALGO=$algo GS_TRANSPORT=tcp GS_SHM=$shm timeout 60 "$perf" --ranks "$n" -b 64K -e 4M -f 64 -n 20 -w 3 |
      awk '!/^#/ && NF >= 10 { print $1, $6 }')
    predicted=$("$sim" --ranks "$n" --per-host "$n" --transport "$transport" -b 64K -e 4M -f 64 |
      awk -v a="$algo" '!/^#/ && $2 == a { print $1, $3 }')
    while read -r size us; do
      p=$(awk -v s="$size" '$1 == s { print $2 }' <<<"$predicted")
      ratio=$(awk -v m="$us" -v p="$p" 'BEGIN { printf "%.2f", m / p }')
      ok=$(awk -v r="$ratio" -v f="$factor" 'BEGIN { print (r <= f && r >= 1 / f) ? "ok" : "FAIL" }')
      printf '%s N=%d %-16s %8s B  measured %9.1f us  predicted %9.1f us  measured/predicted %5s (within %dx) %s\n' \
        "$transport" "$n" "$algo" "$size" "$us" "$p" "$ratio" "$factor" "$ok"
      [[ $ok == ok ]] || fail=1
    done <<<"$measured"
    [[ -n $measured ]] || { echo "$transport N=$n $algo: gradstream-perf printed no rows"; fail=1; }
  done
done
exit $fail
