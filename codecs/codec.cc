// Codec classes for raw and the fp16/bf16/fp8/int8/int4 codecs, the size checks shared with
// validateChunk, and makeCodec. The element loops live in cpu_loops.inc; top-k in topk.cc.
#include "codecs/codec.h"

#include <cstring>

#include "codecs/cpu_kernels.h"
#include "codecs/decoding_codec.h"
#include "codecs/reduce.h"
#include "common/error.h"
#include "format/block_math.h"

namespace gs::codecs {

using format::CodecId;
using format::kNumCodecIds;

std::unique_ptr<Codec> makeTopKCodec(float fraction);  // topk.cc

namespace {

constexpr uint64_t kSlack = 4096;  // the documented bound: count * elementSize + kSlack
constexpr uint32_t kMinBlock = 8;
constexpr uint32_t kMaxBlock = 65536;

bool isFloat(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16 ||
         t == DataType::kFloat64;
}

bool isBlock(CodecId id) {
  return id == CodecId::kFp8E4M3 || id == CodecId::kFp8E5M2 || id == CodecId::kInt8 ||
         id == CodecId::kInt4;
}

uint64_t payloadFor(CodecId id, uint64_t count) {
  switch (id) {
    case CodecId::kFp16:
    case CodecId::kBf16:
      return 2 * count;
    case CodecId::kInt4:
      return (count + 1) / 2;
    default:
      return count;  // fp8 and int8
  }
}

uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

class RawCodec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kRaw; }
  size_t maxEncodedBytes(DataType dtype, size_t count) const override {
    return count * elementSize(dtype);
  }
  bool supports(DataType dtype) const override { return isValid(dtype); }
  EncodedSize encode(
      DataType dtype, const void* src, size_t count, uint8_t* out, uint64_t) const override {
    const size_t bytes = count * elementSize(dtype);
    if (bytes != 0)
      std::memcpy(out, src, bytes);
    return EncodedSize{0, static_cast<uint32_t>(bytes)};
  }
  const char* decode(const EncodedChunk& in, void* dst) const override {
    if (const char* why = checkSizes(in))
      return why;
    if (in.payloadBytes != 0)
      std::memcpy(dst, in.bytes, in.payloadBytes);
    return nullptr;
  }
  const char* decodeReduce(const EncodedChunk& in,
                           const Reduction& reduction,
                           void* dst) const override {
    if (const char* why = checkSizes(in))
      return why;
    if (!isValid(reduction.op))
      return "invalid reduction op";
    if (reduction.incomingFirst)
      reduceInto(in.dtype, reduction.op, dst, in.bytes, reduction.operand, in.count);
    else
      reduceInto(in.dtype, reduction.op, dst, reduction.operand, in.bytes, in.count);
    return nullptr;
  }

 private:
  static const char* checkSizes(const EncodedChunk& in) {
    return checkEncodedSizes(0, in.dtype, in.count, in.metaBytes, in.payloadBytes);
  }
};

/// fp16, bf16 (element-wise) and fp8/int8/int4 (blockwise); the loops are cpu::kernels().
class CpuCodec final : public DecodingCodec {
 public:
  CpuCodec(CodecId id, cpu::Fmt fmt, bool sr, uint32_t block)
      : id_(id), fmt_(fmt), sr_(sr), block_(block) {}

  CodecId id() const override { return id_; }
  bool supports(DataType dtype) const override { return isFloat(dtype); }
  size_t maxEncodedBytes(DataType, size_t count) const override {
    return metaFor(count) + payloadFor(id_, count);
  }

  EncodedSize encode(
      DataType dtype, const void* src, size_t count, uint8_t* out, uint64_t seed) const override {
    GS_CHECK(isFloat(dtype), Errc::kInvalidArgument, "codec %s cannot encode %s (use raw)",
             codecIdName(id_), dataTypeName(dtype));
    const uint32_t meta = static_cast<uint32_t>(metaFor(count));
    if (isBlock(id_))
      std::memcpy(out, &block_, 4);
    // fp16/bf16 have no metadata (and out may be null for count 0): no pointer arithmetic.
    uint8_t* scales = isBlock(id_) ? out + 4 : out;
    uint8_t* payload = isBlock(id_) ? out + meta : out;
    cpu::kernels().encode(fmt_, dtype, src, count, block_, scales, payload, sr_,
                          format::math::srKey(seed));
    return EncodedSize{meta, static_cast<uint32_t>(payloadFor(id_, count))};
  }

 private:
  uint64_t metaFor(uint64_t count) const {
    return isBlock(id_) ? 4 + 4 * ((count + block_ - 1) / block_) : 0;
  }

