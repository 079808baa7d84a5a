// Top-k sparsification: keep the k = ceil(fraction * count) elements of largest magnitude as
// (uint32 index, fp32 value) pairs, indices strictly increasing. Selection is an exact radix
// select on the key format::math::topkKey (|x|'s float bits, every NaN one common key above
// +Inf; kthLargestKey; for large chunks encodeBySample gets the same result from one pass);
// ties at the threshold are taken in index order, so the result is deterministic and the same
// as kernels/topk.cu's whatever the NaN payloads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "codecs/codec.h"
#include "codecs/decoding_codec.h"
#include "codecs/topk_keep.h"
#include "common/error.h"
#include "format/block_math.h"
#include "format/half.h"

namespace gs::codecs {

using format::CodecId;

namespace {

struct TF32 {
  using T = float;
  using C = float;
  static C load(const T* p, size_t i) { return p[i]; }
  static void store(T* p, size_t i, C v) { p[i] = v; }
};
struct TF64 {
  using T = double;
  using C = double;
  static C load(const T* p, size_t i) { return p[i]; }
  static void store(T* p, size_t i, C v) { p[i] = v; }
};
struct TF16 {
  using T = uint16_t;
  using C = float;
  static C load(const T* p, size_t i) {
    const float f = format::halfToFloat(p[i]);
    uint32_t u = format::floatBits(f);
    return (u & 0x7fffffffu) > 0x7f800000u ? format::bitsFloat(u | 0x00400000u) : f;
  }
  static void store(T* p, size_t i, C v) { p[i] = format::floatToHalf(v); }
};
struct TBF16 {
  using T = uint16_t;
  using C = float;
  static C load(const T* p, size_t i) { return format::bf16ToFloat(p[i]); }
  static void store(T* p, size_t i, C v) { p[i] = format::floatToBf16(v); }
};

template <class C>
C applyOp(ReduceOp op, C a, C b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      return a != a ? a : (b != b ? b : (b < a ? b : a));
    case ReduceOp::kMax:
      return a != a ? a : (b != b ? b : (a < b ? b : a));
  }
  return a;
}

/// The selection key of s[i] (format::math::topkKey of its float value).
template <class D>
uint32_t keyAt(const typename D::T* s, size_t i) {
  return format::math::topkKey(static_cast<float>(D::load(s, i)));
}

/// Four keys as one GCC/clang vector: the group test of forEachMatch written so that it compiles
/// to SIMD compares on any target (auto-vectorization does not manage it).
using Keys4 = uint32_t __attribute__((vector_size(16)));
using SKeys4 = int32_t __attribute__((vector_size(16)));

/// Bit j set when the key of s[i + j] satisfies pred, for j < 16.
template <class D, class Pred>
uint32_t matchBits(const typename D::T* s, size_t i, Pred pred) {
  if constexpr (std::is_same_v<D, TF32>) {
    Keys4 bits = {0, 0, 0, 0};
    Keys4 weight = {1, 2, 4, 8};
    for (size_t j = 0; j < 16; j += 4, weight <<= 4) {
      Keys4 key;
      std::memcpy(&key, s + i + j, sizeof(key));
      key &= 0x7fffffffu;
      // topkKey on four lanes: a NaN's bits (above +Inf's) become kTopkNanKey, all ones. The
      // keys are below 2^31 here, so the compare may be signed (one instruction on SSE2).
      static_assert(format::math::kTopkNanKey == 0xffffffffu);
      key |= reinterpret_cast<Keys4>(reinterpret_cast<SKeys4>(key) > 0x7f800000);
      bits |= reinterpret_cast<Keys4>(pred(key)) & weight;
    }
    return bits[0] | bits[1] | bits[2] | bits[3];
  } else {
    uint32_t bits = 0;
    for (size_t j = 0; j < 16; ++j)
      bits |= static_cast<uint32_t>(static_cast<bool>(pred(keyAt<D>(s, i + j)))) << j;
    return bits;
  }
}

/// Calls fn(i, key) in index order for every element whose key satisfies pred, until fn returns
/// false. pred (generic: it gets a uint32_t or a Keys4) is tested on 16 keys at a time without
/// branches, and fn runs only for the matches, which in every use are a small fraction.
template <class D, class Pred, class Fn>
void forEachMatch(const typename D::T* s, size_t n, Pred pred, Fn fn) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (uint32_t bits = matchBits<D>(s, i, pred); bits != 0; bits &= bits - 1) {
      const size_t at = i + static_cast<size_t>(__builtin_ctz(bits));
      if (!fn(at, keyAt<D>(s, at)))
        return;
    }
  }
  for (; i < n; ++i) {
    const uint32_t key = keyAt<D>(s, i);
    if (pred(key) && !fn(i, key))
      return;
  }
}

