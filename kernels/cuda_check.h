#pragma once

// Private to kernels/: the CUDA error check and the cached device figures the launchers size
// their grids from. Includes the CUDA runtime header, so only kernels/ sources include it.

#include <cstdint>

#include <cuda_runtime.h>

#include "common/error.h"

/// Throws gs::Error(kSystem) naming the call and CUDA's error string when expr fails.
#define GS_CHECK_CUDA(expr)                                                                     \
  do {                                                                                          \
    const cudaError_t gsCudaErr_ = (expr);                                                      \
    if (gsCudaErr_ != cudaSuccess)                                                              \
      ::gs::throwError(::gs::Errc::kSystem, __FILE__, __LINE__,                                 \
                       ::gs::formatString("%s: %s (%s)", #expr, cudaGetErrorString(gsCudaErr_), \
                                          cudaGetErrorName(gsCudaErr_)));                       \
  } while (0)

namespace gs::kernels {

/// Figures of the current device, queried once per device and cached (thread-safe).
struct DeviceInfo {
  int device;
  uint32_t smCount;
  uint32_t blocksPerSm;  // resident blocks of kThreads threads per SM
};
const DeviceInfo& currentDevice();

}  // namespace gs::kernels
