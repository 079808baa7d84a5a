#!/usr/bin/env bash
# dist.all_reduce through torch.distributed on this machine: backend "gradstream" (over shared
# memory, GS_SHM=1, and over tcp, GS_SHM=0) against backend "gloo" (tcp), N processes on
# 127.0.0.1, back to back in one run. Per rank count prints busbw per size and the ratios
# gradstream / gloo, then the per-call latency of an 8 B all_reduce. Raw outputs go to a
# results directory. See bench/README.md ("torch.distributed").
#
#   bench/torch_peers.sh [options]
#     -b SIZE        smallest size (default 1M)           -e SIZE   largest size (default 256M)
#     -f FACTOR      size step (default 4)                 --ranks "2 4"  rank counts (default "2 4")
#     -n N -w N      iterations / warm-up below --big-from (default 20 / 5)
#     --big-from SIZE  sizes from here on use --big-n / --big-w (default 64M; 8 / 2)
#     --lat-n N      8 B calls timed per run (default 2000; 0: none)
#     --gs "shm tcp" which gradstream runs (default both; "" for gloo only)
#     --no-gloo      gradstream only
#     -c 0|1         check every element of every timed iteration (default 1)
#     --results DIR  where raw outputs go (default build/bench/results/torch-<date>)
#     --timeout S    bound on each launch (default 300)
#   PYTHON=interpreter (default: python3's real executable); PYTHONPATH gets $root/build/python
#   in front (GS_PYTHONPATH=dir to use another build's package)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
source "$root/bench/ranks.sh"

min=1M max=256M factor=4 iters=20 warmup=5
big_from=64M big_iters=8 big_warmup=2
lat_n=2000 check=1
ranks="2 4"
gs_runs="shm tcp"
gloo=1
results=""
limit=300

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
while (($#)); do
  case $1 in
    -b) min=$2 ;;
    -e) max=$2 ;;
    -f) factor=$2 ;;
    -n) iters=$2 ;;
    -w) warmup=$2 ;;
    -c) check=$2 ;;
    --big-from) big_from=$2 ;;
    --big-n) big_iters=$2 ;;
    --big-w) big_warmup=$2 ;;
    --lat-n) lat_n=$2 ;;
    --ranks) ranks=$2 ;;
    --gs) gs_runs=$2 ;;
    --no-gloo) gloo=0; shift; continue ;;
    --results) results=$2 ;;
    --timeout) limit=$2 ;;
    -h|--help) usage 0 ;;
    *) echo "torch_peers.sh: unknown option $1" >&2; usage ;;
  esac
  shift 2 || usage
done
results=${results:-$root/build/bench/results/torch-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$results" || exit 1

py=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')} || exit 1
export PYTHONPATH=${GS_PYTHONPATH:-$root/build/python}${PYTHONPATH:+:$PYTHONPATH}
bench=$here/torch_allreduce.py

names=()
((gloo)) && names+=(gloo)
for g in $gs_runs; do
  case $g in
    shm | tcp) names+=("gs_$g") ;;
    *) echo "torch_peers.sh: --gs takes shm and/or tcp, not $g" >&2; exit 2 ;;
  esac
done
if [[ " ${names[*]} " == *" gs_"* ]] && ! timeout 60 "$py" -c 'import gradstream.torch' 2> "$results/import.err"; then
  echo "torch_peers.sh: 'import gradstream.torch' fails (PYTHONPATH=$PYTHONPATH); gloo only:" >&2
  sed 's/^/    /' "$results/import.err" | tail -5 >&2
  names=(gloo)
fi
rm -f "$results/import.err"

free_port() {
  "$py" -c 'import socket
for _ in range(50):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p + 1)); t.close(); print(p); break
    except OSError:
        t.close()'
}
load1() { cut -d' ' -f1 /proc/loadavg; }

# launch NAME N OUT: N ranks of torch_allreduce.py, each bounded by timeout; rank 0's output in
# OUT, the others' in OUT.rank<r>. When one rank fails the others are ended by their pids.
launch() {
  local name=$1 n=$2 o=$3 port pids=() rc=0 r backend=gloo
  local env=(MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo WORLD_SIZE="$n")
  case $name in
    gs_shm) backend=gradstream env+=(GS_SHM=1) ;;
    gs_tcp) backend=gradstream env+=(GS_SHM=0) ;;
  esac
  port=$(free_port) || return 1
  env+=(MASTER_PORT="$port" GS_SECRET="torch-peers-$port" GS_TIMEOUT_MS=$((limit * 1000)))
  for ((r = 0; r < n; r++)); do
    env "${env[@]}" RANK=$r timeout -k 5 "$limit" "$py" "$bench" --backend "$backend" \
      -b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" --big-from "$big_from" \
      --big-n "$big_iters" --big-w "$big_warmup" --lat-n "$lat_n" -c "$check" --timeout "$limit" \
      > "$o$( ((r)) && echo ".rank$r")" 2>&1 &
    pids+=($!)
  done
  wait_ranks "${pids[@]}" || rc=$?
  return $rc
}

run_one() {
  local name=$1 n=$2 o=$results/N$2_$1.txt t0=$SECONDS rc=0 f
  launch "$name" "$n" "$o" || rc=$?
  printf '  %-7s N=%d  %4ds  load %-5s %s\n' "$name" "$n" $((SECONDS - t0)) "$(load1)" \
    "$( ((rc == 0)) && echo ok || echo "FAILED (rc $rc$( ((rc == 124)) && echo ": timed out"))")" >&2
  if ((rc)); then
    for f in "$o" "$o".rank*; do
      [[ -f $f ]] && grep -v '^ *[0-9]\|^#' "$f" | tail -4 | sed "s|^|    $(basename "$f"): |" >&2
    done
  fi
}