/// One step of the radix select: the largest digit whose count, added to the counts above it,
/// reaches k; k becomes the rank still to find among the keys with that digit.
inline uint32_t pickDigit(const uint32_t* hist, uint32_t digitMask, uint64_t* k) {
  uint64_t above = 0;
  uint32_t digit = digitMask;
  for (;; --digit) {
    if (above + hist[digit] >= *k || digit == 0)
      break;
    above += hist[digit];
  }
  *k -= above;
  return digit;
}

/// The radix select's three 11/11/10-bit digits of the key.
constexpr int kShifts[3] = {21, 10, 0};
constexpr int kWidths[3] = {11, 11, 10};

/// The radix select's passes from `pass` on over keys held in memory, among those that match
/// the digits already chosen (prefix, under prefixMask), from rank *k; returns the k-th largest.
inline uint32_t selectAmong(const uint32_t* keys,
                            size_t count,
                            int pass,
                            uint32_t prefix,
                            uint32_t prefixMask,
                            uint64_t* k) {
  uint32_t hist[2048];
  for (; pass < 3; ++pass) {
    std::memset(hist, 0, sizeof(hist));
    const uint32_t digitMask = (1u << kWidths[pass]) - 1u;
    for (size_t j = 0; j < count; ++j)
      if ((keys[j] & prefixMask) == prefix)
        ++hist[(keys[j] >> kShifts[pass]) & digitMask];
    prefix |= pickDigit(hist, digitMask, k) << kShifts[pass];
    prefixMask |= digitMask << kShifts[pass];
  }
  return prefix;
}

/// The k-th largest key (1 <= k < n), and in *k how many elements equal to it the top k take.
/// An exact radix select on three 11/11/10-bit digits. The first pass histograms every key (four
/// interleaved histograms, so repeated digits do not serialize on one counter); the elements
/// with the chosen first digit (a small fraction, unless the data say otherwise) are then copied
/// out and the other two digits resolved among them. Each pass leaves in *k the rank within the
/// keys that share the digits chosen so far, so at the end *k is k minus the count of keys above
/// the threshold: the ties to take.
template <class D>
uint32_t kthLargestKey(const typename D::T* s, size_t n, uint64_t* k) {
  constexpr uint32_t kDigits0 = 1u << kWidths[0];
  uint32_t hist4[4][kDigits0] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int w = 0; w < 4; ++w)
      ++hist4[w][keyAt<D>(s, i + w) >> kShifts[0]];
  for (; i < n; ++i)
    ++hist4[0][keyAt<D>(s, i) >> kShifts[0]];
  uint32_t hist[kDigits0];
  for (uint32_t d = 0; d < kDigits0; ++d)
    hist[d] = hist4[0][d] + hist4[1][d] + hist4[2][d] + hist4[3][d];
  const uint32_t digit = pickDigit(hist, kDigits0 - 1u, k);
  const uint32_t prefix = digit << kShifts[0];
  const uint32_t prefixMask = (kDigits0 - 1u) << kShifts[0];
  auto sameFirstDigit = [digit](auto key) { return (key >> kShifts[0]) == digit; };
  if (hist[digit] <= n / 8) {
    std::vector<uint32_t> keys;
    keys.reserve(hist[digit]);
    forEachMatch<D>(s, n, sameFirstDigit, [&](size_t, uint32_t key) {
      keys.push_back(key);
      return true;
    });
    return selectAmong(keys.data(), keys.size(), 1, prefix, prefixMask, k);
  }
  // Many candidates: resolve the other digits by scanning the input again instead.
  uint32_t resolved = prefix;
  uint32_t resolvedMask = prefixMask;
  for (int pass = 1; pass < 3; ++pass) {
    std::memset(hist, 0, sizeof(hist));
    const uint32_t digitMask = (1u << kWidths[pass]) - 1u;
    forEachMatch<D>(
        s, n, [&](auto key) { return (key & resolvedMask) == resolved; },
        [&](size_t, uint32_t key) {
          ++hist[(key >> kShifts[pass]) & digitMask];
          return true;
        });
    resolved |= pickDigit(hist, digitMask, k) << kShifts[pass];
    resolvedMask |= digitMask << kShifts[pass];
  }
  return resolved;
}

