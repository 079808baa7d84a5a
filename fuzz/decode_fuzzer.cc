// libFuzzer target for one codec's decoder (GS_FUZZ_CODEC = the CodecId value; one binary per
// codec). Input: an 8-byte prefix choosing dtype, op, direction, count and the metadata/payload
// split, then the encoded bytes, copied into an exactly-sized heap buffer so ASan flags any read
// past them. Half of the inputs are first turned into a valid encoding of floats made from the
// bytes, so the fuzzer also explores the decode path past validation.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "codecs/codec.h"

#ifndef GS_FUZZ_CODEC
#error "define GS_FUZZ_CODEC to a CodecId value"
#endif

using namespace gs;
using namespace gs::codecs;
using namespace gs::format;

namespace {

const Codec& codec() {
  static const std::unique_ptr<Codec> c = [] {
    CodecSpec spec;
    spec.id = static_cast<CodecId>(GS_FUZZ_CODEC);
    spec.topkFraction = 0.1f;
    spec.blockSize = 16;
    return makeCodec(spec);
  }();
  return *c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8)
    return 0;
  const DataType dtypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                             DataType::kFloat64, DataType::kInt32,   DataType::kUInt8};
  const DataType dt = dtypes[data[0] % 6];
  const auto op = static_cast<ReduceOp>(data[1] % 6);  // 5 is invalid on purpose
  const bool first = data[2] & 1;
  const bool reencode = data[2] & 2;
  const bool inPlace = data[2] & 4;
  size_t count = (data[3] | (data[4] << 8)) % 4097;
  const uint8_t* rest = data + 8;
  size_t restSize = size - 8;
  const Codec& c = codec();

  std::vector<uint8_t> bytes;
  uint32_t meta, payload;
  if (reencode && c.supports(dt)) {
    // A valid encoding of elements built from the input bytes (any bit patterns, NaN included).
    count = restSize / elementSize(dt);
    bytes.resize(c.maxEncodedBytes(dt, count));
    const EncodedSize s = c.encode(dt, rest, count, bytes.data(), data[5]);
    meta = s.metaBytes;
    payload = s.payloadBytes;
    bytes.resize(meta + payload);
    // Then maybe corrupt one byte.
    if (data[6] & 1 && !bytes.empty())
      bytes[data[7] % bytes.size()] ^= static_cast<uint8_t>(data[6] | 1);
  } else {
    bytes.assign(rest, rest + restSize);
    meta = static_cast<uint32_t>((data[5] | (data[6] << 8)) % (restSize + 1));
    payload = static_cast<uint32_t>(restSize - meta);
  }
  // Exactly sized heap copy: ASan reports any read beyond meta + payload.
  std::unique_ptr<uint8_t[]> in(new uint8_t[bytes.size() ? bytes.size() : 1]);
  if (!bytes.empty())
    std::memcpy(in.get(), bytes.data(), bytes.size());
  const size_t es = elementSize(dt);
  std::unique_ptr<uint8_t[]> dst(new uint8_t[count * es + 1]);
  std::unique_ptr<uint8_t[]> operand(new uint8_t[count * es + 1]);
  std::memset(operand.get(), 0x3c, count * es + 1);
  (void)c.decode(
      {.dtype = dt, .count = count, .bytes = in.get(), .metaBytes = meta, .payloadBytes = payload},
      dst.get());
  (void)c.decodeReduce(
      {.dtype = dt, .count = count, .bytes = in.get(), .metaBytes = meta, .payloadBytes = payload},
      {op, operand.get(), first}, inPlace ? operand.get() : dst.get());
  return 0;
}
