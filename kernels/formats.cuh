#pragma once

// Device traits of the wire formats: how a group of kGroup elements is written and read. The
// element math is format/block_math.h's, exactly as cpu_loops.inc uses it. Private to kernels/.

#include "format/chunk_header.h"
#include "kernels/device_common.cuh"

namespace gs::kernels::dev {

using format::CodecId;

/// Error codes of the status word (see runtime.cc for the messages, in the CPU's order).
enum StatusCode : uint32_t {
  kErrBlockSize = 1,
  kErrMetaSize = 2,
  kErrScale = 3,  // item = 2 * block + (infinite ? 1 : 0)
  kErrInt4Padding = 4,
  kErrTopkIndex = 5,  // item = 2 * j + (beyond count ? 1 : 0)
};

// Element-wise 16-bit formats.
template <bool kBf16>
struct Ew {
  static constexpr int kBytes = 2 * kGroup;
  static __device__ __forceinline__ uint16_t put(float x, bool sr, uint32_t rnd) {
    if constexpr (kBf16)
      return sr ? math::floatToBf16Sr(x, rnd) : floatToBf16(x);
    else
      return sr ? math::floatToHalfSr(x, rnd) : floatToHalf(x);
  }
  static __device__ __forceinline__ float get(uint16_t w) {
    if constexpr (kBf16)
      return bf16ToFloat(w);
    else
      return math::halfBitsToFloat(w);
  }
};

// Block formats: qmax, the quantizer, the dequantizer (of one code), bytes per group.
template <CodecId F>
struct Blk;
template <>
struct Blk<CodecId::kInt8> {
  static constexpr float kQmax = 127.0f;
  static constexpr int kBytes = kGroup;
  static __device__ __forceinline__ int32_t put(float x, float inv, bool sr, uint32_t rnd) {
    return sr ? math::quantizeInt<true>(x, inv, kQmax, rnd)
              : math::quantizeInt<false>(x, inv, kQmax, rnd);
  }
  static __device__ __forceinline__ float get(int32_t c) { return static_cast<float>(c); }
};
template <class M>
struct Fp8Blk {
  static constexpr float kQmax = M::kMax;
  static constexpr int kBytes = kGroup;
  static __device__ __forceinline__ int32_t put(float x, float inv, bool sr, uint32_t rnd) {
    return sr ? math::quantizeFp8<M, true>(x, inv, rnd) : math::quantizeFp8<M, false>(x, inv, rnd);
  }
  static __device__ __forceinline__ float get(int32_t c) {
    return math::fp8ToFloat<M>(static_cast<uint8_t>(c));
  }
};
template <>
struct Blk<CodecId::kFp8E4M3> : Fp8Blk<math::E4M3> {};
template <>
struct Blk<CodecId::kFp8E5M2> : Fp8Blk<math::E5M2> {};
template <>
struct Blk<CodecId::kInt4> {
  static constexpr float kQmax = 7.0f;
  static constexpr int kBytes = kGroup / 2;
  static __device__ __forceinline__ int32_t put(float x, float inv, bool sr, uint32_t rnd) {
    return sr ? math::quantizeInt<true>(x, inv, kQmax, rnd)
              : math::quantizeInt<false>(x, inv, kQmax, rnd);
  }
  static __device__ __forceinline__ float get(int32_t c) { return static_cast<float>(c); }
};

/// Codes of a group -> bytes on the wire (int8: the byte; fp8: the code; int4: nibble pairs).
template <CodecId F>
__device__ __forceinline__ void packCodes(const int32_t (&q)[kGroup],
                                          uint8_t (&b)[Blk<F>::kBytes]) {
  if constexpr (F == CodecId::kInt4) {
#pragma unroll
    for (int j = 0; j < static_cast<int>(kGroup) / 2; ++j)
      b[j] = math::int4Pack(q[2 * j], q[2 * j + 1]);
  } else {
#pragma unroll
    for (int j = 0; j < static_cast<int>(kGroup); ++j)
      b[j] = static_cast<uint8_t>(q[j]);
  }
}
/// Bytes of a group -> codes (int8 sign-extended, int4 nibbles sign-extended).
template <CodecId F>
__device__ __forceinline__ void unpackCodes(const uint8_t (&b)[Blk<F>::kBytes],
                                            int32_t (&q)[kGroup]) {
  if constexpr (F == CodecId::kInt4) {
#pragma unroll
    for (int j = 0; j < static_cast<int>(kGroup) / 2; ++j) {
      q[2 * j] = math::int4Low(b[j]);
      q[2 * j + 1] = math::int4High(b[j]);
    }
  } else if constexpr (F == CodecId::kInt8) {
#pragma unroll
    for (int j = 0; j < static_cast<int>(kGroup); ++j)
      q[j] = static_cast<int8_t>(b[j]);
  } else {
#pragma unroll
    for (int j = 0; j < static_cast<int>(kGroup); ++j)
      q[j] = b[j];
  }
}
/// Wire bytes of `valid` elements of a group (int4: a partial group's last nibble pair).
template <CodecId F>
__device__ __forceinline__ int groupBytes(int valid) {
  return F == CodecId::kInt4 ? (valid + 1) / 2 : valid;
}

}  // namespace gs::kernels::dev
