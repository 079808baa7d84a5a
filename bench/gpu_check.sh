#!/usr/bin/env bash
# The GPU check, in one step, on a machine with an NVIDIA GPU and the CUDA toolkit:
#   1. configures build-gpu/ with GS_WITH_CUDA=ON (sm_90 only unless GS_CUDA_ARCHS says otherwise)
#      and builds, with all cores, what the check runs: the gpu tests (gpu_codec_test,
#      gpu_collective_test), gs-gpu-bench and gradstream-perf (GS_GPU_FULL_BUILD=1 builds
#      everything);
#   2. runs the gpu-labelled tests (kernels vs the CPU codecs bit for bit on random data of odd
#      sizes, poisoned outputs, NaN/Inf, stochastic rounding, error feedback, invalid chunks,
#      enqueue-only under graph capture; collectives on device buffers); a skipped test is a
#      failure here;
#   3. runs gs-gpu-bench: every kernel at 256 MiB timed with CUDA events next to a device-to-device
#      cudaMemcpy of the same run, PASS at >= 80 % of the copy's bandwidth (bytes read + written);
#   4. device buffers vs host buffers: gradstream-perf --ranks 2 (rank r on GPU r mod the GPU
#      count: both on GPU 0 of a one-GPU machine), allreduce float32 1M..256M (x4), -c 1, once
#      with --device cuda and once with --device host, over shm (GS_SHM=1) and over tcp
#      (GS_SHM=0), then a table size | host busbw | device busbw | device/host per transport.
#      Fails only when a run fails, reports wrong results or shows no device path; the ratios
#      are printed, not judged.
# Exit status: 0 when everything passed; non-zero naming the failed stages otherwise (a failing
# test or benchmark stage does not stop the later ones). A log of
# every stage lands in build-gpu/gpu_check.log. Bounded: stages 1-3 took about 2-4 minutes on an
# H200 box; stage 4 is four runs, each under a 60 s timeout (the four took 14-16 s together on
# one H200 machine with 16 cores, 2026-12-04, run from prebuilt binaries by
# bench/gpu_device_run.sh: docs/gpu.md).
# Needs what scripts/setup.sh installs (cmake, g++, Boost headers, GoogleTest; ninja optional)
# plus the CUDA toolkit; it installs nothing itself (GPU machines may have no network).
#   bench/gpu_check.sh                 # defaults
#   GS_CUDA_ARCHS="90-real" GS_GPU_BUILD_DIR=/tmp/b bench/gpu_check.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GS_GPU_BUILD_DIR:-$root/build-gpu}
archs=${GS_CUDA_ARCHS:-90-real}
mib=${GS_GPU_BENCH_MIB:-256}
mkdir -p "$build"
log="$build/gpu_check.log"
: >"$log"
start=$(date +%s)
stage() { echo; echo "== $* ($(( $(date +%s) - start )) s)" | tee -a "$log"; }
die() { echo "gpu_check: FAILED: $*" | tee -a "$log" >&2; exit 1; }

stage "machine"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log" \
    || die "nvidia-smi cannot talk to the driver"
elif [[ -e /dev/nvidiactl || -e /proc/driver/nvidia/version ]]; then
  echo "warning: nvidia-smi not found; continuing (the tests say whether a device is usable)" | tee -a "$log"
else
  # Before minutes of building: without the driver's device nodes no CUDA call can succeed.
  die "no NVIDIA driver on this machine (no nvidia-smi, /dev/nvidiactl or /proc/driver/nvidia): run it on a GPU machine"
