#!/usr/bin/env bash
# Compressed allreduce where the network is the bottleneck: two ranks as hosts in network
# namespaces joined through a bridge, each uplink shaped with tbf to RATE, and on that same link
# in the same run the peers (Gloo ring and halving-doubling, float32) and gradstream-perf once
# per codec. Prints algbw per codec, the best peer's fp32 algbw and the ratio against the issue-4
# targets (bf16 >= 1.7x, int8 >= 3x). Root only (network namespaces); 198.19.1.0/24 inside its
# own namespaces. OpenMPI is left out: mpirun cannot place its ranks in other namespaces.
#
#   bench/codec_link.sh [--rates "1gbit 2500mbit 10gbit"] [--sizes "64M 256M"]
#                       [--codecs "raw bf16 int8 int4"] [-n ITERS] [-w WARMUP]
#   GS_PERF=path (default build/tools/gradstream-perf); peers from build/bench (build_peers.sh)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
rates="1gbit 2500mbit 10gbit"
sizes="64M 256M"
codecs="raw bf16 int8 int4"
iters=5 warmup=1 limit=300
perf=${GS_PERF:-$root/build/tools/gradstream-perf}
gloo=$root/build/bench/gloo_allreduce
while (($#)); do
  case $1 in
    --rates) rates=$2 ;;
    --sizes) sizes=$2 ;;
    --codecs) codecs=$2 ;;
    -n) iters=$2 ;;
    -w) warmup=$2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "codec_link.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2 || exit 2
done
[[ $(id -u) == 0 ]] || { echo "codec_link.sh: needs root (network namespaces)"; exit 77; }
[[ -x $perf ]] || { echo "codec_link.sh: no gradstream-perf at $perf" >&2; exit 1; }
[[ -x $gloo ]] || { echo "codec_link.sh: no $gloo (run bench/build_peers.sh)" >&2; exit 1; }
# shellcheck source=../tests/congestion/testbed.sh
source "$root/tests/congestion/testbed.sh"
out=$(mktemp -d)
trap 'tb_cleanup; rm -rf "$out"' EXIT
tb_setup 2 || { echo "codec_link.sh: cannot create namespaces" >&2; exit 1; }

to_bytes() { numfmt --from=iec "$1"; }
# algbw NAME SIZE: column 7 of that size's row in $out/NAME.0 ("-" when missing or wrong).
algbw() {
  awk -v s="$(to_bytes "$2")" '!/^#/ && $1 == s && NF >= 9 { print ($9 == "0" || $9 == "N/A") ? $7 : "-"; f = 1; exit }
    END { if (!f) print "-" }' "$out/$1.0" 2>/dev/null || echo "-"
}
# run NAME CMD...: both ranks, one per host, bounded; rank r's output in $out/NAME.r.
run() {
  local name=$1 r
  shift
  for r in 0 1; do
    tb_exec "$r" env RANK=$r WORLD_SIZE=2 "$@" >"$out/$name.$r" 2>&1 &
  done
  wait
}
size_flags() { local s=($sizes); echo "-b ${s[0]} -e ${s[-1]} -f 4"; }

echo "# codec_link.sh $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# 2 ranks in namespaces, tbf on each uplink, allreduce float32 sum in place, -n $iters -w $warmup"
for rate in $rates; do
  tb_shape 0 "$rate" && tb_shape 1 "$rate" || { echo "tc tbf failed for $rate" >&2; exit 1; }
  for algo in ring halving_doubling; do
    store=$(mktemp -d "$out/store.XXXX")
    # shellcheck disable=SC2046
    run "gloo_$algo" sh -c 'GLOO_BIND=198.19.1.$((RANK + 1)) exec "$0" "$@"' "$gloo" --algo "$algo" \
      --store "$store" --timeout-s "$limit" $(size_flags) -n "$iters" -w "$warmup" -c 1
  done
  for c in $codecs; do
    check=0
    [[ $c == raw ]] && check=1
    port=$((20000 + RANDOM % 20000))
    # shellcheck disable=SC2046
    run "gs_$c" MASTER_ADDR="$(tb_addr 0)" MASTER_PORT=$port GS_SECRET=bench GS_TRANSPORT=tcp GS_SHM=0 \
      GS_TIMEOUT_MS=60000 GS_CODEC="$c" timeout -k 5 "$limit" "$perf" $(size_flags) -n "$iters" \
      -w "$warmup" -c "$check" --inplace --timeout "$limit"
  done
  for s in $sizes; do
    best="-" best_name="-"
    for p in gloo_ring gloo_halving_doubling; do
      v=$(algbw "$p" "$s")
      if [[ $v != "-" ]] && { [[ $best == "-" ]] || awk -v a="$v" -v b="$best" 'BEGIN { exit !(a > b) }'; }; then
        best=$v best_name=$p
      fi
    done
    echo
    echo "## link $rate, $s: best peer $best_name $best GB/s algbw (fp32)"
    printf '%-10s %12s %10s %10s %6s\n' codec "algbw(GB/s)" vs_best target met
    for c in $codecs; do
      v=$(algbw "gs_$c" "$s") ratio="-" met="" tgt=""
      case $c in bf16) tgt=1.7 ;; int8) tgt=3.0 ;; esac
      if [[ $v != "-" && $best != "-" ]]; then
        ratio=$(awk -v a="$v" -v b="$best" 'BEGIN { printf "%.2f", a / b }')
        [[ -n $tgt ]] && met=$(awk -v r="$ratio" -v t="$tgt" 'BEGIN { print (r >= t) ? "yes" : "NO" }')
      fi
      printf '%-10s %12s %10s %10s %6s\n' "$c" "$v" "$ratio" "${tgt:+>=${tgt}x}" "$met"
    done
  done
  for f in "$out"/*.0 "$out"/*.1; do
    grep -qiE "error|fail" "$f" && { echo "--- $(basename "$f")"; tail -3 "$f"; }
  done
  rm -f "$out"/*.0 "$out"/*.1
done