/// Top-k's fast path for large chunks: guesses from an evenly spaced sample a key `lo` a little
/// below the k-th largest, copies out (index, key) of every element with key >= lo in one pass
/// (the vectorized test of forEachMatch), selects among the copies and writes the kept ones from
/// them. Exact whenever at least k keys are >= lo (then the k-th largest and everything the
/// top k keep is among the copies), which is checked, so the sample only decides the speed;
/// returns false, having written nothing, when it missed or too many elements were copied.
template <class D>
bool encodeBySample(
    const typename D::T* s, size_t n, uint64_t k, uint8_t* idxOut, uint8_t* valOut) {
  constexpr size_t kSample = 2048;
  uint32_t sample[kSample];
  const size_t stride = n / kSample;
  for (size_t j = 0; j < kSample; ++j)
    sample[j] = keyAt<D>(s, j * stride + stride / 2);
  // The k-th largest's expected rank in the sample (0 = largest), plus a margin of 2.5 standard
  // deviations of that rank and a constant: a miss is rare and costs the exact select after it.
  const double rank = static_cast<double>(k) * kSample / static_cast<double>(n);
  const size_t rankLo =
      std::min(static_cast<size_t>(rank + 2.5 * std::sqrt(rank) + 4.0), kSample - 1);
  std::nth_element(sample, sample + rankLo, sample + kSample, std::greater<uint32_t>());
  const uint32_t lo = sample[rankLo];
  const double expected = static_cast<double>(n) * static_cast<double>(rankLo + 1) / kSample;
  const size_t cap = std::min(n / 4, static_cast<size_t>(1.5 * expected) + 1024);
  std::unique_ptr<uint32_t[]> idx(new uint32_t[cap]), keys(new uint32_t[cap]);
  size_t got = 0;
  bool overflow = false;
  forEachMatch<D>(
      s, n, [lo](auto key) { return key >= lo; },
      [&](size_t i, uint32_t key) {
        if (got == cap) {
          overflow = true;
          return false;
        }
        idx[got] = static_cast<uint32_t>(i);
        keys[got++] = key;
        return true;
      });
  if (overflow || got < k)
    return false;
  uint64_t ties = k;
  const uint32_t threshold = selectAmong(keys.get(), got, 0, 0, 0, &ties);
  uint32_t out = 0;
  for (size_t j = 0; j < got && out < k; ++j) {
    if (keys[j] < threshold || (keys[j] == threshold && ties == 0))
      continue;
    if (keys[j] == threshold)
      --ties;
    const float v = static_cast<float>(D::load(s, idx[j]));
    std::memcpy(idxOut + 4 * out, &idx[j], 4);
    std::memcpy(valOut + 4 * out, &v, 4);
    ++out;
  }
  return true;
}

template <class D>
uint32_t encodeT(const void* src, size_t n, uint64_t k, uint8_t* idxOut, uint8_t* valOut) {
  const auto* s = static_cast<const typename D::T*>(src);
  if (k == 0)
    return 0;
  constexpr size_t kMinSampled = 1u << 16;  // below, the second pass costs little
  if (k < n && n >= kMinSampled && encodeBySample<D>(s, n, k, idxOut, valOut))
    return static_cast<uint32_t>(k);
  uint32_t threshold = 0;
  uint64_t ties = n;  // elements equal to the threshold still to take
  if (k < n) {
    ties = k;
    threshold = kthLargestKey<D>(s, n, &ties);
  }
  uint32_t out = 0;
  forEachMatch<D>(
      s, n, [threshold](auto key) { return key >= threshold; },
      [&](size_t i, uint32_t key) {
        if (key == threshold) {
          if (ties == 0)
            return true;
          --ties;
        }
        const uint32_t idx = static_cast<uint32_t>(i);
        const float v = static_cast<float>(D::load(s, i));
        std::memcpy(idxOut + 4 * out, &idx, 4);
        std::memcpy(valOut + 4 * out, &v, 4);
        return ++out < k;
      });
  return out;
}

