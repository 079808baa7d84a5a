// reduceInto / reduceInPlace / finalizeAverage for every (dtype, op) against a plain reference.
// Integer arithmetic is checked against wide (128-bit) arithmetic reduced mod 2^bits, so
// wraparound is pinned down; the library must implement it without UB (run under UBSan).
#include "codecs/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/types.h"
#include "tests/unit/codecs/reference.h"

namespace gs::codecs {
namespace {

using namespace testing;

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                               DataType::kFloat64, DataType::kInt32,   DataType::kInt64,
                               DataType::kUInt8};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kProd};

// A value in a type-independent form for the reference: floating types as double (16-bit
// formats decoded by the reference decoder), integers as i128.
struct Val {
  bool isFloat;
  double d = 0;
  i128 i = 0;
};

Val load(DataType t, const uint8_t* p) {
  Val v{t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
        t == DataType::kBFloat16};
  switch (t) {
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      v.d = f;
      break;
    }
    case DataType::kFloat64:
      std::memcpy(&v.d, p, 8);
      break;
    case DataType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      v.d = refHalfToDouble(h);
      break;
    }
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      v.d = floatOf(uint32_t{h} << 16);
      break;
    }
    case DataType::kInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      v.i = x;
      break;
    }
    case DataType::kInt64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      v.i = x;
      break;
    }
    case DataType::kUInt8:
      v.i = *p;
      break;
  }
  return v;
}

