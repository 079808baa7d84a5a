#!/usr/bin/env bash
# Soak: SECONDS (default 600) of random collectives on 4 ranks of this host (127.0.0.1 and
# shared memory only): allreduce, reduce_scatter, allgather, broadcast (random root) and
# gradient streams, 1 B..64 MiB, every dtype and op, blocking and non-blocking, in place or
# not, communicators created and destroyed with other codecs, algorithms and transports. Every
# result is checked (exactly, or within the codec's bound and bit-identical on every rank), and
# RSS, open fds and threads of every rank are sampled every 10 s. Not in CI. See
# bench/README.md ("Soak").
#
#   bench/soak.sh [SECONDS]
#
# Environment: SOAK_SEED (default: from the clock; printed, and with it every failure's epoch and
# iteration reproduces), SOAK_RANKS (4), SOAK_WARMUP (seconds excluded from the growth check;
# default min(60, SECONDS/4)), SOAK_INTERVAL (10), SOAK_RESULTS (default
# build/bench/results/soak-<date>), SOAK_REPLAY=EPOCH:FIRST:LAST (only those iterations, on
# communicator EPOCH's options), GS_PYTHONPATH (another build's package; default build/python),
# PYTHON. GS_* variables reach the ranks and win over the options the soak draws (GS_CODEC is
# then what results are checked against).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
case ${1:-} in -h | --help) usage 0 ;; esac
duration=${1:-600}
[[ $duration =~ ^[0-9]+$ ]] || usage
ranks=${SOAK_RANKS:-4}
seed=${SOAK_SEED:-$(($(date +%s%N) % 1000000007))}
interval=${SOAK_INTERVAL:-10}
results=${SOAK_RESULTS:-$root/build/bench/results/soak-$(date +%Y%m%d-%H%M%S)}
py=${PYTHON:-python3}
pkg=${GS_PYTHONPATH:-$root/build/python}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gs-soak.XXXXXX")
run=""
pids=()
monitor="" tailer=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # Whatever is still running was started here: end it by pid, then remove the temp dir.
  for pid in "${pids[@]}" $monitor $tailer ${grace:-}; do kill "$pid" 2> /dev/null || true; done
  wait 2> /dev/null || true
  # An interrupted run keeps its logs and records; the temp dir (package copy, ids) goes.
  if [[ -n ${run:-} && -d $run && ! -e $results/summary.txt ]]; then
    cp "$run"/* "$results"/ 2> /dev/null || true
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The build tree may be rebuilt while a 10-minute soak runs: the ranks load a copy of the
# package and its library, taken now.
if [[ ! -f $pkg/gradstream/__init__.py ]]; then
  echo "soak.sh: no gradstream package in $pkg (build first, or set GS_PYTHONPATH)" >&2
  exit 2
fi
cp -r "$pkg/gradstream" "$tmp/gradstream"
export PYTHONPATH=$tmp${PYTHONPATH:+:$PYTHONPATH}
unset GRADSTREAM_LIBRARY
# numpy's BLAS threads would spin on the cores the ranks' progress threads need (a dot
# product of the checks took 8 ms instead of 20 us on the loaded 2-core machine).
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# Loopback only: an interface name would expose the rendezvous and tcp to the network.
unset GS_SOCKET_IFNAME
if ! "$py" -c 'import gradstream, numpy' 2> "$tmp/import.err"; then
  echo "soak.sh: cannot import gradstream and numpy:" >&2
  cat "$tmp/import.err" >&2
  exit 2
fi

mkdir -p "$results"
run=$tmp/run
mkdir "$run"
t0=$(date +%s.%N)
common=(--ranks "$ranks" --dir "$run" --t0 "$t0" --seed "$seed" --duration "$duration"
  --interval "$interval")
[[ -n ${SOAK_WARMUP:-} ]] && common+=(--warmup "$SOAK_WARMUP")
replay=()
[[ -n ${SOAK_REPLAY:-} ]] && replay=(--replay "$SOAK_REPLAY")

echo "soak: $ranks ranks, ${duration} s, seed $seed, $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "library $("$py" -c 'import gradstream; print(gradstream.__version__)')" \
  "(sha256 $(sha256sum "$tmp"/gradstream/_native/libgradstream.so* 2> /dev/null | head -1 | cut -c1-12)), results in $results"
env | grep '^GS_' | sed 's/^/soak: env /' || true

# Each rank is bounded: the soak itself, then the library's 60 s deadline and the rank's own
# watchdog (deadline + 60 s) have passed before timeout ends it.
limit=$((duration + 300))
for ((r = 0; r < ranks; r++)); do
  timeout -k 10 "$limit" "$py" "$here/soak.py" rank --rank "$r" "${common[@]}" "${replay[@]}" \
    > "$run/rank$r.log" 2>&1 &
  pids+=($!)
done
"$py" "$here/soak.py" monitor "${common[@]}" > "$run/monitor.log" 2>&1 &
monitor=$!

# Rank 0's progress as it goes (its log has the communicators), the others' at the end.
touch "$run/rank0.log"
tail -n +1 -f "$run/rank0.log" --pid "${pids[0]}" 2> /dev/null | sed 's/^/rank0: /' &
tailer=$!

# As ranks.sh's wait_ranks, but every rank's status is kept for the report, and after the
# first failure the others get 10 s to report it themselves (a peer that died shows up as
# GS_ERR_REMOTE naming it within about 200 ms) before they are ended, by pid (unreaped
# children: the pids cannot have been reused).
declare -A code=()
left=("${pids[@]}")
grace=""
while ((${#left[@]})); do
  set +e
  wait -n -p fin "${left[@]}" $grace
  st=$?
  set -e
  if [[ $fin == "$grace" ]]; then
    for pid in "${left[@]}"; do kill "$pid" 2> /dev/null || true; done
    grace=""
    continue
  fi
  for r in "${!left[@]}"; do [[ ${left[r]} == "$fin" ]] && unset 'left[r]'; done
  code[$fin]=$st
  # 1: wrong results, found and recorded, with the communicator still working: the others
  # finish normally. Anything else (2 a failed collective, 3 a hang, 124/137 timeout, a signal)
  # leaves the others waiting on a dead or broken peer.
  if ((st != 0 && st != 1)) && [[ -z $grace && ! -v killing ]]; then
    killing=1
    sleep 10 &
    grace=$!
  fi
done
if [[ -n $grace ]]; then kill "$grace" 2> /dev/null || true; wait "$grace" 2> /dev/null || true; fi
for ((r = 0; r < ranks; r++)); do echo "$r ${code[${pids[r]}]}" >> "$run/exit_codes"; done
pids=()
kill "$monitor" 2> /dev/null || true
wait "$monitor" 2> /dev/null || true
monitor=""
wait "$tailer" 2> /dev/null || true
tailer=""

for ((r = 1; r < ranks; r++)); do
  if [[ -s $run/rank$r.log ]]; then
    echo "--- rank $r log (last 20 lines)"
    tail -n 20 "$run/rank$r.log"
  fi
done

set +e
"$py" "$here/soak.py" report "${common[@]}" | tee "$run/summary.txt"
status=${PIPESTATUS[0]}
set -e
cp "$run"/*.log "$run"/*.jsonl "$run"/*.json "$run"/samples.csv "$run"/summary.txt \
  "$run"/exit_codes "$results"/ 2> /dev/null || true
echo "soak: results in $results"
exit "$status"
