#pragma once

#include "codecs/codec.h"

namespace gs::codecs {

/// Shared shape of the codecs that decode and decode-reduce through one routine: decode() is
/// run() without reduction, decodeReduce() checks the op and runs with it. Internal to codecs/.
class DecodingCodec : public Codec {
 public:
  const char* decode(const EncodedChunk& in, void* dst) const final {
    return run(in, nullptr, dst);
  }
  const char* decodeReduce(const EncodedChunk& in,
                           const Reduction& reduction,
                           void* dst) const final {
    if (!isValid(reduction.op))
      return "invalid reduction op";
    return run(in, &reduction, dst);
  }

 protected:
  /// Validates, then writes dst[i] = decoded[i] (reduction null) or reduces as it says.
  virtual const char* run(const EncodedChunk& in, const Reduction* reduction, void* dst) const = 0;
};

}  // namespace gs::codecs
