#!/usr/bin/env bash
# The GPU check, in one step, on a machine with an NVIDIA GPU and the CUDA toolkit:
#   1. configures build-gpu/ with GS_WITH_CUDA=ON (sm_90 only unless GS_CUDA_ARCHS says otherwise)
#      and builds, with all cores, what the check runs: the gpu tests and gs-gpu-bench
#      (GS_GPU_FULL_BUILD=1 builds everything);
#   2. runs the gpu-labelled tests (kernels vs the CPU codecs bit for bit on random data of odd
#      sizes, poisoned outputs, NaN/Inf, stochastic rounding, error feedback, invalid chunks,
#      enqueue-only under graph capture); a skipped test is a failure here;
#   3. runs gs-gpu-bench: every kernel at 256 MiB timed with CUDA events next to a device-to-device
#      cudaMemcpy of the same run, PASS at >= 80 % of the copy's bandwidth (bytes read + written).
# Exit status: 0 when everything passed; non-zero naming the failed stage otherwise. A log of
# every stage lands in build-gpu/gpu_check.log. Bounded: about 2-4 minutes on an H200 box.
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
else
  echo "warning: nvidia-smi not found; continuing (the tests say whether a device is usable)" | tee -a "$log"
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

targets=(--target gpu_codec_test gs-gpu-bench)
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
[[ "$rc" -eq 0 ]] || die "gpu tests (ctest exit $rc, output above and in $log)"
echo "gpu tests: all $ran passed" | tee -a "$log"

stage "kernel benchmark (gs-gpu-bench $mib MiB)"
set +e
timeout 240 "$build/codecs/gs-gpu-bench" "$mib" 20 2>&1 | tee -a "$log"
brc=${PIPESTATUS[0]}
set -e
[[ "$brc" -eq 0 ]] || die "benchmark (exit $brc: 1 = kernels below 80 % of the copy bandwidth, 124 = timeout, 2 = CUDA error)"

stage "gpu_check: PASS"
