// fp16 / bf16 conversions against the double-arithmetic reference in reference.h.
#include "format/half.h"

#include <cmath>
#include <cstdint>
#include <random>

#include <gtest/gtest.h>

#include "tests/unit/codecs/reference.h"

namespace gs::format {
namespace {

using namespace codecs::testing;  // the double-arithmetic references

TEST(Half, ReferenceSelfCheck) {
  // Hand-known points, so the reference itself can be trusted.
  EXPECT_EQ(refFloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(refFloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(refFloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(refFloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(refFloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(refFloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(refFloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(refFloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 quanta -> 2
  EXPECT_EQ(refFloatToHalf(0.333251953125f), 0x3555);
  EXPECT_EQ(refHalfToDouble(0x3c00), 1.0);
  EXPECT_EQ(refHalfToDouble(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(refHalfToDouble(0x7bff), 65504.0);
  EXPECT_EQ(refHalfToDouble(0x8400), -std::ldexp(1.0, -14));
}

TEST(Half, ToFloatExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = halfToFloat(static_cast<uint16_t>(h));
    const double ref = refHalfToDouble(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ref) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
  }
}

TEST(Half, RoundTripAllPatterns) {
  int nans = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const uint16_t back = floatToHalf(halfToFloat(bits));
    if (halfIsNan(bits)) {
      ++nans;
      ASSERT_TRUE(halfIsNan(back)) << std::hex << h << " -> " << back;
      EXPECT_EQ(back & 0x8000, bits & 0x8000) << std::hex << h;
    } else {
      ASSERT_EQ(back, bits) << std::hex << h;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(Half, FromFloatTiesAndNeighbours) {
  // For every pair of adjacent finite halves: the exact midpoint (a tie, must go to the even
  // one) and the floats just either side of it.
  int checked = 0;
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const double lo = refHalfToDouble(static_cast<uint16_t>(h));
      const double hi = h + 1 < 0x7c00 ? refHalfToDouble(static_cast<uint16_t>(h + 1)) : 65536.0;
      const float mid = static_cast<float>((lo + hi) / 2);  // exact in float (12 significant bits)
      ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, HUGE_VALF),
                      static_cast<float>(lo)}) {
        const float v = sign ? -x : x;
        ASSERT_EQ(floatToHalf(v), refFloatToHalf(v))
            << std::hexfloat << v << " (half " << std::hex << h << ")";
        ++checked;
      }
      // The tie itself lands on the even neighbour (or on 65536 = inf at the top).
      const uint16_t want = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
      ASSERT_EQ(floatToHalf(sign ? -mid : mid), static_cast<uint16_t>(sign | want))
          << std::hex << h;
    }
  }
  EXPECT_GT(checked, 200000);
}

TEST(Half, FromFloatSampledAgainstReference) {
  // Every 61st float bit pattern (about 70 million values would be all; this is ~70M/61),
  // covering every exponent, sign, NaN and infinity.
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 61) {
    const float f = floatOf(static_cast<uint32_t>(u));
    const uint16_t got = floatToHalf(f);
    if (std::isnan(f)) {
      if (!halfIsNan(got) || (got & 0x8000) != (std::signbit(f) ? 0x8000 : 0))
        ++mismatches;
      continue;
    }
    if (got != refFloatToHalf(f)) {
      if (++mismatches < 10)
        ADD_FAILURE() << std::hexfloat << f << " -> " << std::hex << got << " want "
                      << refFloatToHalf(f);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Half, OverflowAndSpecials) {
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // just below the tie
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);                        // tie goes to even: inf
  EXPECT_EQ(floatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(floatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(floatToHalf(3.4e38f), 0x7c00);
  EXPECT_EQ(floatToHalf(HUGE_VALF), 0x7c00);
  EXPECT_EQ(floatToHalf(-HUGE_VALF), 0xfc00);
  EXPECT_EQ(floatToHalf(0.0f), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  // Subnormals: smallest, largest, and values that round up into the normal range.
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(floatToHalf(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(floatToHalf(std::ldexp(1023.0f, -24)), 0x03ff);
  EXPECT_EQ(floatToHalf(std::ldexp(1023.5f, -24)), 0x0400);  // tie between 0x3ff and 0x400: even
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -26)), 0x0000);   // below half a quantum: zero
  EXPECT_EQ(floatToHalf(-std::ldexp(1.0f, -26)), 0x8000);  // keeps the sign
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -100)), 0x0000);
  EXPECT_EQ(floatToHalf(floatOf(1)), 0x0000);                   // float subnormal
  EXPECT_EQ(floatToHalf(std::ldexp(1.0000001f, -25)), 0x0001);  // just above the tie at 0.5 quantum
  // NaNs of every kind stay NaN with their sign, quiet.
  for (uint32_t nan :
       {0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x7f802000u, 0xffc00000u, 0xff800001u}) {
    const uint16_t h = floatToHalf(floatOf(nan));
    EXPECT_TRUE(halfIsNan(h)) << std::hex << nan << " -> " << h;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
    EXPECT_TRUE(std::isnan(halfToFloat(h)));
  }
}

TEST(BFloat16, RoundTripAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = bf16ToFloat(bits);
    EXPECT_EQ(bitsOf(f), h << 16);
    const uint16_t back = floatToBf16(f);
    if (bf16IsNan(bits)) {
      ASSERT_TRUE(bf16IsNan(back)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, bits & 0x8000);
    } else {
      ASSERT_EQ(back, bits) << std::hex << h;
    }
  }
}

TEST(BFloat16, TiesAndNeighbours) {
  for (uint32_t h = 0; h < 0x7f80; ++h) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t mid = sign | (h << 16) | 0x8000u;  // exact midpoint to the next bf16
      for (uint32_t u :
           {mid, mid - 1, mid + 1, sign | (h << 16) | 0x7fffu, sign | (h << 16) | 1u}) {
        const float f = floatOf(u);
        ASSERT_EQ(floatToBf16(f), refFloatToBf16(f)) << std::hex << u;
      }
      const uint16_t want = static_cast<uint16_t>((sign >> 16) | ((h & 1) ? h + 1 : h));
      ASSERT_EQ(floatToBf16(floatOf(mid)), want) << std::hex << mid;
    }
  }
}

TEST(BFloat16, SampledAgainstReferenceAndSpecials) {
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 127) {
    const float f = floatOf(static_cast<uint32_t>(u));
    const uint16_t got = floatToBf16(f);
    const bool ok = std::isnan(f) ? bf16IsNan(got) && (got & 0x8000) == ((u >> 16) & 0x8000)
                                  : got == refFloatToBf16(f);
    if (!ok && ++mismatches < 10)
      ADD_FAILURE() << std::hex << u << " -> " << got;
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(floatToBf16(3.4028235e38f), 0x7f80);  // FLT_MAX rounds up to inf
  EXPECT_EQ(floatToBf16(-HUGE_VALF), 0xff80);
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(floatOf(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(floatToBf16(floatOf(0x3f818000u)), 0x3f82);  // tie, even above
  // A NaN whose payload lies only in the low 16 bits must not truncate to infinity.
  for (uint32_t nan : {0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fc00000u}) {
    const uint16_t h = floatToBf16(floatOf(nan));
    EXPECT_TRUE(bf16IsNan(h)) << std::hex << nan << " -> " << h;
  }
}

}  // namespace
}  // namespace gs::format