template <class D>
void decodeT(bool reduce,
             ReduceOp op,
             bool first,
             const uint8_t* idx,
             const uint8_t* val,
             uint32_t k,
             size_t n,
             const void* operand,
             void* dst) {
  using C = typename D::C;
  auto* d = static_cast<typename D::T*>(dst);
  const auto* o = static_cast<const typename D::T*>(operand);
  auto at = [&](uint32_t j, uint32_t* i, float* v) {
    std::memcpy(i, idx + 4 * j, 4);
    std::memcpy(v, val + 4 * j, 4);
  };
  if (!reduce || op == ReduceOp::kSum || op == ReduceOp::kAvg) {
    // Untouched elements: 0 (decode) or op(operand, 0) == operand (sum), then the kept ones.
    if (!reduce) {
      for (size_t i = 0; i < n; ++i)
        D::store(d, i, C(0));
    } else if (d != o && n != 0) {
      std::memcpy(d, o, n * sizeof(typename D::T));
    }
    for (uint32_t j = 0; j < k; ++j) {
      uint32_t i;
      float v;
      at(j, &i, &v);
      if (!reduce)
        D::store(d, i, static_cast<C>(v));
      else
        D::store(d, i,
                 first ? static_cast<C>(v) + D::load(d, i) : D::load(d, i) + static_cast<C>(v));
    }
    return;
  }
  // min/max/prod: every element reduces with its decoded value (0 where not kept).
  uint32_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    C v = 0;
    if (j < k) {
      uint32_t ji;
      float jv;
      at(j, &ji, &jv);
      if (ji == i) {
        v = static_cast<C>(jv);
        ++j;
      }
    }
    const C a = D::load(o, i);
    D::store(d, i, first ? applyOp<C>(op, v, a) : applyOp<C>(op, a, v));
  }
}

class TopKCodec final : public DecodingCodec {
 public:
  explicit TopKCodec(float fraction) : fraction_(fraction) {}
  CodecId id() const override { return CodecId::kTopK; }
  bool supports(DataType t) const override {
    return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16 ||
           t == DataType::kFloat64;
  }
  uint64_t keep(DataType dtype, uint64_t count) const { return topkKeep(fraction_, dtype, count); }
  size_t maxEncodedBytes(DataType dtype, size_t count) const override {
    return 8 * keep(dtype, count);
  }
  EncodedSize encode(
      DataType dtype, const void* src, size_t count, uint8_t* out, uint64_t) const override {
    const uint64_t k = keep(dtype, count);
    uint8_t* idx = out;
    uint8_t* val = out + 4 * k;
    uint32_t got = 0;
    switch (dtype) {
      case DataType::kFloat32:
        got = encodeT<TF32>(src, count, k, idx, val);
        break;
      case DataType::kFloat64:
        got = encodeT<TF64>(src, count, k, idx, val);
        break;
      case DataType::kFloat16:
        got = encodeT<TF16>(src, count, k, idx, val);
        break;
      case DataType::kBFloat16:
        got = encodeT<TBF16>(src, count, k, idx, val);
        break;
      default:
        GS_CHECK(false, Errc::kInvalidArgument, "codec topk cannot encode %s (use raw)",
                 dataTypeName(dtype));
    }
    (void)got;  // == k by construction
    return EncodedSize{static_cast<uint32_t>(4 * k), static_cast<uint32_t>(4 * k)};
  }

 private:
  const char* run(const EncodedChunk& chunk, const Reduction* reduction, void* dst) const override {
    const uint8_t* in = chunk.bytes;
    const uint32_t meta = chunk.metaBytes;
    const size_t count = chunk.count;
    if (const char* why = checkEncodedSizes(static_cast<uint8_t>(CodecId::kTopK), chunk.dtype,
                                            count, meta, chunk.payloadBytes))
      return why;
    const uint32_t k = meta / 4;
    // Indices come from the wire: strictly increasing (no duplicates) and inside the chunk.
    int64_t prev = -1;
    for (uint32_t j = 0; j < k; ++j) {
      uint32_t i;
      std::memcpy(&i, in + 4 * j, 4);
      if (static_cast<int64_t>(i) <= prev)
        return "top-k indices are not strictly increasing";
      if (i >= count)
        return "top-k index beyond the chunk's element count";
      prev = i;
    }
    const uint8_t* val = in + meta;
    const Reduction none;  // plain decode: decodeT ignores op and operand
    const Reduction& r = reduction != nullptr ? *reduction : none;
    const bool reduce = reduction != nullptr;
    switch (chunk.dtype) {
      case DataType::kFloat32:
        decodeT<TF32>(reduce, r.op, r.incomingFirst, in, val, k, count, r.operand, dst);
        break;
      case DataType::kFloat64:
        decodeT<TF64>(reduce, r.op, r.incomingFirst, in, val, k, count, r.operand, dst);
        break;
      case DataType::kFloat16:
        decodeT<TF16>(reduce, r.op, r.incomingFirst, in, val, k, count, r.operand, dst);
        break;
      case DataType::kBFloat16:
        decodeT<TBF16>(reduce, r.op, r.incomingFirst, in, val, k, count, r.operand, dst);
        break;
      default:
        return "codec does not support this dtype";
    }
    return nullptr;
  }

  float fraction_;
};

}  // namespace

std::unique_ptr<Codec> makeTopKCodec(float fraction) {
  return std::make_unique<TopKCodec>(fraction);
}

}  // namespace gs::codecs
