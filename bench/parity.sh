#!/usr/bin/env bash
# gradstream's reduce, all-to-all and point-to-point against OpenMPI's MPI_Reduce, MPI_Alltoall
# and MPI_Sendrecv (each rank to the next, from the previous: nccl-tests' sendrecv), and with
# COLLS=send one-way messages (MPI_Send / MPI_Recv, even rank to the next), measured in
# the same run on this host: median time per call (slowest rank), over shared memory (gradstream
# GS_SHM=1 vs OpenMPI's vader BTL) and over tcp on 127.0.0.1 (GS_SHM=0 vs the tcp BTL).
# Prints one table per collective and rank count: size, both times, mpi/gs (> 1: gradstream is
# faster). Sizes as gradstream-perf counts them (alltoall: the whole send buffer).
#   bench/parity.sh                      # N = 2 and 4, 8 B .. 64 MiB, x8 steps (~5 min)
#   RANKS="2" MAX=4M bench/parity.sh     # a quicker subset
#   COLLS=sendrecv bench/parity.sh       # one collective
#   ROUNDS=5 COLLS=send bench/parity.sh  # both sides 5 times, alternately
# ROUNDS > 1 runs gradstream and OpenMPI alternately that many times per table: this machine
# runs whole runs of either at half or double speed in phases of seconds, so one run each can
# show either side ahead. The cells are then medians over rounds, and "ratios" the range of the
# rounds' own ratios (each from a gradstream run and the OpenMPI run right after it).
# Needs bench/build_peers.sh (mpi_allreduce) and a build of gradstream-perf.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GS_BUILD_DIR:-$root/build}
perf=$build/tools/gradstream-perf
mpi=$build/bench/mpi_allreduce
[[ -x $perf ]] || { echo "parity.sh: $perf missing (build first)" >&2; exit 1; }
# Rebuilds the peer only when its sources changed (a missing Gloo is not this script's concern).
"$root/bench/build_peers.sh" "$build/bench" >&2 || [[ -x $mpi ]]
# Warm-up: 8 calls, so that every receive slot (GS_SLOTS_PER_PEER = 8) has been written once
# before the timing: the first write into each slot page faults (2 ranks, 256 KiB reduce over shm:
# the first 5-7 calls took 150-220 us, then 24; with -w 2 the median was 414-497 us).
sweep=(-b "${MIN:-8}" -e "${MAX:-64M}" -f "${FACTOR:-8}" -n "${ITERS:-10}" -w "${WARMUP:-8}")
limit=${LIMIT:-300}
rounds=${ROUNDS:-1}

times() { awk '!/^#/ && NF >= 6 { print $1, $6 }'; }

# Rows "size gradstream-us openmpi-us" from all rounds -> one table row per size: the medians,
# their ratio, and (several rounds) the lowest and highest of the rounds' ratios.
table() {
  sort -k1,1n -s | awk -v rounds="$rounds" '
    function median(list,   n, v, i, j, t) {
      n = split(list, v, " ")
      for (i = 2; i <= n; i++)
        for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
      return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    function flush() {
      if (size == "") return
      g = median(gs); m = median(mpi); r = g > 0 ? m / g : 0
      if (rounds > 1) printf "| %10s | %12.1f | %12.1f | %7.2f | %5.2f-%-5.2f |\n", size, g, m, r, lo, hi
      else printf "| %10s | %12.1f | %12.1f | %7.2f |\n", size, g, m, r
    }
    $1 != size { flush(); size = $1; gs = ""; mpi = ""; lo = 1e9; hi = 0 }
    { gs = gs " " $2; mpi = mpi " " $3; q = $2 > 0 ? $3 / $2 : 0; if (q < lo) lo = q; if (q > hi) hi = q }
    END { flush() }'
}

for coll in ${COLLS:-reduce alltoall sendrecv}; do
  for n in ${RANKS:-2 4}; do
    for t in shm tcp; do
      if [[ $t == shm ]]; then
        btl="self,vader"
        gsenv=(GS_SHM=1)
      else
        btl="tcp,self --mca btl_tcp_if_include lo"
        gsenv=(GS_SHM=0 GS_TRANSPORT=tcp)
      fi
      rows=""
      for ((round = 0; round < rounds; round++)); do
        gs=$(env "${gsenv[@]}" timeout "$limit" "$perf" --ranks "$n" --coll "$coll" \
          "${sweep[@]}" | times)
        # shellcheck disable=SC2086
        theirs=$(timeout -k 10 "$limit" mpirun --allow-run-as-root --oversubscribe --bind-to none \
          -np "$n" --mca pml ob1 --mca btl $btl --mca oob_tcp_if_include lo "$mpi" --coll "$coll" \
          "${sweep[@]}" | times)
        rows+=$(join <(sort -k1,1 <<<"$gs") <(sort -k1,1 <<<"$theirs"))$'\n'
      done
      echo "## $coll, N=$n, $t (time per call, us; ratio mpi/gs > 1: gradstream faster)"
      if ((rounds > 1)); then
        echo "(medians of $rounds alternate rounds; ratios: lowest-highest of the rounds')"
        printf '| %10s | %12s | %12s | %7s | %11s |\n' "size(B)" "gradstream" "openmpi" "ratio" \
          "ratios"
        printf '| %10s | %12s | %12s | %7s | %11s |\n' "---" "---" "---" "---" "---"
      else
        printf '| %10s | %12s | %12s | %7s |\n' "size(B)" "gradstream" "openmpi" "ratio"
        printf '| %10s | %12s | %12s | %7s |\n' "---" "---" "---" "---"
      fi
      grep -v '^$' <<<"$rows" | table
      echo
    done
  done
done
