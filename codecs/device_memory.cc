// The factory of codecs::DeviceMemory: the CUDA runtime in GS_HAVE_CUDA builds, else an error
// naming why.
#include "codecs/device_memory.h"

#include "codecs/device_codec.h"
#include "common/error.h"
#include "gradstream/build_config.h"

#if GS_HAVE_CUDA
#include "kernels/device_memory.h"
#endif

namespace gs::codecs {

std::unique_ptr<DeviceMemory> makeCudaDeviceMemory() {
#if GS_HAVE_CUDA
  return kernels::makeDeviceMemory();
#else
  GS_CHECK(false, Errc::kUnsupported, "device buffers and CUDA streams: %s",
           deviceUnavailableReason());
  return nullptr;
#endif
}

}  // namespace gs::codecs
