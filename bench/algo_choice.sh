#!/usr/bin/env bash
# Is the cost model's `auto` as fast as the fastest allreduce schedule? For each rank count and
# size, runs gradstream-perf with every fixed GS_ALGO and with auto, in rounds (each round runs
# every variant once, in a rotated order, so drift on a shared machine hits all alike), and
# prints per cell the median time of each variant, auto's choice, and auto's time over the
# fastest fixed schedule's. Cells where auto is more than 10 % slower are marked "MISS".
# "model" is auto with GS_ALGO_TUNE=off (the cost model alone), run in the same rounds so the
# measured choice (GS_ALGO_TUNE's default) and the model's are compared on the same machine
# state; on hosts where ranks do not outnumber cores the two are the same thing. "chosen/best"
# is the fixed runs' median of the schedule auto ran most often over the fastest's: the choice
# alone, without the spread of auto's own runs (on a noisy host a right choice can still show
# as a MISS in auto/best, and the other way round).
#
#   bench/algo_choice.sh [--ranks "2 3 4"] [--sizes "8 64K 1M 4M 16M 64M"] [--rounds 3]
#                        [--transport shm|tcp] [--results DIR]
#   GS_PERF=path   gradstream-perf (default build/tools/gradstream-perf)
# Iterations per run scale with the size (2000 at 8 B down to 5 at 64 MiB), bounded in time by
# a 120 s timeout per run. Exit status 0 unless a run fails; misses are reported, not judged
# (one host with 2 cores is too noisy for a pass/fail on 10 %).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
perf=${GS_PERF:-$root/build/tools/gradstream-perf}
ranks="2 3 4"
sizes="8 64K 1M 4M 16M 64M"
rounds=3
transport=shm
results=""
while (($#)); do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    *) echo "algo_choice.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ $transport == shm || $transport == tcp ]] ||
  { echo "algo_choice.sh: --transport is shm or tcp, not '$transport'" >&2; exit 2; }
[[ -x $perf ]] || { echo "algo_choice.sh: no gradstream-perf at $perf (build first)" >&2; exit 2; }
results=${results:-$root/build/bench/results/algo_choice-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$results"
shm=1
[[ $transport == tcp ]] && shm=0
algos=(ring tree halving_doubling recursive_doubling auto model)

bytes_of() {  # 64K -> 65536
  local s=$1
  case $s in
    *K) echo $((${s%K} << 10)) ;;
    *M) echo $((${s%M} << 20)) ;;
    *G) echo $((${s%G} << 30)) ;;
    *) echo "$s" ;;
  esac
}
iters_of() {  # about the same time per run at every size
  local b=$1
  if ((b <= 65536)); then echo 2000
  elif ((b <= 1 << 20)); then echo 200
  elif ((b <= 4 << 20)); then echo 60
  elif ((b <= 16 << 20)); then echo 20
  else echo 5
  fi
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# algo_choice: transport $transport, ranks '$ranks', sizes '$sizes', $rounds rounds"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg); raw outputs in $results"
printf '%3s %10s' N size
printf ' %12s' "${algos[@]}"
printf ' %20s %12s %8s %11s %11s\n' "auto chose" fastest "auto/best" "model/best" "chosen/best"
misses=0
model_misses=0
choice_misses=0
for n in $ranks; do
  for size in $sizes; do
    b=$(bytes_of "$size")
    iters=$(iters_of "$b")
    for ((r = 0; r < rounds; ++r)); do
      for ((k = 0; k < ${#algos[@]}; ++k)); do
        algo=${algos[$(((k + r) % ${#algos[@]}))]}
        out="$results/N${n}_${size}_${algo}_r$r.txt"
        tune=crowded
        [[ $algo == model ]] && tune=off
        if ! GS_SHM=$shm GS_ALGO=${algo/model/auto} GS_ALGO_TUNE=$tune timeout -k 5 120 "$perf" --ranks "$n" -b "$b" -e "$b" \
          -n "$iters" -w $((iters / 10 + 1)) --inplace >"$out" 2>&1; then
          echo "algo_choice.sh: N=$n $size GS_ALGO=$algo failed (see $out)" >&2
          exit 1
        fi
      done
    done
    printf '%3s %10s' "$n" "$size"
    declare -A med=()
    for algo in "${algos[@]}"; do
      med[$algo]=$(cat "$results"/N"${n}"_"${size}"_"${algo}"_r*.txt |
        awk '/^ +[0-9]/ && NF >= 10 { print $6 }' | median)
      printf ' %12s' "${med[$algo]}"
    done
    chose=$(awk '/^ +[0-9]/ && NF >= 10 { print $NF }' "$results"/N"${n}"_"${size}"_auto_r*.txt |
      sort | uniq -c | sort -rn | awk 'NR == 1 { print $2 }')
    best=""
    for algo in ring tree halving_doubling recursive_doubling; do
      if [[ -z $best ]] || awk -v a="${med[$algo]}" -v b="${med[$best]}" 'BEGIN { exit !(a < b) }'; then
        best=$algo
      fi
    done
    ratio=$(awk -v a="${med[auto]}" -v b="${med[$best]}" 'BEGIN { printf "%.2f", a / b }')
    model=$(awk -v a="${med[model]}" -v b="${med[$best]}" 'BEGIN { printf "%.2f", a / b }')
    mark=""
    if awk -v r="$ratio" 'BEGIN { exit !(r > 1.10) }'; then
      mark=" MISS"
      misses=$((misses + 1))
    fi
    if awk -v r="$model" 'BEGIN { exit !(r > 1.10) }'; then
      model_misses=$((model_misses + 1))
    fi
    chosen="-"  # auto ran something no fixed GS_ALGO runs (the small-call mailboxes)
    if [[ -n ${med[$chose]:-} ]]; then
      chosen=$(awk -v a="${med[$chose]}" -v b="${med[$best]}" 'BEGIN { printf "%.2f", a / b }')
      if awk -v r="$chosen" 'BEGIN { exit !(r > 1.10) }'; then
        choice_misses=$((choice_misses + 1))
      fi
    fi
    printf ' %20s %12s %8s %11s %11s%s\n' "$chose" "$best" "$ratio" "$model" "$chosen" "$mark"
    unset med
  done
done
echo "# times are median us per allreduce over $rounds runs; $misses cell(s) with auto > 1.10x the fastest, $model_misses with model > 1.10x, $choice_misses where auto's schedule is > 1.10x the fastest in the fixed runs"
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
