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

times() { awk '!/^#/ && NF >= 6 { print $1, $6 }'; }

for coll in ${COLLS:-reduce alltoall sendrecv}; do
  for n in ${RANKS:-2 4}; do
    for t in shm tcp; do
      if [[ $t == shm ]]; then
        btl="self,vader"
        gs=$(GS_SHM=1 timeout "$limit" "$perf" --ranks "$n" --coll "$coll" "${sweep[@]}" | times)
      else
        btl="tcp,self --mca btl_tcp_if_include lo"
        gs=$(GS_SHM=0 GS_TRANSPORT=tcp timeout "$limit" "$perf" --ranks "$n" --coll "$coll" \
          "${sweep[@]}" | times)
      fi
      # shellcheck disable=SC2086
      theirs=$(timeout -k 10 "$limit" mpirun --allow-run-as-root --oversubscribe --bind-to none \
        -np "$n" --mca pml ob1 --mca btl $btl --mca oob_tcp_if_include lo "$mpi" --coll "$coll" \
        "${sweep[@]}" | times)
      echo "## $coll, N=$n, $t (time per call, us; ratio mpi/gs > 1: gradstream faster)"
      printf '| %10s | %12s | %12s | %7s |\n' "size(B)" "gradstream" "openmpi" "ratio"
      printf '| %10s | %12s | %12s | %7s |\n' "---" "---" "---" "---"
      join <(sort -k1,1 <<<"$gs") <(sort -k1,1 <<<"$theirs") | sort -n |
        awk '{ r = $2 > 0 ? $3 / $2 : 0; printf "| %10s | %12.1f | %12.1f | %7.2f |\n", $1, $2, $3, r }'
      echo
    done
  done
done
