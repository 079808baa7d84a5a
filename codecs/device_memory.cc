// The factory of codecs::DeviceMemory: the CUDA runtime in GS_HAVE_CUDA builds, else an error
// naming why. The interface is codecs'; kernels/device_memory.h only offers the runtime calls,
// and the adapter below maps one onto the other, so kernels/ never sees a codecs header.
#include "codecs/device_memory.h"

#include "codecs/device_codec.h"
#include "common/error.h"
#include "gradstream/build_config.h"

#if GS_HAVE_CUDA
#include "kernels/device_memory.h"
#endif

namespace gs::codecs {

#if GS_HAVE_CUDA
namespace {

// Events travel through the interface as its opaque Event*; they are CUDA events.
CUevent_st* cudaEvent(DeviceMemory::Event* event) {
  return reinterpret_cast<CUevent_st*>(event);
}

class CudaDeviceMemory final : public DeviceMemory {
 public:
  const char* name() const override { return "cuda"; }
  int deviceOf(const void* p) override { return kernels::pointerDevice(p); }
  int streamDevice(Stream stream) override { return kernels::streamDevice(stream); }
  int setDevice(int device) override { return kernels::swapCurrentDevice(device); }
  Stream createStream() override { return kernels::createStream(); }
  void destroyStream(Stream stream) noexcept override { kernels::destroyStream(stream); }
  void* allocPinned(size_t bytes) override { return kernels::allocPinned(bytes); }
  void freePinned(void* p) noexcept override { kernels::freePinned(p); }
  void copy2D(void* dst,
              size_t dstPitch,
              const void* src,
              size_t srcPitch,
              size_t width,
              size_t rows,
              Stream stream) override {
    kernels::copy2D(dst, dstPitch, src, srcPitch, width, rows, stream);
  }
  Event* createEvent() override { return reinterpret_cast<Event*>(kernels::createEvent()); }
  void destroyEvent(Event* event) noexcept override { kernels::destroyEvent(cudaEvent(event)); }
  void record(Event* event, Stream stream) override {
    kernels::recordEvent(cudaEvent(event), stream);
  }
  bool done(Event* event) override { return kernels::eventDone(cudaEvent(event)); }
  void streamWait(Stream stream, Event* event) override {
    kernels::streamWaitEvent(stream, cudaEvent(event));
  }
};

}  // namespace
#endif  // GS_HAVE_CUDA

std::unique_ptr<DeviceMemory> makeCudaDeviceMemory() {
#if GS_HAVE_CUDA
  const char* why = deviceUnavailableReason();
  GS_CHECK(why == nullptr, Errc::kUnsupported, "device buffers need a CUDA device: %s", why);
  return std::make_unique<CudaDeviceMemory>();
#else
  GS_CHECK(false, Errc::kUnsupported, "device buffers and CUDA streams: %s",
           deviceUnavailableReason());
  return nullptr;
#endif
}

}  // namespace gs::codecs