# busbw_of FILE SIZE: busbw column of that size's row, "!" appended when #wrong is not 0.
busbw_of() {
  [[ -f $1 ]] || { echo "-"; return; }
  awk -v s="$2" '!/^#/ && $1 == s && NF >= 9 { v = $8; if ($9 != "0" && $9 != "N/A") v = v "!"; print v; f = 1; exit }
    END { if (!f) print "-" }' "$1"
}
# lat_of FILE med|loop: the 8 B latency in us.
lat_of() {
  awk -v k="$2" '/^# latency8 / { for (i = 3; i < NF; i++) if ($i == k "_us") { print $(i + 1); f = 1; exit } }
    END { if (!f) print "-" }' "$1" 2> /dev/null || echo "-"
}
transport_of() {
  awk '/^# transport: / { print $3; f = 1; exit } END { if (!f) print "-" }' "$1" 2> /dev/null || echo "-"
}
# ratio A B: A / B to 2 decimals, "-" when either is missing or flagged.
ratio() {
  if [[ $1 == "-" || $1 == *"!" || $2 == "-" || $2 == *"!" ]]; then echo "-"; return; fi
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print "-" }'
}

sizes=$(awk -v b="$min" -v e="$max" -v f="$factor" 'function tb(s,  m, u) { m = 1; u = toupper(substr(s, length(s)));
    if (u == "K") m = 2^10; else if (u == "M") m = 2^20; else if (u == "G") m = 2^30;
    if (m > 1) s = substr(s, 1, length(s) - 1); return int(s * m) }
  BEGIN { b = tb(b); e = tb(e); if (b < 4) b = 4; s = b - b % 4;
    while (s <= e && k++ < 64) { print s; n = int(s * f); if (n == s) n = s + 4; s = n - n % 4 } }')

summary=$results/summary.txt
{
  echo "# torch_peers.sh $(date -Is) on $(hostname), $(nproc) cores, $(uname -r), $("$py" -c 'import torch; print("torch", torch.__version__)' 2>&1)"
  echo "# dist.all_reduce float32 sum, in place; -n $iters -w $warmup below $big_from, -n $big_iters -w $big_warmup from it; check $check"
  echo "# busbw in GB/s (1e9 B/s), median over iterations of the slowest rank; '!' = wrong elements; '-' = no result"
  echo "# gloo: backend gloo over tcp on 127.0.0.1; gs_shm: backend gradstream, GS_SHM=1 (shared memory); gs_tcp: GS_SHM=0 (tcp on 127.0.0.1)"
  echo "# x/gloo = gradstream busbw / gloo busbw (> 1: gradstream faster)"
  echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$summary"
if awk -v l="$(load1)" -v c="$(nproc)" 'BEGIN { exit !(l > c / 2) }'; then
  echo "torch_peers.sh: warning: load average $(load1) on $(nproc) cores; other work skews every column" >&2
fi

start=$SECONDS
for n in $ranks; do
  echo "running N=$n" >&2
  for name in "${names[@]}"; do run_one "$name" "$n"; done
  {
    echo
    echo "## N=$n"
    for name in "${names[@]}"; do
      [[ $name == gs_* ]] && echo "# $name transport: $(transport_of "$results/N${n}_$name.txt")"
    done
    printf '%12s' "size(B)"
    for name in "${names[@]}"; do
      printf ' %8s' "$name"
      [[ $name == gs_* && " ${names[*]} " == *" gloo "* ]] && printf ' %11s' "${name#gs_}/gloo"
    done
    echo
    for s in $sizes; do
      printf '%12s' "$s"
      g=$(busbw_of "$results/N${n}_gloo.txt" "$s")
      for name in "${names[@]}"; do
        v=$(busbw_of "$results/N${n}_$name.txt" "$s")
        printf ' %8s' "$v"
        [[ $name == gs_* && " ${names[*]} " == *" gloo "* ]] && printf ' %11s' "$(ratio "$v" "$g")"
      done
      echo
    done
    for name in "${names[@]}"; do
      rss=$(awk '/^# peak_rss_kb/ { print $3 }' "$results/N${n}_$name.txt" 2> /dev/null)
      [[ -n $rss ]] && printf '# peak_rss_kb %-7s %s\n' "$name" "$rss"
    done
  } | tee -a "$summary"
done

if ((lat_n > 0)); then
  {
    echo
    echo "## 8 B all_reduce (2 x float32), $lat_n calls: us per call"
    echo "# med: median after a barrier each, slowest rank; loop: back-to-back calls, mean, slowest rank"
    echo "# gloo/x = gloo time / gradstream time (> 1: gradstream faster)"
    printf '%3s' N
    for name in "${names[@]}"; do
      printf ' %13s %13s' "${name}_med" "${name}_loop"
      [[ $name == gs_* && " ${names[*]} " == *" gloo "* ]] && printf ' %12s %12s' "gloo/${name#gs_}_med" "gloo/${name#gs_}_loop"
    done
    echo
    for n in $ranks; do
      printf '%3s' "$n"
      gm=$(lat_of "$results/N${n}_gloo.txt" med) gl=$(lat_of "$results/N${n}_gloo.txt" loop)
      for name in "${names[@]}"; do
        m=$(lat_of "$results/N${n}_$name.txt" med) l=$(lat_of "$results/N${n}_$name.txt" loop)
        printf ' %13s %13s' "$m" "$l"
        [[ $name == gs_* && " ${names[*]} " == *" gloo "* ]] && printf ' %12s %12s' "$(ratio "$gm" "$m")" "$(ratio "$gl" "$l")"
      done
      echo
    done
  } | tee -a "$summary"
fi
echo | tee -a "$summary"
echo "# total $((SECONDS - start)) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg); raw outputs in $results" |
  tee -a "$summary"
