#pragma once

// Scalar conversions between float and the 16-bit float formats, round-to-nearest-even.
// Written as plain inline functions so the CPU path and the CUDA kernels (kernels/) share them.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GS_HOST_DEVICE __host__ __device__
#else
#define GS_HOST_DEVICE
#endif

namespace gs::format {

GS_HOST_DEVICE inline uint32_t floatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
GS_HOST_DEVICE inline float bitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/// bfloat16 is the upper half of an IEEE float. NaNs stay NaN (quiet bit forced).
GS_HOST_DEVICE inline uint16_t floatToBf16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
GS_HOST_DEVICE inline float bf16ToFloat(uint16_t h) {
  return bitsFloat(static_cast<uint32_t>(h) << 16);
}

/// IEEE binary16. Overflow rounds to infinity, tiny values to subnormals or signed zero.
GS_HOST_DEVICE inline uint16_t floatToHalf(float f) {
  uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // Inf or NaN; keep NaN payload bits that fit, force quiet.
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0u));
  }
  if (x >= 0x477ff000u)
    return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (x < 0x38800000u) {
    // |f| < 2^-14: a half subnormal. Adding 0.5 puts the value where the float ulp is 2^-24,
    // the half subnormal step, so the FPU performs the round-to-nearest-even for us.
    float t = bitsFloat(x) + 0.5f;
    return static_cast<uint16_t>(sign | (floatBits(t) - 0x3f000000u));
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000000u + 0xfffu + odd;  // rebias exponent 127 -> 15 and round the 13 dropped bits
  return static_cast<uint16_t>(sign | (x >> 13));
}

GS_HOST_DEVICE inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return bitsFloat(floatBits(v) | sign);
  }
  if (e == 31)
    return bitsFloat(sign | 0x7f800000u | (m << 13));
  return bitsFloat(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace gs::format
