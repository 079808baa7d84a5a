#!/usr/bin/env bash
# The GPU checks from prebuilt binaries, for a GPU machine that cannot build the project (no
# Boost, GoogleTest or network there): bench/gpu_check.sh's stages 2-4 plus the other
# collectives on device buffers and the PyTorch backend on CUDA tensors.
#
#   bench/gpu_bundle.sh BUILD_DIR BUNDLE        # here: copy + strip what the run needs
#   bench/gpu_device_run.sh BUNDLE [OUT_DIR]    # there (OUT_DIR: $OUT, else ./gpu-device-out)
#
# BUNDLE holds bin/{gpu_codec_test,gpu_collective_test,gs-gpu-bench,gradstream-perf} and
# python/gradstream (the staged package with _native/libgradstream.so.0). Stages:
#   1. machine: nvidia-smi, nvcc, python3/torch, ldd of the binaries;
#   2. gpu tests: both gtest binaries, every test; a skipped test is a failure here;
#   3. gs-gpu-bench 256 MiB: every kernel vs a device-to-device cudaMemcpy (PASS at >= 80 %);
#   4. gradstream-perf --ranks 2 allreduce float32 1M..256M -c 1, --device host and cuda, over
#      shm (GS_SHM=1) and tcp (GS_SHM=0), each under `timeout 60`, then busbw tables;
#   5. alltoall and reduce, host and cuda, over shm (1M..64M), and sendrecv on cuda (reported,
#      not judged);
#   6. bench/gpu_torch_check.py: 2 processes, backend "gradstream" on CUDA tensors, DDP + hook;
#   7. compute-sanitizer memcheck over gpu_codec_test (informational; GS_SANITIZER_SECONDS, 120);
#   8. only with GS_NCU=1: Nsight Compute on the block-codec encoder (informational): the first
#      GS_NCU_COUNT (22) launches of encodeBlkKernel in `gs-gpu-bench 256 1` (float32, 256 MiB;
#      per block codec in the bench's order 1 encode + 3 encodes + 3 hops + 3 encodes with a
#      residual: fp8e4m3 0-9, fp8e5m2 10-19, int8 20-21), --set basic plus WarpStateStats,
#      MemoryWorkloadAnalysis, SchedulerStats, clocks not locked; ncu_encodeBlk.{txt,csv,ncu-rep}.
# A failing stage does not stop the later ones. Files in OUT_DIR: run.log (everything),
# summary.txt (verdicts and tables), gtest_*.xml, torch.log. Exit 0 when every judged stage
# passed. Took 60-65 s on one H200 (2026-12-04, docs/gpu.md), 115 s with GS_NCU=1.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"  # nvcc, compute-sanitizer where not on PATH
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(cd "${1:?usage: gpu_device_run.sh BUNDLE [OUT_DIR]}" && pwd)
out=${2:-${OUT:-$PWD/gpu-device-out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$bundle/bin
# gpu_collective_test and gradstream-perf load libgradstream.so.0 from the bundle.
export LD_LIBRARY_PATH="$bundle/python/gradstream/_native${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log=$out/run.log
sum=$out/summary.txt
: >"$log"
: >"$sum"
start=$(date +%s)
failures=()
stage() { echo; echo "== $* ($(( $(date +%s) - start )) s)" | tee -a "$log" "$sum"; }
note() { echo "$*" | tee -a "$log" "$sum"; }
fail() { failures+=("$*"); note "FAILED: $*"; }

stage "machine"
{
  date -u +"%Y-%m-%d %H:%M:%S UTC"
  uname -a
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  nvidia-smi
  command -v nvcc >/dev/null && nvcc --version | tail -2
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
  ldd --version | head -1
  for f in "$bin"/* "$bundle"/python/gradstream/_native/libgradstream.so.0; do
    echo "ldd $(basename "$f"):"; ldd "$f" | sed 's/^/  /'
  done
} >>"$log" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$sum"
grep -h 'release' <(nvcc --version 2>/dev/null) | tee -a "$sum"
if grep -q 'not found' <(for f in "$bin"/*; do ldd "$f"; done 2>&1); then
  fail "a binary needs a library this machine lacks (ldd in run.log)"
fi

stage "gpu tests"
run_gtest() {  # run_gtest NAME SECONDS
  local name=$1 secs=$2 rc=0 txt="$out/.$1.out"
  timeout -k 5 "$secs" "$bin/$name" --gtest_output="xml:$out/gtest_${name#gpu_}.xml" \
    >"$txt" 2>&1 || rc=$?
  cat "$txt" >>"$log"
  local passed skipped failed
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$txt"); passed=${passed:-0}
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$txt"); skipped=${skipped:-0}
  failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$txt"); failed=${failed:-0}
  note "$name: exit $rc, $passed passed, $skipped skipped, $failed failed ($(grep -m1 '^\[==========\] .* ran' "$txt" || echo 'no summary: killed or crashed?'))"
  # The failed and skipped tests by name (their messages are in run.log).
  grep -E '^\[  (FAILED|SKIPPED) \] [A-Za-z]' "$txt" | grep -v 'ms)$' | sort -u | sed 's/^/  /' |
    tee -a "$sum" >/dev/null
  [[ $rc -eq 0 && $skipped -eq 0 && $passed -gt 0 ]] || fail "$name (exit $rc, $skipped skipped)"
  rm -f "$txt"
}
run_gtest gpu_codec_test 240
run_gtest gpu_collective_test 240

stage "kernel benchmark (gs-gpu-bench 256 MiB, 20 iterations)"
brc=0
timeout -k 5 180 "$bin/gs-gpu-bench" 256 20 >"$out/.bench" 2>&1 || brc=$?
tee -a "$log" "$sum" <"$out/.bench" >/dev/null
rm -f "$out/.bench"
[[ $brc -eq 0 ]] || fail "gs-gpu-bench exit $brc (1: a kernel below 80 % of the copy, 2: CUDA error, 124: timeout)"

perf() {  # perf LABEL ENV... -- ARGS...: one gradstream-perf run, output into the log
  local label=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local rc=0 f="$out/.perf.$label"
  echo "-- $label: ${envs[*]} gradstream-perf $*" >>"$log"
  env GS_TRANSPORT=tcp "${envs[@]}" timeout -k 5 60 "$bin/gradstream-perf" "$@" >"$f" 2>&1 || rc=$?
  cat "$f" >>"$log"
  echo "$rc" >"$f.rc"
}
rows_ok() {  # rows_ok LABEL EXPECTED_ROWS [cuda]: judge one perf run like gpu_check.sh does
  local f="$out/.perf.$1" rc rows
  rc=$(cat "$f.rc")
  if [[ $rc -ne 0 ]]; then
    fail "$1: exit $rc: $(grep -m1 'gradstream-perf\|error\|GS_ERR' "$f" || tail -1 "$f")"
    return
  fi
  rows=$(awk '/^ +[0-9]/ && NF >= 10' "$f" | wc -l)
  [[ $rows -eq $2 ]] || fail "$1: $rows result rows, expected $2"
  awk '/^ +[0-9]/ && NF >= 10 && $9 != 0 { bad = 1 } END { exit !bad }' "$f" &&
    fail "$1: rows with #wrong != 0"
  grep -q '^# Out of bounds values : 0 OK' "$f" || fail "$1: no '0 OK' summary"
  if [[ ${3:-} == cuda ]]; then
    grep -Eq '^# buffers: cuda device [0-9]+ \(' "$f" || fail "$1: no '# buffers: cuda device' line"
  fi
}
busbw() {  # busbw LABEL SIZE
  awk -v s="$2" '/^ +[0-9]/ && NF >= 10 && $1 == s { v = $8 } END { print (v == "" ? "-" : v) }' \
    "$out/.perf.$1"
}
table() {  # table TITLE HOST_LABEL CUDA_LABEL SIZES...
  local title=$1 h=$2 d=$3; shift 3
  {
    echo
    echo "$title (transport: $(sed -n 's/^# transport: //p' "$out/.perf.$h" | head -1); device run: $(sed -n 's/^# buffers: //p' "$out/.perf.$d" | head -1))"
    printf '%12s | %17s | %19s | %11s\n' "size(B)" "host busbw(GB/s)" "device busbw(GB/s)" "device/host"
    local s hv dv
    for s in "$@"; do
      hv=$(busbw "$h" "$s"); dv=$(busbw "$d" "$s")
      printf '%12s | %17s | %19s | %11s\n' "$s" "$hv" "$dv" \
        "$(awk -v h="$hv" -v d="$dv" 'BEGIN { print (h + 0 > 0 && d != "-") ? sprintf("%.2f", d / h) : "-" }')"
    done
  } | tee -a "$log" "$sum" >/dev/null
}

stage "allreduce: device buffers vs host buffers (gradstream-perf --ranks 2, float32 1M..256M, -c 1)"
ar=(--ranks 2 --coll allreduce -d float32 -b 1M -e 256M -f 4 -n 10 -w 3 -c 1 --timeout 50)
big=(1048576 4194304 16777216 67108864 268435456)
for shm in 1 0; do
  for d in host cuda; do
    perf "ar.shm$shm.$d" GS_SHM=$shm -- "${ar[@]}" --device $d
    rows_ok "ar.shm$shm.$d" 5 $d
  done
  table "allreduce GS_SHM=$shm" "ar.shm$shm.host" "ar.shm$shm.cuda" "${big[@]}"
done

stage "alltoall / reduce (host and cuda) and sendrecv (cuda) over shm, 1M..64M, -c 1"
small=(1048576 8388608 67108864)
for c in alltoall reduce; do
  for d in host cuda; do
    perf "$c.$d" GS_SHM=1 -- --ranks 2 --coll $c -d float32 -b 1M -e 64M -f 8 -n 5 -w 2 -c 1 \
      --timeout 50 --device $d
    rows_ok "$c.$d" 3 $d
  done
  table "$c GS_SHM=1" "$c.host" "$c.cuda" "${small[@]}"
done
perf sendrecv.cuda GS_SHM=1 -- --ranks 2 --coll sendrecv -d float32 -b 1M -e 16M -f 4 -n 5 -w 2 \
  -c 1 --timeout 50 --device cuda
note "sendrecv --device cuda: exit $(cat "$out/.perf.sendrecv.cuda.rc") (not judged): $(grep -m2 -i 'GS_ERR\|unsupported\|error' "$out/.perf.sendrecv.cuda" | tr '\n' ' ')"
awk '/^ +[0-9]/ && NF >= 10' "$out/.perf.sendrecv.cuda" | tee -a "$sum" >/dev/null
rm -f "$out"/.perf.*

stage "PyTorch backend on CUDA tensors (bench/gpu_torch_check.py, 2 processes)"
prc=0
PYTHONPATH="$bundle/python${PYTHONPATH:+:$PYTHONPATH}" timeout -k 5 200 \
  python3 "$here/gpu_torch_check.py" --device cuda --timeout 180 >"$out/torch.log" 2>&1 || prc=$?
cat "$out/torch.log" >>"$log"
grep -E '^(PASS|FAIL) |^rank [0-9]|^gpu_torch_check' "$out/torch.log" | tee -a "$sum" >/dev/null
[[ $prc -eq 0 ]] || fail "gpu_torch_check.py exit $prc (torch.log)"

san_s=${GS_SANITIZER_SECONDS:-120}
stage "compute-sanitizer memcheck on gpu_codec_test (informational, at most $san_s s)"
if [[ $(( $(date +%s) - start )) -gt 330 ]]; then
  note "skipped: the run is already past 330 s"
elif ! command -v compute-sanitizer >/dev/null; then
  note "skipped: no compute-sanitizer on PATH"
else
  src=0
  timeout -k 5 "$san_s" compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/gpu_codec_test" \
    >"$out/.san" 2>&1 || src=$?
  cat "$out/.san" >>"$log"
  note "compute-sanitizer exit $src (0: clean, 9: errors found, 124: cut at $san_s s)"
  grep -E 'ERROR SUMMARY|^========= [A-Z][a-z]+ .*(read|write|error)|^\[  (PASSED|FAILED|  OK) ' "$out/.san" |
    head -40 | tee -a "$sum" >/dev/null
  rm -f "$out/.san"
fi

if [[ ${GS_NCU:-0} == 1 ]]; then
  stage "Nsight Compute: encodeBlkKernel in gs-gpu-bench 256 1 (informational)"
  ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [[ -z $ncu_bin ]]; then
    note "skipped: no ncu"
  else
    nrc=0
    timeout -k 5 "${GS_NCU_SECONDS:-150}" "$ncu_bin" --kernel-name-base function -k regex:encodeBlk \
      --launch-count "${GS_NCU_COUNT:-22}" --clock-control none --set basic \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      -f -o "$out/ncu_encodeBlk" "$bin/gs-gpu-bench" 256 1 >"$out/.ncu" 2>&1 || nrc=$?
    tail -n 60 "$out/.ncu" >>"$log"
    note "ncu exit $nrc (gs-gpu-bench exits 1 when a row is below 80 %): $(grep -c '^==PROF==' "$out/.ncu") profiler lines"
    grep -m5 '==ERROR==\|==WARNING==' "$out/.ncu" | tee -a "$sum" >/dev/null
    rm -f "$out/.ncu"
    if [[ -f $out/ncu_encodeBlk.ncu-rep ]]; then
      "$ncu_bin" --import "$out/ncu_encodeBlk.ncu-rep" --page details --print-kernel-base demangled \
        >"$out/ncu_encodeBlk.txt" 2>&1
      "$ncu_bin" --import "$out/ncu_encodeBlk.ncu-rep" --page raw --csv --print-units base \
        >"$out/ncu_encodeBlk.csv" 2>&1
      grep -E '^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit Registers|Block Limit Shared|Grid Size' \
        "$out/ncu_encodeBlk.txt" | head -400 | cut -c1-160 >"$out/ncu_encodeBlk.summary"
      note "ncu: $(grep -c 'Duration' "$out/ncu_encodeBlk.txt") kernels profiled (ncu_encodeBlk.txt, .csv, .summary)"
    fi
  fi
fi

stage "done"
if [[ ${#failures[@]} -gt 0 ]]; then
  note "gpu_device_run: FAILED ${#failures[@]}:"
  printf '  %s\n' "${failures[@]}" | tee -a "$log" "$sum"
  exit 1
fi
note "gpu_device_run: PASS"
