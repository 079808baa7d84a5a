// The CUDA runtime calls behind codecs::DeviceMemory (kernels/device_memory.h): pointer
// attributes, cudaHostAlloc, cudaMemcpy2DAsync (cudaMemcpyDefault: unified addressing tells host
// from device), non-blocking streams and events without timing.
#include "kernels/device_memory.h"

#include "kernels/cuda_check.h"

namespace gs::kernels {

int pointerDevice(const void* p) {
  if (p == nullptr)
    return -1;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // memory CUDA does not know: plain host memory
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice ? attr.device : -1;
}

int streamDevice(CUstream_st* stream) {
  int device = 0;
#if CUDART_VERSION >= 12080
  if (stream != nullptr) {
    GS_CHECK_CUDA(cudaStreamGetDevice(stream, &device));
    return device;
  }
#else
  (void)stream;  // older runtimes cannot tell: assume the current device's
#endif
  GS_CHECK_CUDA(cudaGetDevice(&device));
  return device;
}

int swapCurrentDevice(int device) {
  int previous = 0;
  GS_CHECK_CUDA(cudaGetDevice(&previous));
  if (previous != device)
    GS_CHECK_CUDA(cudaSetDevice(device));
  return previous;
}

CUstream_st* createStream() {
  cudaStream_t s = nullptr;
  GS_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroyStream(CUstream_st* stream) noexcept {
  if (stream != nullptr)
    (void)cudaStreamDestroy(stream);
}

void* allocPinned(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    GS_CHECK(false, Errc::kNoMemory, "cudaHostAlloc of %zu bytes of pinned staging memory: %s",
             bytes, cudaGetErrorString(e));
  }
  return p;
}

void freePinned(void* p) noexcept {
  if (p != nullptr)
    (void)cudaFreeHost(p);
}

void copy2D(void* dst,
            size_t dstPitch,
            const void* src,
            size_t srcPitch,
            size_t width,
            size_t rows,
            CUstream_st* stream) {
  if (width == 0 || rows == 0)
    return;
  // One row, or pitches beyond what cudaMemcpy2D takes (cudaDevAttrMaxPitch, 2^31 - 1 on
  // current GPUs; a reduce-scatter block over 2 GiB): a copy per row.
  constexpr size_t kMaxPitch = (size_t{1} << 31) - 1;
  if (rows == 1 || dstPitch > kMaxPitch || srcPitch > kMaxPitch) {
    for (size_t r = 0; r < rows; ++r) {
      GS_CHECK_CUDA(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + r * dstPitch,
                                    static_cast<const uint8_t*>(src) + r * srcPitch, width,
                                    cudaMemcpyDefault, stream));
    }
    return;
  }
  GS_CHECK_CUDA(
      cudaMemcpy2DAsync(dst, dstPitch, src, srcPitch, width, rows, cudaMemcpyDefault, stream));
}

CUevent_st* createEvent() {
  cudaEvent_t e = nullptr;
  GS_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void destroyEvent(CUevent_st* event) noexcept {
  if (event != nullptr)
    (void)cudaEventDestroy(event);
}

void recordEvent(CUevent_st* event, CUstream_st* stream) {
  GS_CHECK_CUDA(cudaEventRecord(event, stream));
}

bool eventDone(CUevent_st* event) {
  const cudaError_t e = cudaEventQuery(event);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  GS_CHECK_CUDA(e);
  return true;
}

void streamWaitEvent(CUstream_st* stream, CUevent_st* event) {
  GS_CHECK_CUDA(cudaStreamWaitEvent(stream, event, 0));
}

}  // namespace gs::kernels
