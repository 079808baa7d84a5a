#include <atomic>
#include <limits>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "codecs/cpu_kernels.h"
#include "format/block_math.h"

namespace gs::codecs::cpu {
namespace {

// fp8 code -> float computed at compile time (exact power-of-two arithmetic); a test checks every
// entry against math::fp8ToFloat, which the GPU kernels use.
template <int kMantissa, int kBias, bool kIeeeSpecials>
constexpr float fp8Value(int c) {
  const int e = (c & 0x7f) >> kMantissa;
  const int m = c & ((1 << kMantissa) - 1);
  const bool neg = (c & 0x80) != 0;
  double v;
  if (!kIeeeSpecials && (c & 0x7f) == 0x7f) {
    return std::numeric_limits<float>::quiet_NaN();
  } else if (kIeeeSpecials && e == (0x7f >> kMantissa)) {
    if (m != 0)
      return std::numeric_limits<float>::quiet_NaN();
    v = std::numeric_limits<double>::infinity();
  } else {
    double p = 1.0;
    const int exp = (e == 0 ? 1 : e) - kBias - kMantissa;
    for (int k = 0; k < (exp < 0 ? -exp : exp); ++k)
      p = exp < 0 ? p / 2 : p * 2;
    v = (e == 0 ? m : ((1 << kMantissa) + m)) * p;
  }
  return static_cast<float>(neg ? -v : v);
}
template <int kMantissa, int kBias, bool kIeeeSpecials>
struct Fp8Table {
  float v[256];
  constexpr Fp8Table() : v{} {
    for (int c = 0; c < 256; ++c)
      v[c] = fp8Value<kMantissa, kBias, kIeeeSpecials>(c);
  }
};
constexpr Fp8Table<3, 7, false> kE4M3{};
constexpr Fp8Table<2, 15, true> kE5M2{};

std::atomic<bool> gForceScalar{false};

}  // namespace

#define GS_FP8_ROW(t, r) \
  t.v[r], t.v[r + 1], t.v[r + 2], t.v[r + 3], t.v[r + 4], t.v[r + 5], t.v[r + 6], t.v[r + 7]
#define GS_FP8_64(t, r)                                                                 \
  GS_FP8_ROW(t, r), GS_FP8_ROW(t, r + 8), GS_FP8_ROW(t, r + 16), GS_FP8_ROW(t, r + 24), \
      GS_FP8_ROW(t, r + 32), GS_FP8_ROW(t, r + 40), GS_FP8_ROW(t, r + 48), GS_FP8_ROW(t, r + 56)
#define GS_FP8_ALL(t) GS_FP8_64(t, 0), GS_FP8_64(t, 64), GS_FP8_64(t, 128), GS_FP8_64(t, 192)
extern const float kE4M3Table[256];
extern const float kE5M2Table[256];
extern const float kE4M3Table[256] = {GS_FP8_ALL(kE4M3)};
extern const float kE5M2Table[256] = {GS_FP8_ALL(kE5M2)};
#undef GS_FP8_ALL
#undef GS_FP8_64
#undef GS_FP8_ROW

bool avx2Supported() {
#if defined(__x86_64__)
  // __builtin_cpu_supports checks AVX2 together with the OS's YMM state; clang 14 does not know
  // "f16c", so that bit is read from CPUID leaf 1 (ECX bit 29).
  static const bool kHave = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return kHave;
#else
  return false;
#endif
}

const Kernels& kernels() {
  if (!gForceScalar.load(std::memory_order_relaxed) && avx2Supported())
    return kAvx2Kernels;
  return kPortableKernels;
}

void setForceScalarForTesting(bool force) {
  gForceScalar.store(force, std::memory_order_relaxed);
}

}  // namespace gs::codecs::cpu
