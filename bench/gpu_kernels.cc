// gs-gpu-bench [MiB] [iterations]: times every codec kernel on one buffer of float32 (default
// 256 MiB) with CUDA events, next to a device-to-device cudaMemcpy of the same buffer measured
// in the same run. Bandwidth counts bytes read + bytes written (a copy of B bytes moves 2B).
// A row passes at >= 80 % of the copy's bandwidth. Top-k rows are informational: its encode is
// a multi-pass selection (three histogram passes, a count and a write pass) and its decode a
// gather/scatter, not streaming kernels. Exit status 1 when a streaming kernel misses the target.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "codecs/codec.h"
#include "codecs/device_codec.h"

namespace {

using gs::DataType;
using gs::ReduceOp;
using gs::codecs::CodecSpec;
using gs::codecs::DeviceCodec;
using gs::codecs::EncodedChunk;
using gs::codecs::EncodedSize;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gs-gpu-bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  /// Mean seconds per call of f over `iters` calls after 2 warm-up calls.
  template <class F>
  double time(cudaStream_t s, int iters, F&& f) {
    f();
    f();
    check(cudaEventRecord(start, s), "cudaEventRecord");
    for (int i = 0; i < iters; ++i)
      f();
    check(cudaEventRecord(stop, s), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    check(cudaGetLastError(), "kernel");
    return ms / 1e3 / iters;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 20;
  if (const char* why = gs::codecs::deviceUnavailableReason()) {
    std::fprintf(stderr, "gs-gpu-bench: no CUDA device: %s\n", why);
    return 2;
  }
  cudaDeviceProp prop{};
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  const size_t bytes = mib << 20, n = bytes / 4;
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  auto* cs = reinterpret_cast<CUstream_st*>(s);

  // Inputs: random-ish float32 built on the host once (normal-like, varying block scales).
  std::vector<float> host(n);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    host[i] = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * (1.0f + (i >> 12) % 7);
  }
  void *src, *operand, *dst, *chunk, *out, *scratch, *residual;
  const size_t chunkBytes = bytes + (bytes / 4 / 8) + 4096;  // room for any codec's encoding
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&operand, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  check(cudaMalloc(&chunk, chunkBytes), "cudaMalloc");
  check(cudaMalloc(&out, chunkBytes), "cudaMalloc");
  check(cudaMalloc(&scratch, bytes), "cudaMalloc");
  check(cudaMalloc(&residual, bytes), "cudaMalloc");
  check(cudaMemcpy(src, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(operand, host.data(), bytes, cudaMemcpyHostToDevice), "upload");

  Timer timer;
  const double copySec = timer.time(s, iters, [&] {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy");
  });
  const double copyBw = 2.0 * bytes / copySec;
  std::printf("gs-gpu-bench: %s (%d SMs), %zu MiB float32, %d iterations per kernel\n", prop.name,
              prop.multiProcessorCount, mib, iters);
  std::printf("%-30s %10s %10s %12s %7s  %s\n", "kernel", "ms", "GB/s", "copy GB/s", "ratio",
              "result");
  std::printf("%-30s %10.3f %10.1f %12.1f %7.2f  %s\n", "cudaMemcpy D2D", copySec * 1e3,
              copyBw / 1e9, copyBw / 1e9, 1.0, "reference");

  int failed = 0;
  auto row = [&](const std::string& name, double sec, double moved, bool counted) {
    const double bw = moved / sec;
    const double ratio = bw / copyBw;
    const char* verdict = !counted ? "info" : (ratio >= 0.8 ? "PASS" : "FAIL");
    if (counted && ratio < 0.8)
      ++failed;
    std::printf("%-30s %10.3f %10.1f %12.1f %7.2f  %s\n", name.c_str(), sec * 1e3, bw / 1e9,
                copyBw / 1e9, ratio, verdict);
    std::fflush(stdout);
  };

  const char* const kSpecs[] = {"raw",  "fp16",    "bf16",    "fp8e4m3", "fp8e5m2",  "int8",
                                "int4", "fp16,sr", "int8,sr", "int4,sr", "topk:0.01"};
  for (const char* text : kSpecs) {
    const CodecSpec spec = CodecSpec::parse(text);
    auto codec = DeviceCodec::create(spec);
    const bool topk = spec.id == gs::format::CodecId::kTopK;
    const uint8_t id = static_cast<uint8_t>(spec.id);
    const EncodedSize es = codec->encodedSize(DataType::kFloat32, n);
    const double wire = static_cast<double>(es.metaBytes) + es.payloadBytes;
    auto* chunkP = static_cast<uint8_t*>(chunk);
    codec->encode(DataType::kFloat32, src, n, chunkP, 1, cs);  // the chunk the decoders read

    double sec = timer.time(s, iters, [&] {
      codec->encode(DataType::kFloat32, src, n, static_cast<uint8_t*>(out), 1, cs);
    });
    row(std::string("encode ") + text, sec, bytes + wire, !topk);

    // The chunk the decoders read (encoded into chunkP above).
    const EncodedChunk encoded{.codec = id,
                               .dtype = DataType::kFloat32,
                               .count = n,
                               .bytes = chunkP,
                               .metaBytes = es.metaBytes,
                               .payloadBytes = es.payloadBytes};
    sec = timer.time(s, iters, [&] {
      codec->decodeReduce(encoded, {ReduceOp::kSum, operand, false}, dst, cs);
    });
    row(std::string("decode+sum ") + text, sec, wire + 2.0 * bytes, !topk);

    if (spec.id != gs::format::CodecId::kRaw) {
      EncodedSize written{};
      sec = timer.time(s, iters, [&] {
        codec->decodeReduceEncode(encoded, {ReduceOp::kSum, operand}, static_cast<uint8_t*>(out), 2,
                                  scratch, cs, &written);
      });
      row(std::string("hop decode+sum+encode ") + text, sec, wire + bytes + wire, !topk);

      gs::codecs::DeviceFeedback fb{nullptr, residual, 1.0};
      sec = timer.time(s, iters, [&] {
        codec->encode(DataType::kFloat32, src, n, static_cast<uint8_t*>(out), 1, cs, fb);
      });
      row(std::string("encode+residual ") + text, sec, bytes + wire + bytes, !topk);
    }
    if (const char* why = codec->takeError(cs)) {
      std::fprintf(stderr, "gs-gpu-bench: %s reported an invalid chunk: %s\n", text, why);
      return 2;
    }
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  std::printf("%s: %d streaming kernel(s) below 80 %% of the device copy bandwidth\n",
              failed ? "FAIL" : "PASS", failed);
  for (void* p : {src, operand, dst, chunk, out, scratch, residual})
    cudaFree(p);
  cudaStreamDestroy(s);
  return failed ? 1 : 0;
}
