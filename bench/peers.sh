#!/usr/bin/env bash
# Runs gradstream-perf and the peers on this machine in one go and prints per rank count a table
# of busbw and two ratios: gradstream over tcp (GS_SHM=0) / the best TCP peer (Gloo ring, Gloo
# halving-doubling, OpenMPI over TCP, all on 127.0.0.1), and gradstream over shared memory
# (GS_SHM=1, the default) / OpenMPI's shared-memory path (vader). Raw outputs go to a results
# directory. See bench/README.md.
#
#   bench/peers.sh [options]
#     -b SIZE        smallest size (default 1M)           -e SIZE   largest size (default 256M)
#     -f FACTOR      size step (default 4)                 --ranks "2 4"  rank counts (default "2 4")
#     -n N -w N      iterations / warm-up below --big-from (default 20 / 5)
#     --big-from SIZE  sizes from here on use --big-n / --big-w (default 64M; 10 / 3)
#     --peers "gloo_ring gloo_hd mpi_tcp mpi_shm"   which peers to run (default all four)
#     --gs "shm tcp" which gradstream runs (default both; "" for none)
#     --results DIR  where raw outputs go (default build/bench/results/<date>)
#     --build DIR    where the peer programs are built (default build/bench)
#     --timeout S    bound on each launch (default 300)
#   GS_PERF=path     gradstream-perf (default build/tools/gradstream-perf); GS_PERF_ARGS=extra flags
#                    (gradstream-perf runs --inplace, like the peers, so memory compares fairly)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
source "$root/bench/ranks.sh"

min=1M max=256M factor=4 iters=20 warmup=5
big_from=64M big_iters=10 big_warmup=3
ranks="2 4"
peers="gloo_ring gloo_hd mpi_tcp mpi_shm"
gs_runs="shm tcp"
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
    --big-from) big_from=$2 ;;
    --big-n) big_iters=$2 ;;
    --big-w) big_warmup=$2 ;;
    --ranks) ranks=$2 ;;
    --peers) peers=$2 ;;
    --gs) gs_runs=$2 ;;
    --results) results=$2 ;;
    --build) build=$2 ;;
    --timeout) limit=$2 ;;
    -h|--help) usage 0 ;;
    *) echo "peers.sh: unknown option $1" >&2; usage ;;
  esac
  shift 2 || usage
done
results=${results:-$build/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$results" || exit 1

"$here/build_peers.sh" "$build" || echo "peers.sh: some peers failed to build; running the rest" >&2

# to_bytes SIZE: K/M/G suffixes (binary), as the programs take them.
to_bytes() {
  awk -v s="$1" 'BEGIN { m = 1; u = toupper(substr(s, length(s)));
    if (u == "K") m = 2^10; else if (u == "M") m = 2^20; else if (u == "G") m = 2^30;
    if (m > 1) s = substr(s, 1, length(s) - 1); printf "%d\n", s * m }'
}
# The sweep, as bench_common.h's bench_next_size computes it.
sizes=$(awk -v b="$(to_bytes "$min")" -v e="$(to_bytes "$max")" -v f="$factor" 'BEGIN {
  if (b < 4) b = 4; s = b - b % 4;
  while (s <= e) { print s; n = int(s * f); if (n == s) n = s + 4; s = n - n % 4 } }')
big_bytes=$(to_bytes "$big_from")
small_sizes=() big_sizes=()
for s in $sizes; do
  if ((s < big_bytes)); then small_sizes+=("$s"); else big_sizes+=("$s"); fi
