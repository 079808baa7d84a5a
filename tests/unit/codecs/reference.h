#pragma once

// Reference conversions for the codec tests, written from the IEEE 754 definitions with
// double arithmetic (frexp/ldexp/nearbyint), independent of format/half.h's bit tricks.

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace gs::codecs::testing {

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Value of an IEEE binary16 bit pattern (NaN for NaNs).
inline double refHalfToDouble(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 31)
    return m ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (e == 0)
    return sign * std::ldexp(static_cast<double>(m), -24);
  return sign * std::ldexp(1024.0 + m, e - 25);
}

/// Rounds x (not NaN) to a format with `mantissaBits` fraction bits, minimum normal exponent
/// `emin` and largest finite exponent `emax`, round-to-nearest-even, overflowing to infinity.
/// Returns the rounded magnitude as a double (may be +inf), sign handled by the caller.
inline double refRound(double a, int mantissaBits, int emin, int emax) {
  if (a == 0 || std::isinf(a))
    return a;
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): unbiased exponent is e - 1
  int exp = e - 1;
  if (exp < emin)
    exp = emin;  // subnormal: fixed quantum
  const double quantum = std::ldexp(1.0, exp - mantissaBits);
  const double q = a / quantum;        // exact: power-of-two scaling
  const double r = std::nearbyint(q);  // ties to even (default rounding mode)
  const double v = r * quantum;
  const double maxFinite = std::ldexp(2.0 - std::ldexp(1.0, -mantissaBits), emax);
  return v > maxFinite ? HUGE_VAL : v;
}

/// float -> binary16 bits, RNE; NaN -> some NaN with the sign kept.
inline uint16_t refFloatToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f))
    return sign | 0x7e00;
  const double v = refRound(std::fabs(static_cast<double>(f)), 10, -14, 15);
  if (std::isinf(v))
    return sign | 0x7c00;
  if (v < std::ldexp(1.0, -14))
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(v * std::ldexp(1.0, 24)));
  int e;
  const double frac = std::frexp(v, &e);  // v = frac * 2^e
  const int biased = e - 1 + 15;
  const int mant = static_cast<int>(frac * 2048.0) - 1024;
  return static_cast<uint16_t>(sign | (biased << 10) | mant);
}

/// float -> bfloat16 bits, RNE; NaN -> some NaN with the sign kept.
inline uint16_t refFloatToBf16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f))
    return sign | 0x7fc0;
  const double v = refRound(std::fabs(static_cast<double>(f)), 7, -126, 127);
  if (std::isinf(v))
    return sign | 0x7f80;
  // v is exactly representable as a float whose low 16 bits are zero.
  const uint32_t bits = bitsOf(static_cast<float>(v));
  return static_cast<uint16_t>(sign | (bits >> 16));
}

inline bool halfIsNan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}
inline bool bf16IsNan(uint16_t h) {
  return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

}  // namespace gs::codecs::testing
