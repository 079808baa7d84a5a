#pragma once

// Per-element and per-block arithmetic of the lossy codecs, written once as inline functions
// that the CPU loops (codecs/cpu_loops.inc) and the CUDA kernels (kernels/) both use, so
// the CPU tests pin down the bits the GPU produces. Everything here is branch-light integer and
// IEEE float arithmetic with no library calls beyond rintf/floorf, and no fused multiply-add
// (the CPU build uses -ffp-contract=off; kernels/ is compiled with nvcc --fmad=false).

#include <math.h>  // rintf, floorf (also device functions under nvcc)

#include <cstdint>

#include "format/half.h"  // GS_HOST_DEVICE, floatBits, bitsFloat, floatToHalf, floatToBf16

#if defined(__CUDACC__)
#define GS_INLINE __host__ __device__ __forceinline__
#else
#define GS_INLINE inline __attribute__((always_inline))
#endif

namespace gs::format::math {

// ---- stochastic rounding randomness ---------------------------------------------------------
// Counter-based: the random bits of element i depend only on (seed, i), so the encode is
// deterministic for a seed, order-independent, and a GPU thread derives its bits from its index.

/// murmur3's 32-bit finalizer: a bijection with good avalanche.
GS_INLINE uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}
/// Per-call key from the 64-bit seed (computed once per encode).
GS_INLINE uint32_t srKey(uint64_t seed) {
  return mix32(static_cast<uint32_t>(seed) ^
               mix32(static_cast<uint32_t>(seed >> 32) + 0x9e3779b9u));
}
/// 32 random bits of element `index` (the index within the chunk).
GS_INLINE uint32_t srBits(uint32_t key, uint32_t index) {
  return mix32(index * 0x9e3779b1u + key);
}
/// Uniform in [0, 1) on a 2^-24 grid (exact in float).
GS_INLINE float srUniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 5.9604644775390625e-8f;
}

// ---- 16-bit floats ---------------------------------------------------------------------------

/// binary16 -> float; NaNs come out quiet (so a vector path with hardware conversion matches).
GS_INLINE float halfBitsToFloat(uint16_t h) {
  float f = halfToFloat(h);
  const uint32_t u = floatBits(f);
  return (u & 0x7fffffffu) > 0x7f800000u ? bitsFloat(u | 0x00400000u) : f;
}

/// float -> bfloat16 with stochastic rounding: adding 16 random bits below the kept mantissa and
/// truncating rounds up with probability equal to the dropped fraction. NaN as floatToBf16.
GS_INLINE uint16_t floatToBf16Sr(float f, uint32_t rnd) {
  const uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return floatToBf16(f);
  if ((u & 0x7fffffffu) == 0x7f800000u)
    return static_cast<uint16_t>(u >> 16);
  return static_cast<uint16_t>((u + (rnd & 0xffffu)) >> 16);
}

/// float -> binary16 with stochastic rounding. The random bits are added below the last kept bit
/// of the result (13 bits for normal halves, more in the subnormal range), the float is truncated
/// there, and the now exactly representable value is converted. Non-finite inputs as floatToHalf.
GS_INLINE uint16_t floatToHalfSr(float f, uint32_t rnd) {
  const uint32_t u = floatBits(f);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u)
    return floatToHalf(f);
  const int e = static_cast<int>(a >> 23) - 127;  // unbiased exponent (-127 for float subnormals)
  if (e < -24) {
    // |f| < 2^-24: result is 0 or the smallest subnormal 2^-24, with probability |f| / 2^-24.
    const float p = bitsFloat(a) * 16777216.0f;  // exact
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    return static_cast<uint16_t>(sign | (srUniform(rnd) < p ? 1u : 0u));
  }
  const int dropped = e >= -14 ? 13 : 13 + (-14 - e);  // float bits below the half quantum
  const uint32_t mask = (1u << dropped) - 1u;
  const uint32_t t = (u + (rnd & mask)) & ~mask;
  return floatToHalf(bitsFloat(t));
}