fi
nvcc=${CUDACXX:-}
if [[ -z "$nvcc" ]]; then
  nvcc=$(command -v nvcc || true)
  [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
fi
[[ -n "$nvcc" ]] || die "no nvcc (install the CUDA toolkit or set CUDACXX)"
"$nvcc" --version | tail -1 | tee -a "$log"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

stage "configure ($build, GS_WITH_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$archs)"
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DGS_BUILD_TESTS=ON \
  -DGS_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
  >>"$log" 2>&1 || { tail -30 "$log"; die "cmake configure (see $log)"; }
grep -q '#define GS_HAVE_CUDA 1' "$build/generated/gradstream/build_config.h" \
  || die "configured without CUDA"

targets=(--target gpu_codec_test gpu_collective_test gs-gpu-bench gradstream-perf)
[[ "${GS_GPU_FULL_BUILD:-0}" == 1 ]] && targets=()
stage "build (-j$(nproc)) ${targets[*]}"
cmake --build "$build" -j"$(nproc)" "${targets[@]}" >>"$log" 2>&1 \
  || { tail -40 "$log"; die "build (see $log)"; }

stage "gpu tests (ctest -L gpu)"
set +e
(cd "$build" && ctest -L gpu --output-on-failure --timeout 600) 2>&1 | tee -a "$log" | tee "$build/gpu_tests.out"
rc=${PIPESTATUS[0]}
set -e
ran=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+:' "$build/gpu_tests.out" || true)
[[ "$ran" -gt 0 ]] || die "no gpu tests were found (is tests/gpu built?)"
if grep -qE '\(Skipped\)|\*\*\*Skipped|Not Run' "$build/gpu_tests.out"; then
  why=$("$build/tests/gpu/gpu_codec_test" --gtest_filter=GpuCodec.PointersAreClassified 2>&1 |
        grep -m1 'no CUDA device' || true)
  die "gpu tests skipped on a machine that should have a GPU: ${why:-see $log}"
fi
# A failing stage does not stop the later ones: device time is scarce, so one run reports
# everything (the failures are listed, and the exit status set, at the end).
failures=()
if [[ "$rc" -eq 0 ]]; then
  echo "gpu tests: all $ran passed" | tee -a "$log"
else
  failures+=("gpu tests (ctest exit $rc, output above and in $log)")
fi

stage "kernel benchmark (gs-gpu-bench $mib MiB)"
set +e
timeout 240 "$build/codecs/gs-gpu-bench" "$mib" 20 2>&1 | tee -a "$log"
brc=${PIPESTATUS[0]}
set -e
[[ "$brc" -eq 0 ]] ||
  failures+=("benchmark (exit $brc: 1 = kernels below 80 % of the copy bandwidth, 124 = timeout, 2 = CUDA error)")

stage "device buffers vs host buffers (gradstream-perf --ranks 2, allreduce float32 1M..256M)"
perf="$build/tools/gradstream-perf"
perf_dir="$build/perf_device"
mkdir -p "$perf_dir"
perf_args=(--ranks 2 --coll allreduce -d float32 -b 1M -e 256M -f 4 -n 10 -w 3 -c 1 --timeout 50)
sizes=(1048576 4194304 16777216 67108864 268435456)
perf_failures=()
# run_perf SHM DEVICE: one gradstream-perf run into $perf_dir/shm$SHM.$DEVICE.out (always
# written, so the table below can read every file); a failure is recorded in perf_failures and
# the other runs still go, so the table shows what did run.
run_perf() {
  local shm=$1 device=$2 out="$perf_dir/shm$1.$2.out" rc=0 what="GS_SHM=$1 --device $2"
  echo "GS_TRANSPORT=tcp GS_SHM=$shm gradstream-perf ${perf_args[*]} --device $device" | tee -a "$log"
  GS_TRANSPORT=tcp GS_SHM=$shm timeout -k 5 60 "$perf" "${perf_args[@]}" --device "$device" \
    >"$out" 2>&1 || rc=$?
  cat "$out" >>"$log"
  if [[ $rc -ne 0 ]]; then
    # 3: a gradstream or CUDA call failed, 4: wrong results, 5: no usable CUDA device, 124: timeout
    perf_failures+=("$what: exit $rc: $(grep -m1 'gradstream-perf' "$out" || tail -1 "$out")")
    return
  fi
  local rows
  rows=$(awk '/^ +[0-9]/ && NF >= 10' "$out" | wc -l)
  [[ $rows -eq ${#sizes[@]} ]] || perf_failures+=("$what: $rows result rows, expected ${#sizes[@]}")
  awk '/^ +[0-9]/ && NF >= 10 && $9 != 0 { bad = 1 } END { exit !bad }' "$out" \
    && perf_failures+=("$what: rows with #wrong != 0")
  grep -q '^# Out of bounds values : 0 OK' "$out" || perf_failures+=("$what: no '0 OK' summary")
  if [[ $device == cuda ]]; then
    # The library names the path once a collective on device memory ran; none: it took the
    # buffers for host memory.
    grep -Eq '^# buffers: cuda device [0-9]+ \(' "$out" && ! grep -q 'no device path' "$out" \
      || perf_failures+=("$what: $(grep -m1 '^# buffers:' "$out" || echo 'no # buffers: line')")
  fi
}
busbw() {  # busbw FILE SIZE: the busbw column of that size's row, "-" when there is none
  awk -v s="$2" '/^ +[0-9]/ && NF >= 10 && $1 == s { v = $8 } END { print (v == "" ? "-" : v) }' "$1"
}
for shm in 1 0; do
  run_perf "$shm" host
  run_perf "$shm" cuda
done
for shm in 1 0; do
  reported=$(sed -n 's/^# transport: //p' "$perf_dir/shm$shm.host.out" | head -1)
  buffers=$(sed -n 's/^# buffers: //p' "$perf_dir/shm$shm.cuda.out" | head -1)
  {
    echo
    echo "GS_SHM=$shm (transport reported: ${reported:-?}; device run: ${buffers:-?})"
    printf '%12s | %17s | %19s | %11s\n' "size(B)" "host busbw(GB/s)" "device busbw(GB/s)" "device/host"
    for size in "${sizes[@]}"; do
      h=$(busbw "$perf_dir/shm$shm.host.out" "$size")
      d=$(busbw "$perf_dir/shm$shm.cuda.out" "$size")
      ratio=$(awk -v h="$h" -v d="$d" 'BEGIN { print (h + 0 > 0 && d != "-") ? sprintf("%.2f", d / h) : "-" }')
      printf '%12s | %17s | %19s | %11s\n' "$size" "$h" "$d" "$ratio"
    done
  } | tee -a "$log"
done
if [[ ${#perf_failures[@]} -gt 0 ]]; then
  printf '  %s\n' "${perf_failures[@]}" | tee -a "$log" >&2
  failures+=("device buffers vs host buffers: ${#perf_failures[@]} problem(s) above (outputs in $perf_dir)")
fi
if [[ ${#failures[@]} -gt 0 ]]; then
  printf '  %s\n' "${failures[@]}" | tee -a "$log" >&2
  die "${#failures[@]} stage(s) failed"
fi

stage "gpu_check: PASS"