done
# Each program runs once per part: "-b first -e last -n .. -w .." flags for each non-empty part.
parts=()
((${#small_sizes[@]})) && parts+=("-b ${small_sizes[0]} -e ${small_sizes[-1]} -f $factor -n $iters -w $warmup")
((${#big_sizes[@]})) && parts+=("-b ${big_sizes[0]} -e ${big_sizes[-1]} -f $factor -n $big_iters -w $big_warmup")
((${#parts[@]})) || { echo "peers.sh: empty size range" >&2; exit 2; }

# run_gloo N ALGO FLAGS...: N processes on a FileStore rendezvous; rank 0's table on stdout.
# Each process is bounded by timeout and Gloo's own context timeout; when one rank fails the
# others are ended (by their pids) instead of waiting for their timeouts.
run_gloo() {
  local n=$1 algo=$2 store pids=() rc=0 r
  shift 2
  store=$(mktemp -d "$results/gloo_store.XXXXXX") || return 1
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n timeout -k 5 "$limit" "$build/gloo_allreduce" --algo "$algo" \
      --store "$store" --timeout-s "$limit" "$@" > "$store.rank$r.out" 2>&1 &
    pids+=($!)
  done
  wait_ranks "${pids[@]}" || rc=$?
  cat "$store.rank0.out"
  for ((r = 1; r < n; r++)); do cat "$store.rank$r.out" >&2; done
  rm -rf "$store" "$store".rank*.out
  return $rc
}

run_mpi_tcp() {
  local n=$1
  shift
  timeout -k 10 "$limit" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    "$build/mpi_allreduce" "$@"
}

# OpenMPI's shared-memory BTL (vader, what it uses between processes of one host by default),
# named explicitly so a missing component fails instead of silently measuring something else.
run_mpi_shm() {
  local n=$1
  shift
  timeout -k 10 "$limit" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" \
    --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo "$build/mpi_allreduce" "$@"
}

# run_gs shm|tcp N FLAGS...: gradstream-perf over shared memory (GS_SHM=1: every rank is on this
# host) or over tcp on 127.0.0.1 (GS_SHM=0). Its "# transport:" line says what it really used.
run_gs() {
  local shm=$1 n=$2
  shift 2
  [[ $shm == shm ]] && shm=1 || shm=0
  # shellcheck disable=SC2086  # GS_PERF_ARGS is a list of flags
  GS_SHM=$shm MASTER_ADDR=127.0.0.1 timeout -k 10 "$limit" "$gs_perf" --ranks "$n" "$@" -c 1 \
    --inplace ${GS_PERF_ARGS:-}
}

# run_one NAME N: every part of the sweep; raw output in $results/N<n>_<name>.txt.
run_one() {
  local name=$1 n=$2 out=$results/N$2_$1.txt part t0 rc=0
  : > "$out"
  t0=$SECONDS
  for part in "${parts[@]}"; do
    echo "# peers.sh: $name N=$n $part" >> "$out"
    # shellcheck disable=SC2086  # part is a list of flags
    case $name in
      gradstream_shm) run_gs shm "$n" $part ;;
      gradstream_tcp) run_gs tcp "$n" $part ;;
      gloo_ring) run_gloo "$n" ring $part ;;
      gloo_hd) run_gloo "$n" halving_doubling $part ;;
      mpi_tcp) run_mpi_tcp "$n" $part ;;
      mpi_shm) run_mpi_shm "$n" $part ;;
    esac >> "$out" 2>> "$out.err" || rc=$?
  done
  [[ -s $out.err ]] && sed 's/^/    /' "$out.err" >&2
  printf '  %-12s N=%d  %4ds  load %-5s %s\n' "$name" "$n" $((SECONDS - t0)) "$(load1)" \
    "$( ((rc == 0)) && echo ok || echo "FAILED (rc $rc$( ((rc == 124)) && echo ": timed out"))")" >&2
  [[ -s $out.err ]] || rm -f "$out.err"
}

load1() { cut -d' ' -f1 /proc/loadavg; }

# busbw_of FILE SIZE: busbw column of that size's row, with "!" when #wrong is not 0; "-" if none.
busbw_of() {
  [[ -f $1 ]] || { echo "-"; return; }
  awk -v s="$2" '!/^#/ && $1 == s && NF >= 9 { v = $8; if ($9 != "0" && $9 != "N/A") v = v "!"; print v; f = 1; exit }
    END { if (!f) print "-" }' "$1"
}

# transport_of FILE: what gradstream-perf's first "# transport:" line says ("-" if none).
transport_of() {
  awk '/^# transport: / { print $3; f = 1; exit } END { if (!f) print "-" }' "$1" 2> /dev/null || echo "-"
}
# ratio A B: A / B to 2 decimals, "-" when either is missing or flagged.
ratio() {
  if [[ $1 == "-" || $1 == *"!" || $2 == "-" || $2 == *"!" ]]; then echo "-"; return; fi
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print "-" }'
}

gs_names=()
for g in $gs_runs; do
  case $g in
    shm | tcp) gs_names+=("gradstream_$g") ;;
    *) echo "peers.sh: --gs takes shm and/or tcp, not $g" >&2; exit 2 ;;
  esac