// ---- fp8 (OCP formats) ---------------------------------------------------------------------
// E4M3: bias 7, no infinities, 0x7f/0xff are NaN, max 448. E5M2: bias 15, IEEE-like, max 57344.

struct E4M3 {
  static constexpr int kMantissa = 3;
  static constexpr int kBias = 7;
  static constexpr float kMax = 448.0f;
};
struct E5M2 {
  static constexpr int kMantissa = 2;
  static constexpr int kBias = 15;
  static constexpr float kMax = 57344.0f;
};

/// Finite y with |y| <= F::kMax -> fp8 code, round to nearest even (rnd == 0) or stochastic
/// (rnd = 32 random bits, sr == true). Callers clamp y first, so the result never exceeds kMax.
template <class F, bool kSr>
GS_INLINE uint8_t floatToFp8(float y, uint32_t rnd) {
  constexpr int kDrop = 23 - F::kMantissa;
  const uint32_t bits = floatBits(y);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7fffffffu;
  // Normal range: rebias the exponent and round away kDrop mantissa bits.
  uint32_t n;
  if constexpr (kSr)
    n = a + (rnd & ((1u << kDrop) - 1u));
  else
    n = a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u);
  n = (n >> kDrop) - (static_cast<uint32_t>(127 - F::kBias) << F::kMantissa);
  // Subnormal range (|y| < 2^(1-bias)): count quanta of 2^(1-bias-mantissa); the scaling is exact.
  constexpr float kQuanta = static_cast<float>(1u << (F::kBias - 1 + F::kMantissa));
  float q = bitsFloat(a) * kQuanta;
  if constexpr (kSr)
    q = floorf(q + srUniform(rnd));
  else
    q = rintf(q);
  // Outside the subnormal range q is discarded below; bound it so the conversion is defined.
  constexpr float kSubMax = static_cast<float>(1u << F::kMantissa);
  q = q < kSubMax ? q : kSubMax;
  const uint32_t sub = static_cast<uint32_t>(static_cast<int32_t>(q));
  const uint32_t code = a < (static_cast<uint32_t>(128 - F::kBias) << 23) ? sub : n;
  return static_cast<uint8_t>(sign | code);
}

/// fp8 code -> float (exact). E4M3 0x7f/0xff decode to NaN; E5M2 exponent 31 to Inf/NaN.
template <class F>
GS_INLINE float fp8ToFloat(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c & 0x7fu) >> F::kMantissa;
  const uint32_t m = c & ((1u << F::kMantissa) - 1u);
  constexpr uint32_t kExpMax = (0x7fu >> F::kMantissa);
  float v;
  if (e == 0) {
    // m * 2^(1 - bias - mantissa)
    v = static_cast<float>(m) *
        bitsFloat(static_cast<uint32_t>(127 + 1 - F::kBias - F::kMantissa) << 23);
  } else if (F::kBias == 7 && (c & 0x7fu) == 0x7fu) {
    v = bitsFloat(0x7fc00000u);
  } else if (F::kBias == 15 && e == kExpMax) {
    v = bitsFloat(m ? 0x7fc00000u : 0x7f800000u);
  } else {
    v = bitsFloat(((e + 127u - F::kBias) << 23) | (m << (23 - F::kMantissa)));
  }
  return bitsFloat(floatBits(v) | sign);
}

// ---- block scales ----------------------------------------------------------------------------

/// Scale of one block from the largest |x| given as float bits with the sign cleared (the max
/// over uint32 of (bits & 0x7fffffff): for non-negative floats integer order is value order, and
/// Inf/NaN compare above every finite value). scale = absmax / qmax; decode is q * scale.
///  - a NaN or Inf in the block poisons it: scale = NaN (every element decodes to NaN), q = 0;
///  - absmax so small that the scale would not be a normal float (absmax < qmax * FLT_MIN,
///    about 5e-36 for fp8/int8): the block encodes as zeros (scale 0);
///  - otherwise inv = qmax / absmax is finite and x * inv lies within [-qmax, qmax] up to one
///    rounding, which the quantizers clamp.
struct BlockScale {
  float scale;    // stored in the chunk metadata
  float inv;      // multiplier applied before rounding (0 for zero or poisoned blocks)
  bool quantize;  // false: every q of the block is 0
};
GS_INLINE BlockScale blockScale(uint32_t absBits, float qmax) {
  if (absBits >= 0x7f800000u)
    return BlockScale{bitsFloat(0x7fc00000u), 0.0f, false};
  const float absmax = bitsFloat(absBits);
  const float scale = absmax / qmax;
  if (!(scale >= 1.17549435e-38f))
    return BlockScale{0.0f, 0.0f, false};
  return BlockScale{scale, qmax / absmax, true};
}

