#pragma once

// Inputs of the device-buffer tests, shared by the fake-runtime tests (tests/unit/control) and
// the GPU ones (tests/gpu), so both check the same values.
#include <cmath>
#include <cstddef>

namespace gs::testing {

/// Element i of rank r's input: small integers, exact in float32 sums of a few ranks.
inline float inputValue(int rank, size_t i) {
  return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 1000) - 300.f;
}

/// Element i of rank r's gradient in iteration iter: smooth, different every iteration, not
/// exact under lossy codecs (error feedback has something to carry).
inline float gradient(int rank, size_t i, int iter) {
  return std::sin(0.0013f * static_cast<float>(i) + 0.7f * static_cast<float>(rank + iter)) *
         (1.f + 0.25f * static_cast<float>(iter));
}

}  // namespace gs::testing
