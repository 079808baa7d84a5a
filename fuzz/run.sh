#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time.
# Exits non-zero when any target crashes, leaks or trips a sanitizer.
#   fuzz/run.sh [seconds per target, default 15] [build dir, default build-fuzz]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-15}
build=${2:-$root/build-fuzz}
cxx=${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++)}
cmake -S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "${JOBS:-2}" >/dev/null
targets=(chunk_header_fuzzer decode_raw_fuzzer decode_fp16_fuzzer decode_bf16_fuzzer
         decode_fp8e4m3_fuzzer decode_fp8e5m2_fuzzer decode_int8_fuzzer decode_int4_fuzzer
         decode_topk_fuzzer wire_rendezvous_fuzzer wire_peer_info_fuzzer
         wire_failure_notice_fuzzer wire_unique_id_fuzzer)
# The control-plane targets start from valid messages (control_wire_seeds.cc).
"$build/control_wire_seeds" "$build/corpus"
failed=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus" "$build/artifacts"
  if "$build/$t" -max_total_time="$secs" -max_len=8192 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts/$t-" "$corpus" >"$build/$t.log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/$t.log" | grep -o '[0-9]*$' || echo '?')
    echo "ok     $t  ($execs runs in ${secs}s)"
  else
    echo "FAILED $t  (see $build/$t.log; reproducer in $build/artifacts/)"
    tail -20 "$build/$t.log"
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzzers failed: ${failed[*]}"
  exit 1
fi
echo "all ${#targets[@]} fuzzers ran ${secs}s each without a finding"
