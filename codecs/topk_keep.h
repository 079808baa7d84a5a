#pragma once

// How many elements top-k keeps: shared by the CPU codec (topk.cc) and the device path
// (device_codec.cc), which must write the same k for the same chunk.

#include <cmath>
#include <cstdint>

#include "common/types.h"

namespace gs::codecs {

/// k = ceil(fraction * count) (the product taken with a relative tolerance of 2^-23, so
/// 0.3 * 10 keeps 3), at most count, and at most count * elementSize / 8 + 512 so the encoding
/// never exceeds the raw size by more than 4096 bytes.
inline uint64_t topkKeep(float fraction, DataType dtype, uint64_t count) {
  const double x = static_cast<double>(fraction) * static_cast<double>(count);
  uint64_t k = static_cast<uint64_t>(std::ceil(x - x * 0x1p-23));
  if (k > count)
    k = count;
  const uint64_t cap = count * elementSize(dtype) / 8 + 512;
  return k > cap ? cap : k;
}

}  // namespace gs::codecs
