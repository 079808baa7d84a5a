#pragma once

// Internal to codecs/: the CPU loops of the lossy codecs, compiled twice from cpu_loops.inc and
// cpu_encode_loops.inc / cpu_decode_loops.inc (portable, and with AVX2+F16C enabled) and chosen
// once per call by runtime CPU detection. Both builds give bit-identical output (tests compare
// them; setForceScalarForTesting picks the portable one).

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace gs::codecs::cpu {

/// Wire format of the elements.
enum class Fmt : uint8_t { kFp16, kBf16, kE4M3, kE5M2, kInt8, kInt4 };

/// Element-wise formats (fp16, bf16) ignore the block arguments. For block formats `scales`
/// points at nblocks little-endian fp32 scales (any alignment) and blocks are blockSize elements
/// (a multiple of 8). `operand`/`dst` are arrays of dtype; dst may equal operand.
using EncodeFn = void(Fmt fmt,
                      DataType dtype,
                      const void* src,
                      size_t n,
                      uint32_t blockSize,
                      uint8_t* scales,
                      uint8_t* payload,
                      bool sr,
                      uint32_t srKey);

struct Kernels {
  EncodeFn* encode;
  /// reduce false: dst = decoded; true: dst = op(operand, decoded) (incomingFirst swaps).
  void (*decode)(Fmt fmt,
                 DataType dtype,
                 bool reduce,
                 ReduceOp op,
                 bool incomingFirst,
                 const uint8_t* scales,
                 uint32_t blockSize,
                 const uint8_t* payload,
                 size_t n,
                 const void* operand,
                 void* dst);
  const char* name;
};

/// The encode loops of each build (cpu_portable_encode.cc, cpu_avx2_encode.cc: built with other
/// flags than the decode loops, see cpu_encode_loops.inc); Kernels::encode points at one.
namespace portable {
EncodeFn encodeAny;
}  // namespace portable
namespace avx2 {
EncodeFn encodeAny;
}  // namespace avx2

extern const Kernels kPortableKernels;
/// fp8 code -> float, built from math::fp8ToFloat (defined in cpu_dispatch.cc).
extern const float kE4M3Table[256];
extern const float kE5M2Table[256];
extern const Kernels kAvx2Kernels;

/// The kernels for this CPU: AVX2+F16C when present and not forced off.
const Kernels& kernels();
bool avx2Supported();
/// Tests: force the portable loops (true) or return to detection (false). Not thread-safe
/// against concurrent codec calls.
void setForceScalarForTesting(bool force);

}  // namespace gs::codecs::cpu