  const char* run(const EncodedChunk& chunk, const Reduction* reduction, void* dst) const override {
    const uint8_t* in = chunk.bytes;
    const uint32_t meta = chunk.metaBytes;
    const uint32_t payload = chunk.payloadBytes;
    const size_t count = chunk.count;
    if (const char* why =
            checkEncodedSizes(static_cast<uint8_t>(id_), chunk.dtype, count, meta, payload))
      return why;
    uint32_t block = 0;
    if (isBlock(id_)) {
      // The block size and scales come from the wire: validate before any use.
      block = load32(in);
      if (block < kMinBlock || block > kMaxBlock || block % 8 != 0)
        return "block size in the metadata is invalid";
      const uint64_t nblocks = (count + block - 1) / block;
      if (meta != 4 + 4 * nblocks)
        return "metadata size does not match the block size and element count";
      for (uint64_t b = 0; b < nblocks; ++b) {
        const uint32_t s = load32(in + 4 + 4 * b);
        if (s & 0x80000000u)
          return "negative block scale";
        if (s == 0x7f800000u)
          return "infinite block scale";
      }
    }
    if (id_ == CodecId::kInt4 && (count & 1) && (in[meta + payload - 1] & 0xf0) != 0)
      return "int4 padding nibble after an odd element count is not zero";
    const uint8_t* scales = isBlock(id_) ? in + 4 : in;
    const uint8_t* payloadAt = isBlock(id_) ? in + meta : in;
    const Reduction none;  // plain decode: the loops ignore op and operand
    const Reduction& r = reduction != nullptr ? *reduction : none;
    cpu::kernels().decode(fmt_, chunk.dtype, reduction != nullptr, r.op, r.incomingFirst, scales,
                          block, payloadAt, count, r.operand, dst);
    return nullptr;
  }

  CodecId id_;
  cpu::Fmt fmt_;
  bool sr_;
  uint32_t block_;
};

}  // namespace

const char* checkEncodedSizes(
    uint8_t codec, DataType dtype, uint64_t count, uint32_t meta, uint32_t payload) {
  if (codec >= kNumCodecIds)
    return "unknown codec";
  if (!isValid(dtype))
    return "invalid dtype";
  const uint64_t es = elementSize(dtype);
  const auto id = static_cast<CodecId>(codec);
  if (id == CodecId::kRaw) {
    if (meta != 0)
      return "raw chunk carries metadata";
    if (payload != count * es)
      return "payload size does not match element count";
    return nullptr;
  }
  if (!isFloat(dtype))
    return "codec does not support this dtype (integer buffers use raw)";
  if (uint64_t{meta} + payload > count * es + kSlack)
    return "metadata + payload exceed the codec's bound for this element count";
  switch (id) {
    case CodecId::kFp16:
    case CodecId::kBf16:
      if (meta != 0)
        return "fp16/bf16 chunk carries metadata";
      break;
    case CodecId::kTopK:
      if (meta != payload)
        return "top-k metadata (indices) and payload (values) sizes differ";
      if (payload % 4 != 0)
        return "top-k payload size is not whole fp32 values";
      if (payload / 4 > count)
        return "top-k keeps more elements than the chunk's element count";
      return nullptr;
    default:
      if (meta < 4 || (meta - 4) % 4 != 0)
        return "block codec metadata size is malformed";
      if ((meta - 4) / 4 > (count + kMinBlock - 1) / kMinBlock || ((meta - 4) == 0) != (count == 0))
        return "block codec metadata holds a wrong number of scales";
      break;
  }
  if (payload != payloadFor(id, count))
    return "payload size does not match element count for the codec";
  return nullptr;
}

std::unique_ptr<Codec> makeCodec(const CodecSpec& spec) {
  if (isBlock(spec.id)) {
    GS_CHECK(spec.blockSize >= kMinBlock && spec.blockSize <= kMaxBlock && spec.blockSize % 8 == 0,
             Errc::kInvalidArgument, "codec block size %u must be a multiple of 8 in [8, 65536]",
             spec.blockSize);
  }
  GS_CHECK(!spec.stochastic || (spec.id != CodecId::kRaw && spec.id != CodecId::kTopK),
           Errc::kInvalidArgument, "stochastic rounding does not apply to codec %s",
           codecIdName(spec.id));
  switch (spec.id) {
    case CodecId::kRaw:
      return std::make_unique<RawCodec>();
    case CodecId::kFp16:
      return std::make_unique<CpuCodec>(spec.id, cpu::Fmt::kFp16, spec.stochastic, 0);
    case CodecId::kBf16:
      return std::make_unique<CpuCodec>(spec.id, cpu::Fmt::kBf16, spec.stochastic, 0);
    case CodecId::kFp8E4M3:
      return std::make_unique<CpuCodec>(spec.id, cpu::Fmt::kE4M3, spec.stochastic, spec.blockSize);
    case CodecId::kFp8E5M2:
      return std::make_unique<CpuCodec>(spec.id, cpu::Fmt::kE5M2, spec.stochastic, spec.blockSize);
    case CodecId::kInt8:
      return std::make_unique<CpuCodec>(spec.id, cpu::Fmt::kInt8, spec.stochastic, spec.blockSize);
    case CodecId::kInt4:
      return std::make_unique<CpuCodec>(spec.id, cpu::Fmt::kInt4, spec.stochastic, spec.blockSize);
    case CodecId::kTopK:
      GS_CHECK(spec.topkFraction > 0 && spec.topkFraction <= 1, Errc::kInvalidArgument,
               "topk fraction %g must be in (0, 1]", static_cast<double>(spec.topkFraction));
      return makeTopKCodec(spec.topkFraction);
  }
  GS_CHECK(false, Errc::kInvalidArgument, "codec id %d is unknown", static_cast<int>(spec.id));
  return nullptr;
}

}  // namespace gs::codecs
