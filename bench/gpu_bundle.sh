#!/usr/bin/env bash
# Copies what bench/gpu_device_run.sh needs out of a CUDA build into BUNDLE, stripped:
# bin/{gpu_codec_test,gpu_collective_test,gs-gpu-bench,gradstream-perf} and python/gradstream
# (the staged package with _native/libgradstream.so.0). Build them first, e.g.
#   cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGS_BUILD_TESTS=ON \
#     -DGS_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGS_WITH_VERBS=OFF -DGS_WITH_PROMETHEUS=OFF
#   cmake --build build-device --target gpu_codec_test gpu_collective_test gs-gpu-bench \
#     gradstream-perf gs_python
#   bench/gpu_bundle.sh build-device .device
# cudart is linked statically; the binaries need only libc, libstdc++, libgcc_s, libm and
# libgradstream.so.0 (and the driver's libcuda, loaded at run time). Fails when ldd finds anything else.
set -euo pipefail
build=${1:?usage: gpu_bundle.sh BUILD_DIR BUNDLE}
bundle=${2:?usage: gpu_bundle.sh BUILD_DIR BUNDLE}
rm -rf "$bundle/bin" "$bundle/python"
mkdir -p "$bundle/bin" "$bundle/python"
cp "$build/tests/gpu/gpu_codec_test" "$build/tests/gpu/gpu_collective_test" \
   "$build/codecs/gs-gpu-bench" "$build/tools/gradstream-perf" "$bundle/bin/"
cp -r "$build/python/gradstream" "$bundle/python/"
find "$bundle/python" -name __pycache__ -prune -exec rm -rf {} +
strip "$bundle"/bin/* "$bundle/python/gradstream/_native/libgradstream.so.0"
bad=0
# gpu_collective_test and gradstream-perf load libgradstream.so.0: gpu_device_run.sh points
# LD_LIBRARY_PATH at the bundle's copy (their RUNPATH names this build tree).
native=$(cd "$bundle/python/gradstream/_native" && pwd)
for f in "$bundle"/bin/* "$native/libgradstream.so.0"; do
  extra=$(LD_LIBRARY_PATH=$native ldd "$f" | awk '{print $1}' |
          grep -vE '^(linux-vdso|/lib64/ld-linux|libc\.|libstdc\+\+|libgcc_s|libm\.|libpthread|libdl|librt|libgradstream\.so\.0$)' || true)
  if [[ -n "$extra" ]]; then
    echo "gpu_bundle: $f needs $extra" >&2
    bad=1
  fi
done
du -sh "$bundle"
exit $bad
