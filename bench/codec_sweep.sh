#!/usr/bin/env bash
# Codec sweep: gradstream-perf allreduce over TCP on 127.0.0.1 once per wire codec (GS_CODEC),
# next to the best peer (Gloo ring, Gloo halving-doubling, OpenMPI TCP; float32, run through
# bench/peers.sh) measured in the same run. Prints algbw per codec, the best peer's algbw and the
# ratio, against the targets of issue 4 (bf16 >= 1.7x, int8 >= 3x the best peer's fp32 algbw).
# See bench/README.md.
#
#   bench/codec_sweep.sh [options]
#     -b SIZE -e SIZE  size range (default 64M 256M)      -f FACTOR  size step (default 4)
#     -n N -w N        iterations / warm-up (default 10 / 3)
#     --ranks N        rank count (default 2)
#     --codecs "raw fp16 bf16 fp8e4m3 int8 int4 topk:0.01"   codecs to run (default these)
#     --peers "gloo_ring gloo_hd mpi_tcp"   peers to run (default all three; "" for none)
#     --results DIR    raw outputs (default build/bench/results/codec-<date>)
#     --build DIR      where the peer programs are built (default build/bench)
#     --timeout S      bound on each launch (default 300)
#   GS_PERF=path       gradstream-perf (default build/tools/gradstream-perf)
#
# gradstream-perf runs --inplace like the peers. Its -c 1 checks exact results, so lossy codecs
# run with -c 0 (only raw is checked). The peers always run float32 with -c 1.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

min=64M max=256M factor=4 iters=10 warmup=3 ranks=2
codecs="raw fp16 bf16 fp8e4m3 int8 int4 topk:0.01"
peers="gloo_ring gloo_hd mpi_tcp"
build=$root/build/bench
results=""
limit=300
gs_perf=${GS_PERF:-$root/build/tools/gradstream-perf}

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
while (($#)); do
  case $1 in
    -b) min=$2 ;;
    -e) max=$2 ;;
    -f) factor=$2 ;;
    -n) iters=$2 ;;
    -w) warmup=$2 ;;
    --ranks) ranks=$2 ;;
    --codecs) codecs=$2 ;;
    --peers) peers=$2 ;;
    --results) results=$2 ;;
    --build) build=$2 ;;
    --timeout) limit=$2 ;;
    -h|--help) usage 0 ;;
    *) echo "codec_sweep.sh: unknown option $1" >&2; usage ;;
  esac
  shift 2 || usage
done
results=${results:-$build/results/codec-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$results" || exit 1
[[ -x $gs_perf ]] || { echo "codec_sweep.sh: gradstream-perf not found at $gs_perf (set GS_PERF)" >&2; exit 1; }

load() { cut -d' ' -f1-3 /proc/loadavg; }
to_bytes() {
  awk -v s="$1" 'BEGIN { m = 1; u = toupper(substr(s, length(s)));
    if (u == "K") m = 2^10; else if (u == "M") m = 2^20; else if (u == "G") m = 2^30;
    if (m > 1) s = substr(s, 1, length(s) - 1); printf "%d\n", s * m }'
}
sizes=$(awk -v b="$(to_bytes "$min")" -v e="$(to_bytes "$max")" -v f="$factor" 'BEGIN {
  if (b < 4) b = 4; s = b - b % 4;
  while (s <= e) { print s; n = int(s * f); if (n == s) n = s + 4; s = n - n % 4 } }')
[[ -n $sizes ]] || { echo "codec_sweep.sh: empty size range" >&2; exit 2; }

summary=$results/summary.txt
{
  echo "# codec_sweep.sh $(date -Is) on $(hostname), $(nproc) cores, $(uname -r)"
  echo "# N=$ranks, tcp on 127.0.0.1, allreduce float32 sum in place, sizes ${sizes//$'\n'/ } B, -n $iters -w $warmup"
  echo "# load average at start: $(load)"
} | tee "$summary"
if awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v c="$(nproc)" 'BEGIN { exit !(l > c / 2) }'; then
  echo "codec_sweep.sh: warning: load average $(load) on $(nproc) cores; other work skews every column" >&2
fi
start=$SECONDS

