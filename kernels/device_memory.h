#pragma once

// The CUDA runtime behind codecs::DeviceMemory (plain C++ header; reached only through
// codecs/device_memory.h).

#include <memory>

#include "codecs/device_memory.h"

namespace gs::kernels {

/// Throws gs::Error(kUnsupported) with deviceUnavailableReason() where no device can be used.
std::unique_ptr<codecs::DeviceMemory> makeDeviceMemory();

}  // namespace gs::kernels
