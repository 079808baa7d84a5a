#pragma once

#include "codecs/codec.h"

namespace gs::codecs {

/// Shared shape of the codecs that decode and decode-reduce through one routine: decode() is
/// run() without reduction, decodeReduce() checks the op and runs with it. Internal to codecs/.
class DecodingCodec : public Codec {
 public:
  const char* decode(DataType dtype,
                     const uint8_t* in,
                     uint32_t meta,
                     uint32_t payload,
                     size_t count,
                     void* dst) const final {
    return run(dtype, false, ReduceOp::kSum, in, meta, payload, count, nullptr, dst, false);
  }
  const char* decodeReduce(DataType dtype,
                           ReduceOp op,
                           const uint8_t* in,
                           uint32_t meta,
                           uint32_t payload,
                           size_t count,
                           const void* operand,
                           void* dst,
                           bool incomingFirst) const final {
    if (!isValid(op))
      return "invalid reduction op";
    return run(dtype, true, op, in, meta, payload, count, operand, dst, incomingFirst);
  }

 protected:
  /// Validates, then writes dst[i] = decoded[i] or (reduce) op(operand[i], decoded[i]).
  virtual const char* run(DataType dtype,
                          bool reduce,
                          ReduceOp op,
                          const uint8_t* in,
                          uint32_t meta,
                          uint32_t payload,
                          size_t count,
                          const void* operand,
                          void* dst,
                          bool first) const = 0;
};

}  // namespace gs::codecs