# Peers (float32) through peers.sh, gradstream-perf left out of it (GS_PERF pointing nowhere).
if [[ -n ${peers// /} ]]; then
  echo "running peers: $peers (load $(load))" >&2
  GS_PERF=/nonexistent/gradstream-perf "$here/peers.sh" --ranks "$ranks" -b "$min" -e "$max" \
    -f "$factor" --big-from "$min" --big-n "$iters" --big-w "$warmup" --peers "$peers" \
    --results "$results/peers" --build "$build" --timeout "$limit" > "$results/peers.log" 2>&1
  grep -E '^  [a-z_]+ +N=' "$results/peers.log" >&2
fi

# gradstream-perf once per codec.
file_of() { echo "$results/N${ranks}_gs_${1//[^A-Za-z0-9.]/_}.txt"; }
for c in $codecs; do
  out=$(file_of "$c") check=0 t0=$SECONDS
  [[ $c == raw ]] && check=1
  echo "# codec_sweep.sh: GS_CODEC=$c N=$ranks -b $min -e $max -f $factor -n $iters -w $warmup -c $check; load $(load)" > "$out"
  GS_CODEC=$c GS_TRANSPORT=tcp GS_SHM=0 MASTER_ADDR=127.0.0.1 timeout -k 10 "$limit" "$gs_perf" \
    --ranks "$ranks" -b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c "$check" \
    --inplace --timeout "$limit" >> "$out" 2> "$out.err"
  rc=$?
  printf '  %-12s N=%d  %4ds  load %-16s %s\n' "$c" "$ranks" $((SECONDS - t0)) "$(load)" \
    "$( ((rc == 0)) && echo ok || echo "FAILED (rc $rc$( ((rc == 124)) && echo ": timed out"))")" >&2
  if [[ -s $out.err ]]; then sed 's/^/    /' "$out.err" | tail -5 >&2; else rm -f "$out.err"; fi
done

# algbw_of FILE SIZE: algbw (column 7) of that size's row, "!" appended when #wrong is neither 0
# nor N/A; "-" when there is none; "ovf" when the time column is inf (gradstream-perf reduces its
# timings with a float64 GS_MAX allreduce that goes through the communicator's codec: under
# GS_CODEC=fp16 a time above 65504 us overflows to inf; see bench/README.md).
algbw_of() {
  [[ -f $1 ]] || { echo "-"; return; }
  awk -v s="$2" '!/^#/ && $1 == s && NF >= 9 { v = $7; if ($6 == "inf") v = "ovf"; else if ($9 != "0" && $9 != "N/A" && $9 != "-") v = v "!"; print v; f = 1; exit }
    END { if (!f) print "-" }' "$1"
}
target_of() { case $1 in bf16) echo 1.7 ;; int8) echo 3.0 ;; *) echo "" ;; esac; }

for s in $sizes; do
  best="-" best_name="-"
  peer_cols=""
  for p in $peers; do
    v=$(algbw_of "$results/peers/N${ranks}_$p.txt" "$s")
    peer_cols+=" $p=$v"
    if [[ $v != "-" && $v != *"!" ]] && { [[ $best == "-" ]] || awk -v a="$v" -v b="$best" 'BEGIN { exit !(a > b) }'; }; then
      best=$v best_name=$p
    fi
  done
  {
    echo
    echo "## size $s B ($((s >> 20)) MiB), N=$ranks; best peer: $best_name $best GB/s algbw (fp32);$peer_cols"
    printf '%-12s %12s %12s %10s %8s\n' codec "algbw(GB/s)" "vs_best_peer" target met
    for c in $codecs; do
      v=$(algbw_of "$(file_of "$c")" "$s")
      ratio="-" tgt=$(target_of "$c") met=""
      if [[ $v != "-" && $v != "ovf" && $v != *"!" && $best != "-" ]]; then
        ratio=$(awk -v a="$v" -v b="$best" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
        [[ -n $tgt && $ratio != "-" ]] && met=$(awk -v r="$ratio" -v t="$tgt" 'BEGIN { print (r >= t) ? "yes" : "NO" }')
      fi
      printf '%-12s %12s %12s %10s %8s\n' "$c" "$v" "$ratio" "${tgt:+>= ${tgt}x}" "$met"
    done
  } | tee -a "$summary"
done
if grep -qs ' inf ' "$results"/N*_gs_*.txt; then
  echo "# ovf: the time overflowed in gradstream-perf's own lossy max-over-ranks reduction (a tool bug, not a measurement)" | tee -a "$summary"
fi
echo | tee -a "$summary"
echo "# total $((SECONDS - start)) s; load average at end: $(load); raw outputs in $results" | tee -a "$summary"
