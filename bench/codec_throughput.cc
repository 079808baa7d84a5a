// gs-codec-bench: encode and decode-reduce (sum into a float32 buffer) throughput of every codec
// on 64 MiB of float32 gradients (normal random), next to memcpy of the same bytes in the same
// run. GB/s counts logical bytes (float32 in / float32 out), the way the engine sees them.
// Chunks of 1 MiB as the chunk engine cuts them. Usage: gs-codec-bench [MiB] [reps] [--portable]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/cpu_kernels.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double bestSeconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = s < best ? s : best;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gs;
  using namespace gs::codecs;
  size_t mib = 64;
  int reps = 5;
  bool portable = false;
  int pos = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--portable") == 0)
      portable = true;
    else if (pos++ == 0)
      mib = std::strtoul(argv[i], nullptr, 10);
    else
      reps = std::atoi(argv[i]);
  }
  cpu::setForceScalarForTesting(portable);
  const size_t n = mib * (1u << 20) / 4;
  const size_t chunk = (1u << 20) / 4;  // 1 MiB of float32 per chunk
  std::vector<float> src(n), dst(n), copy(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : src)
    v = dist(rng);
  std::fill(dst.begin(), dst.end(), 1.0f);

  const double bytes = static_cast<double>(n) * 4;
  const double memcpyS = bestSeconds(reps, [&] { std::memcpy(copy.data(), src.data(), bytes); });
  std::printf("# %zu MiB float32, %zu-element chunks, loops: %s\n", mib, chunk,
              cpu::kernels().name);
  std::printf("%-10s %12s %16s %14s\n", "codec", "encode GB/s", "decodeReduce GB/s", "wire B/elem");
  std::printf("%-10s %12.2f %16s %14s\n", "memcpy", bytes / memcpyS / 1e9, "-", "4");
  for (const char* name :
       {"raw", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "int4", "topk:0.01", "int8,sr",
        "int4,sr", "bf16,sr", "fp16,sr", "fp8e4m3,sr", "fp8e5m2,sr"}) {
    auto codec = makeCodec(CodecSpec::parse(name));
    const size_t chunks = (n + chunk - 1) / chunk;
    const size_t slot = codec->maxEncodedBytes(DataType::kFloat32, chunk);
    std::vector<uint8_t> wire(chunks * slot);
    std::vector<EncodedSize> sizes(chunks);
    const double encS = bestSeconds(reps, [&] {
      for (size_t c = 0; c < chunks; ++c) {
        const size_t off = c * chunk, cnt = std::min(chunk, n - off);
        sizes[c] =
            codec->encode(DataType::kFloat32, src.data() + off, cnt, wire.data() + c * slot, c);
      }
    });
    const double decS = bestSeconds(reps, [&] {
      for (size_t c = 0; c < chunks; ++c) {
        const size_t off = c * chunk, cnt = std::min(chunk, n - off);
        const char* why =
            codec->decodeReduce({.dtype = DataType::kFloat32,
                                 .count = cnt,
                                 .bytes = wire.data() + c * slot,
                                 .metaBytes = sizes[c].metaBytes,
                                 .payloadBytes = sizes[c].payloadBytes},
                                {ReduceOp::kSum, dst.data() + off, false}, dst.data() + off);
        if (why) {
          std::fprintf(stderr, "%s: %s\n", name, why);
          std::exit(1);
        }
      }
    });
    double wireBytes = 0;
    for (auto& s : sizes)
      wireBytes += s.metaBytes + s.payloadBytes;
    std::printf("%-10s %12.2f %16.2f %14.3f\n", name, bytes / encS / 1e9, bytes / decS / 1e9,
                wireBytes / static_cast<double>(n));
  }
  return 0;
}