/// Clamp to [-m, m] (inputs are finite here).
GS_INLINE float clampAbs(float v, float m) {
  v = v < -m ? -m : v;
  return v > m ? m : v;
}

/// Blockwise integer quantization: q = round(x * inv) clamped to [-qmax, qmax], round to nearest
/// even or stochastic (floor(v + u), u uniform in [0, 1): E[q] = v).
template <bool kSr>
GS_INLINE int32_t quantizeInt(float x, float inv, float qmax, uint32_t rnd) {
  float v = x * inv;
  if constexpr (kSr)
    v = floorf(v + srUniform(rnd));
  else
    v = rintf(v);
  return static_cast<int32_t>(clampAbs(v, qmax));
}

/// Blockwise fp8: y = clamp(x * inv, kMax) then floatToFp8.
template <class F, bool kSr>
GS_INLINE uint8_t quantizeFp8(float x, float inv, uint32_t rnd) {
  return floatToFp8<F, kSr>(clampAbs(x * inv, F::kMax), rnd);
}

// ---- reductions ------------------------------------------------------------------------------
// Min/max propagate a NaN from either side (a's first), like NCCL and torch.minimum/maximum; they
// select, never compute, so the NaN keeps its bits. Sum/prod are a + b and a * b.

template <class C>
GS_INLINE C minPropagateNan(C a, C b) {
  return a != a ? a : (b != b ? b : (b < a ? b : a));
}
template <class C>
GS_INLINE C maxPropagateNan(C a, C b) {
  return a != a ? a : (b != b ? b : (a < b ? b : a));
}

/// int4 packing: element 2j in the low nibble of byte j, element 2j+1 in the high nibble; values
/// in [-7, 7] as two's complement nibbles (the encoder never writes -8, a decoder reads it as -8).
GS_INLINE int32_t int4Low(uint8_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(b) << 28) >> 28;
}
GS_INLINE int32_t int4High(uint8_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(b) << 24) >> 28;
}
GS_INLINE uint8_t int4Pack(int32_t lo, int32_t hi) {
  return static_cast<uint8_t>((static_cast<uint32_t>(lo) & 0xfu) |
                              ((static_cast<uint32_t>(hi) & 0xfu) << 4));
}

// ---- top-k selection key -----------------------------------------------------------------------

/// The key every NaN ranks by in top-k: one value for all NaNs whatever their sign and payload,
/// above +Inf's key 0x7f800000 (all ones: the CPU's four-lane test computes it with one compare
/// and one OR; any one value above +Inf selects the same elements).
constexpr uint32_t kTopkNanKey = 0xffffffffu;

/// Top-k's selection key of a value already rounded to float: |x|'s bits (sign cleared), so
/// larger magnitudes have larger keys and +-Inf (0x7f800000) is above every finite value; every
/// NaN gets kTopkNanKey. Payloads differ between CPUs and GPUs (a GPU's arithmetic and
/// conversions produce its canonical NaN, x86 keeps payloads), so a key that depended on them
/// would make the CPU and the GPU keep different NaNs when more NaNs compete than top-k keeps;
/// with one key they tie and are taken in index order like any equal magnitudes.
/// codecs/topk.cc's SIMD group test (matchBits) computes the same on four keys at once.
GS_INLINE uint32_t topkKey(float x) {
  const uint32_t a = floatBits(x) & 0x7fffffffu;
  return a > 0x7f800000u ? kTopkNanKey : a;
}

}  // namespace gs::format::math