// Stores a reference result: floats rounded by the reference encoders, integers mod 2^bits.
void store(DataType t, const Val& v, uint8_t* p) {
  switch (t) {
    case DataType::kFloat32: {
      float f = static_cast<float>(v.d);
      std::memcpy(p, &f, 4);
      break;
    }
    case DataType::kFloat64:
      std::memcpy(p, &v.d, 8);
      break;
    case DataType::kFloat16: {
      uint16_t h = refFloatToHalf(static_cast<float>(v.d));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::kBFloat16: {
      uint16_t h = refFloatToBf16(static_cast<float>(v.d));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::kInt32: {
      uint32_t x = static_cast<uint32_t>(static_cast<u128>(v.i));
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::kInt64: {
      uint64_t x = static_cast<uint64_t>(static_cast<u128>(v.i));
      std::memcpy(p, &x, 8);
      break;
    }
    case DataType::kUInt8:
      *p = static_cast<uint8_t>(static_cast<u128>(v.i));
      break;
  }
}

// The arithmetic precision of the reduction: fp32 for fp32/fp16/bf16, fp64 for fp64.
double inCompute(DataType t, double x) {
  return t == DataType::kFloat64 ? x : static_cast<double>(static_cast<float>(x));
}

Val refOp(DataType t, ReduceOp op, const Val& a, const Val& b) {
  Val r = a;
  if (a.isFloat) {
    const bool f64 = t == DataType::kFloat64;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        r.d = f64 ? a.d + b.d
                  : static_cast<double>(static_cast<float>(a.d) + static_cast<float>(b.d));
        break;
      case ReduceOp::kProd:
        r.d = f64 ? a.d * b.d
                  : static_cast<double>(static_cast<float>(a.d) * static_cast<float>(b.d));
        break;
      case ReduceOp::kMin:
        r.d = std::isnan(a.d) || std::isnan(b.d) ? NAN : std::fmin(a.d, b.d);
        break;
      case ReduceOp::kMax:
        r.d = std::isnan(a.d) || std::isnan(b.d) ? NAN : std::fmax(a.d, b.d);
        break;
    }
    r.d = inCompute(t, r.d);
    return r;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      r.i = a.i + b.i;
      break;
    case ReduceOp::kProd:
      r.i = static_cast<i128>(static_cast<u128>(a.i) * static_cast<u128>(b.i));
      break;
    case ReduceOp::kMin:
      r.i = a.i < b.i ? a.i : b.i;
      break;
    case ReduceOp::kMax:
      r.i = a.i < b.i ? b.i : a.i;
      break;
  }
  return r;
}

// Compares one element: NaN matches any NaN, +0 and -0 match for min/max (either is right),
// everything else bit-exact.
bool same(DataType t, ReduceOp op, const uint8_t* got, const uint8_t* want) {
  const size_t n = elementSize(t);
  if (std::memcmp(got, want, n) == 0)
    return true;
  Val g = load(t, got), w = load(t, want);
  if (!g.isFloat)
    return false;
  if (std::isnan(g.d) && std::isnan(w.d))
    return true;
  if ((op == ReduceOp::kMin || op == ReduceOp::kMax) && g.d == 0 && w.d == 0)
    return true;
  return false;
}

std::string describe(DataType t, const uint8_t* p) {
  Val v = load(t, p);
  return v.isFloat ? std::to_string(v.d) : std::to_string(static_cast<long long>(v.i));
}

// Random elements of each type, with specials mixed in.
std::vector<uint8_t> randomData(DataType t, size_t n, std::mt19937_64& rng, bool specials) {
  std::vector<uint8_t> out(n * elementSize(t));
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = out.data() + i * elementSize(t);
    const uint64_t r = rng();
    switch (t) {
      case DataType::kFloat32: {
        float f = std::ldexp(static_cast<float>(static_cast<int32_t>(r)) / 2147483648.0f,
                             static_cast<int>(r >> 40) % 20 - 10);
        if (specials && r % 17 == 0)
          f = floatOf(static_cast<uint32_t>(r >> 32));  // any pattern
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::kFloat64: {
        double d = std::ldexp(static_cast<double>(static_cast<int64_t>(r)) / 9.2e18,
                              static_cast<int>(r >> 50) % 40 - 20);
        if (specials && r % 17 == 0) {
          uint64_t b = rng();
          std::memcpy(&d, &b, 8);
        }
        std::memcpy(p, &d, 8);
        break;
      }
      case DataType::kFloat16:
      case DataType::kBFloat16: {
        uint16_t h = static_cast<uint16_t>(r);
        if (!specials || r % 5 != 0) {
          // Mostly moderate magnitudes so sums and products stay in range and round often.
          const float f = std::ldexp(static_cast<float>(static_cast<int16_t>(r >> 16)) / 32768.0f,
                                     static_cast<int>(r >> 40) % 12 - 6);
          h = t == DataType::kFloat16 ? refFloatToHalf(f) : refFloatToBf16(f);
        }
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kInt32: {
        int32_t x = static_cast<int32_t>(r);
        if (specials && r % 7 == 0)
          x = (r & 8) ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int32_t>::max();
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::kInt64: {
        int64_t x = static_cast<int64_t>(r);
        if (specials && r % 7 == 0)
          x = (r & 8) ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
        std::memcpy(p, &x, 8);
        break;
      }
      case DataType::kUInt8:
        *p = static_cast<uint8_t>(r);
        break;
    }
  }
  return out;
}

class ReduceAll : public ::testing::TestWithParam<std::tuple<DataType, ReduceOp>> {};

TEST_P(ReduceAll, MatchesReference) {
  const auto [t, op] = GetParam();
  const size_t es = elementSize(t);
  std::mt19937_64 rng(static_cast<uint64_t>(t) * 131 + static_cast<uint64_t>(op));
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{4099}}) {
    const auto a = randomData(t, n, rng, true);
    const auto b = randomData(t, n, rng, true);
    std::vector<uint8_t> want(n * es);
    for (size_t i = 0; i < n; ++i) {
      store(t, refOp(t, op, load(t, &a[i * es]), load(t, &b[i * es])), &want[i * es]);
    }
    // Out of place.
    std::vector<uint8_t> dst(n * es + 16, 0xcd);
    reduceInto(t, op, dst.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(same(t, op, &dst[i * es], &want[i * es]))
          << dataTypeName(t) << " " << reduceOpName(op) << " n=" << n << " i=" << i << ": "
          << describe(t, &a[i * es]) << " op " << describe(t, &b[i * es]) << " gave "
          << describe(t, &dst[i * es]) << ", want " << describe(t, &want[i * es]);
    }
    for (size_t i = n * es; i < dst.size(); ++i)
      ASSERT_EQ(dst[i], 0xcd) << "wrote past the end";
    // dst aliasing a, and dst aliasing b.
    auto inA = a;
    reduceInto(t, op, inA.data(), inA.data(), b.data(), n);
    auto inB = b;
    reduceInto(t, op, inB.data(), a.data(), inB.data(), n);
    auto inPlace = a;
    reduceInPlace(t, op, inPlace.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(same(t, op, &inA[i * es], &want[i * es])) << "dst == a, i=" << i;
      ASSERT_TRUE(same(t, op, &inB[i * es], &want[i * es])) << "dst == b, i=" << i;
      ASSERT_TRUE(same(t, op, &inPlace[i * es], &want[i * es])) << "reduceInPlace, i=" << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryTypeAndOp,
                         ReduceAll,
                         ::testing::Combine(::testing::ValuesIn(kTypes), ::testing::ValuesIn(kOps)),
                         [](const auto& p) {
                           return std::string(dataTypeName(std::get<0>(p.param))) + "_" +
                                  reduceOpName(std::get<1>(p.param));
                         });

TEST(Reduce, IntegerWraparoundIsTwosComplement) {
  {
    std::vector<int32_t> a = {INT32_MAX, INT32_MIN, -1, 65536, INT32_MIN};
    std::vector<int32_t> b = {1, -1, INT32_MIN, 65536, -1};
    std::vector<int32_t> sum(5), prod(5);
    reduceInto(DataType::kInt32, ReduceOp::kSum, sum.data(), a.data(), b.data(), 5);
    reduceInto(DataType::kInt32, ReduceOp::kProd, prod.data(), a.data(), b.data(), 5);
    EXPECT_EQ(sum, (std::vector<int32_t>{INT32_MIN, INT32_MAX, INT32_MAX, 131072, INT32_MAX}));
    // 2^16 * 2^16 = 2^32 = 0 mod 2^32; INT32_MIN * -1 = INT32_MIN; INT32_MAX * 1.
    EXPECT_EQ(prod, (std::vector<int32_t>{INT32_MAX, INT32_MIN, INT32_MIN, 0, INT32_MIN}));
  }
  {
    std::vector<int64_t> a = {INT64_MAX, INT64_MIN, int64_t{1} << 32};
    std::vector<int64_t> b = {1, -1, int64_t{1} << 32};
    std::vector<int64_t> sum(3), prod(3);
    reduceInto(DataType::kInt64, ReduceOp::kSum, sum.data(), a.data(), b.data(), 3);
    reduceInto(DataType::kInt64, ReduceOp::kProd, prod.data(), a.data(), b.data(), 3);
    EXPECT_EQ(sum, (std::vector<int64_t>{INT64_MIN, INT64_MAX, int64_t{1} << 33}));
    EXPECT_EQ(prod, (std::vector<int64_t>{INT64_MAX, INT64_MIN, 0}));
  }
  {
    std::vector<uint8_t> a = {255, 200, 16, 0};
    std::vector<uint8_t> b = {1, 100, 16, 255};
    std::vector<uint8_t> sum(4), prod(4);
    reduceInto(DataType::kUInt8, ReduceOp::kSum, sum.data(), a.data(), b.data(), 4);
    reduceInto(DataType::kUInt8, ReduceOp::kProd, prod.data(), a.data(), b.data(), 4);
    EXPECT_EQ(sum, (std::vector<uint8_t>{0, 44, 32, 255}));
    EXPECT_EQ(prod, (std::vector<uint8_t>{255, 32, 0, 0}));  // 20000 mod 256 = 32; 256 mod 256 = 0
  }
}

TEST(Reduce, MinMaxPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = {nan, 1.0f, nan, -3.0f};
  std::vector<float> b = {1.0f, nan, nan, 2.0f};
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<float> out(4);
    reduceInto(DataType::kFloat32, op, out.data(), a.data(), b.data(), 4);
    EXPECT_TRUE(std::isnan(out[0])) << reduceOpName(op);
    EXPECT_TRUE(std::isnan(out[1])) << reduceOpName(op);
    EXPECT_TRUE(std::isnan(out[2])) << reduceOpName(op);
    EXPECT_EQ(out[3], op == ReduceOp::kMin ? -3.0f : 2.0f);
  }
  std::vector<double> da = {1.0, std::nan("")}, db = {std::nan(""), 1.0}, dout(2);
  reduceInto(DataType::kFloat64, ReduceOp::kMax, dout.data(), da.data(), db.data(), 2);
  EXPECT_TRUE(std::isnan(dout[0]) && std::isnan(dout[1]));
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    const uint16_t hnan = t == DataType::kFloat16 ? 0x7e00 : 0x7fc0;
    const uint16_t one = t == DataType::kFloat16 ? 0x3c00 : 0x3f80;
    std::vector<uint16_t> ha = {hnan, one}, hb = {one, hnan}, hout(2);
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      reduceInto(t, op, hout.data(), ha.data(), hb.data(), 2);
      const bool isNan0 = t == DataType::kFloat16 ? halfIsNan(hout[0]) : bf16IsNan(hout[0]);
      const bool isNan1 = t == DataType::kFloat16 ? halfIsNan(hout[1]) : bf16IsNan(hout[1]);
      EXPECT_TRUE(isNan0 && isNan1) << dataTypeName(t) << " " << reduceOpName(op);
    }
  }
}

TEST(Reduce, HalfRoundsOncePerCall) {
  // 2048 + 1 is not representable in fp16 (spacing 2 there): the tie rounds to even, 2048.
  // 2048 + 3 = 2051 -> tie between 2050 and 2052 -> 2052.
  std::vector<uint16_t> a = {refFloatToHalf(2048.0f), refFloatToHalf(2048.0f)};
  std::vector<uint16_t> b = {refFloatToHalf(1.0f), refFloatToHalf(3.0f)};
  std::vector<uint16_t> out(2);
  reduceInto(DataType::kFloat16, ReduceOp::kSum, out.data(), a.data(), b.data(), 2);
  EXPECT_EQ(refHalfToDouble(out[0]), 2048.0);
  EXPECT_EQ(refHalfToDouble(out[1]), 2052.0);
  // Overflow of an fp16 sum goes to infinity.
  std::vector<uint16_t> big = {0x7bff}, outBig(1);
  reduceInto(DataType::kFloat16, ReduceOp::kSum, outBig.data(), big.data(), big.data(), 1);
  EXPECT_EQ(outBig[0], 0x7c00);
}

TEST(FinalizeAverage, EveryTypeAgainstReference) {
  std::mt19937_64 rng(42);
  for (DataType t : kTypes) {
    const size_t es = elementSize(t);
    for (int nranks : {2, 3, 7, 8, 64, 255}) {
      const size_t n = 777;
      const auto data = randomData(t, n, rng, true);
      auto got = data;
      finalizeAverage(t, ReduceOp::kAvg, got.data(), n, nranks);
      for (size_t i = 0; i < n; ++i) {
        Val v = load(t, &data[i * es]);
        if (v.isFloat) {
          v.d = t == DataType::kFloat64
                    ? v.d / nranks
                    : static_cast<double>(static_cast<float>(v.d) / static_cast<float>(nranks));
        } else {
          v.i = v.i / nranks;  // C++ division truncates toward zero
        }
        uint8_t want[8];
        store(t, v, want);
        ASSERT_TRUE(same(t, ReduceOp::kAvg, &got[i * es], want))
            << dataTypeName(t) << " /" << nranks << " i=" << i << ": " << describe(t, &data[i * es])
            << " gave " << describe(t, &got[i * es]) << " want " << describe(t, want);
      }
    }
  }
}

TEST(FinalizeAverage, TruncatesTowardZeroAndIsANoOpOtherwise) {
  std::vector<int32_t> x = {-7, 7, INT32_MIN, -1, 1};
  finalizeAverage(DataType::kInt32, ReduceOp::kAvg, x.data(), x.size(), 2);
  EXPECT_EQ(x, (std::vector<int32_t>{-3, 3, INT32_MIN / 2, 0, 0}));
  std::vector<float> f = {3.0f, -1.0f};
  finalizeAverage(DataType::kFloat32, ReduceOp::kAvg, f.data(), 2, 4);
  EXPECT_EQ(f, (std::vector<float>{0.75f, -0.25f}));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
    std::vector<float> g = {3.0f, -1.0f};
    finalizeAverage(DataType::kFloat32, op, g.data(), 2, 4);
    EXPECT_EQ(g, (std::vector<float>{3.0f, -1.0f})) << reduceOpName(op);
  }
  std::vector<float> g = {3.0f};
  finalizeAverage(DataType::kFloat32, ReduceOp::kAvg, g.data(), 1, 1);
  EXPECT_EQ(g[0], 3.0f);
}

// Library bug (reported): finalizeAverage(kUInt8, kAvg, ..., nranks) converts nranks to the
// storage type (uint8_t) before dividing, so nranks >= 256 divides by nranks mod 256: 300
// ranks divide by 44, and 256 ranks divide by zero (SIGFPE). Enable once fixed.
TEST(FinalizeAverage, Uint8WithManyRanks) {
  for (int nranks : {300, 511, 1000}) {
    std::vector<uint8_t> x = {255, 200, 44, 0};
    finalizeAverage(DataType::kUInt8, ReduceOp::kAvg, x.data(), x.size(), nranks);
    EXPECT_EQ(x, (std::vector<uint8_t>{0, 0, 0, 0})) << nranks << " ranks";
  }
}

}  // namespace
}  // namespace gs::codecs