done
if [[ ! -x $gs_perf ]] && ((${#gs_names[@]})); then
  gs_names=()
  echo "peers.sh: gradstream-perf not found at $gs_perf (set GS_PERF); running the peers only" >&2
fi

summary=$results/summary.txt
{
  echo "# peers.sh $(date -Is) on $(hostname), $(nproc) cores, $(uname -r)"
  echo "# sizes: ${sizes//$'\n'/ } B; -n $iters -w $warmup below $big_from, -n $big_iters -w $big_warmup from it"
  echo "# busbw in GB/s (GB = 1e9 B); '!' = the program reported wrong elements; '-' = no result"
  echo "# best_tcp = best busbw of the TCP peers run; tcp_ratio = gradstream_tcp / best_tcp"
  echo "# shm_ratio = gradstream_shm / mpi_shm (target: >= 1.0 at 1-256 MiB, N = 2 and 4)"
  echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$summary"
if awk -v l="$(load1)" -v c="$(nproc)" 'BEGIN { exit !(l > c / 2) }'; then
  echo "peers.sh: warning: load average $(load1) on $(nproc) cores; other work skews every column" >&2
fi

start=$SECONDS
for n in $ranks; do
  echo "running N=$n" >&2
  for g in "${gs_names[@]}"; do run_one "$g" "$n"; done
  for p in $peers; do run_one "$p" "$n"; done

  {
    echo
    echo "## N=$n"
    shm_note=""
    if [[ " ${gs_names[*]} " == *" gradstream_shm "* ]]; then
      t=$(transport_of "$results/N${n}_gradstream_shm.txt")
      if [[ $t != shm ]]; then
        shm_note="# gradstream_shm ran over '$t', not shared memory (shm transport unavailable?): no shm_ratio"
        echo "$shm_note"
      fi
    fi
    printf '%12s' "size(B)"
    for g in "${gs_names[@]}"; do printf ' %15s' "$g"; done
    for p in $peers; do printf ' %10s' "$p"; done
    printf ' %13s %8s %9s %9s\n' best_tcp_peer best_tcp tcp_ratio shm_ratio
    for s in $sizes; do
      printf '%12s' "$s"
      for g in "${gs_names[@]}"; do printf ' %15s' "$(busbw_of "$results/N${n}_$g.txt" "$s")"; done
      best="-" best_name="-"
      for p in $peers; do
        v=$(busbw_of "$results/N${n}_$p.txt" "$s")
        printf ' %10s' "$v"
        [[ $p == mpi_shm ]] && continue
        if [[ $v != "-" && $v != *"!" ]] && { [[ $best == "-" ]] || awk -v a="$v" -v b="$best" 'BEGIN { exit !(a > b) }'; }; then
          best=$v best_name=$p
        fi
      done
      tcp_ratio=$(ratio "$(busbw_of "$results/N${n}_gradstream_tcp.txt" "$s")" "$best")
      shm_ratio="-"
      [[ -z $shm_note ]] &&
        shm_ratio=$(ratio "$(busbw_of "$results/N${n}_gradstream_shm.txt" "$s")" "$(busbw_of "$results/N${n}_mpi_shm.txt" "$s")")
      printf ' %13s %8s %9s %9s\n' "$best_name" "$best" "$tcp_ratio" "$shm_ratio"
    done
    for p in "${gs_names[@]}" $peers; do
      rss=$(awk '/^# peak_rss_kb/ { if ($3 > m) m = $3 } END { if (m) print m }' "$results/N${n}_$p.txt" 2> /dev/null)
      [[ -n $rss ]] && printf '# peak_rss_kb %-15s %s\n' "$p" "$rss"
    done
  } | tee -a "$summary"
done
echo | tee -a "$summary"
echo "# total $((SECONDS - start)) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg); raw outputs in $results" |
  tee -a "$summary"
