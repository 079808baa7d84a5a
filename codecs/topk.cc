// Top-k sparsification: keep the k = ceil(fraction * count) elements of largest magnitude as
// (uint32 index, fp32 value) pairs, indices strictly increasing. Selection is an exact radix
// select on |x|'s float bits (three histogram passes, 24 KiB of stack, no allocation); ties at
// the threshold are taken in index order, so the result is deterministic.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "codecs/codec.h"
#include "codecs/decoding_codec.h"
#include "codecs/topk_keep.h"
#include "common/error.h"
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

template <class D>
uint32_t keyAt(const typename D::T* s, size_t i) {
  return format::floatBits(static_cast<float>(D::load(s, i))) & 0x7fffffffu;
}

/// Finds the k-th largest key (k >= 1) by three 11/11/10-bit histogram passes.
template <class D>
uint32_t kthLargestKey(const typename D::T* s, size_t n, uint64_t k) {
  uint32_t hist[2048];
  uint32_t prefix = 0;  // key bits fixed so far
  uint32_t prefixMask = 0;
  const int shifts[3] = {21, 10, 0};
  const int widths[3] = {11, 11, 10};
  for (int pass = 0; pass < 3; ++pass) {
    std::memset(hist, 0, sizeof(hist));
    const uint32_t digitMask = (1u << widths[pass]) - 1u;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t key = keyAt<D>(s, i);
      if ((key & prefixMask) == prefix)
        ++hist[(key >> shifts[pass]) & digitMask];
    }
    uint64_t above = 0;
    uint32_t digit = digitMask;
    for (;; --digit) {
      if (above + hist[digit] >= k || digit == 0)
        break;
      above += hist[digit];
    }
    k -= above;
    prefix |= digit << shifts[pass];
    prefixMask |= digitMask << shifts[pass];
  }
  return prefix;
}

template <class D>
uint32_t encodeT(const void* src, size_t n, uint64_t k, uint8_t* idxOut, uint8_t* valOut) {
  const auto* s = static_cast<const typename D::T*>(src);
  if (k == 0)
    return 0;
  uint32_t threshold = 0;
  uint64_t ties = n;  // elements equal to the threshold still to take
  if (k < n) {
    threshold = kthLargestKey<D>(s, n, k);
    uint64_t greater = 0;
    for (size_t i = 0; i < n; ++i)
      greater += keyAt<D>(s, i) > threshold;
    ties = k - greater;
  }
  uint32_t out = 0;
  for (size_t i = 0; i < n && out < k; ++i) {
    const uint32_t key = keyAt<D>(s, i);
    if (key > threshold || (key == threshold && ties > 0)) {
      if (key == threshold)
        --ties;
      const uint32_t idx = static_cast<uint32_t>(i);
      const float v = static_cast<float>(D::load(s, i));
      std::memcpy(idxOut + 4 * out, &idx, 4);
      std::memcpy(valOut + 4 * out, &v, 4);
      ++out;
    }
  }
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
