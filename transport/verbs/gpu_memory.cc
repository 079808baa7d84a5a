#include "transport/verbs/gpu_memory.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <mutex>

namespace gs::transport::verbs {
namespace {

// The few driver API entry points used, declared with plain C types (values from the CUDA
// driver API documentation; they are part of its stable ABI).
using CuResult = int;
using CuDevicePtr = unsigned long long;
constexpr CuResult kCudaSuccess = 0;
constexpr int kPointerAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr unsigned kMemoryTypeDevice = 2;       // CU_MEMORYTYPE_DEVICE
constexpr int kRangeHandleDmaBufFd = 1;         // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

struct Driver {
  CuResult (*pointerGetAttribute)(void*, int, CuDevicePtr) = nullptr;
  CuResult (*memGetAddressRange)(CuDevicePtr*, size_t*, CuDevicePtr) = nullptr;
  CuResult (*memGetHandleForAddressRange)(void*, CuDevicePtr, size_t, int, unsigned long long) =
      nullptr;
  bool loaded() const { return pointerGetAttribute != nullptr && memGetAddressRange != nullptr; }
};

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
      return;
    d.pointerGetAttribute =
        reinterpret_cast<decltype(d.pointerGetAttribute)>(dlsym(lib, "cuPointerGetAttribute"));
    d.memGetAddressRange =
        reinterpret_cast<decltype(d.memGetAddressRange)>(dlsym(lib, "cuMemGetAddressRange_v2"));
    d.memGetHandleForAddressRange = reinterpret_cast<decltype(d.memGetHandleForAddressRange)>(
        dlsym(lib, "cuMemGetHandleForAddressRange"));
    // The library stays loaded for the life of the process, like the driver itself.
  });
  return d;
}

}  // namespace

PointerInfo classifyPointer(const void* pointer) {
  PointerInfo info;
  const Driver& d = driver();
  if (!d.loaded())
    return info;
  unsigned type = 0;
  const auto address = reinterpret_cast<CuDevicePtr>(pointer);
  // Host memory, or a process that never initialized CUDA, answers with an error: host.
  if (d.pointerGetAttribute(&type, kPointerAttributeMemoryType, address) != kCudaSuccess ||
      type != kMemoryTypeDevice) {
    return info;
  }
  CuDevicePtr base = 0;
  size_t size = 0;
  if (d.memGetAddressRange(&base, &size, address) != kCudaSuccess)
    return info;
  info.device = true;
  info.base = static_cast<uintptr_t>(base);
  info.size = size;
  return info;
}

int exportDmaBuf(uintptr_t base, size_t size) {
  const Driver& d = driver();
  if (d.memGetHandleForAddressRange == nullptr)
    return -1;
  int fd = -1;
  if (d.memGetHandleForAddressRange(&fd, static_cast<CuDevicePtr>(base), size, kRangeHandleDmaBufFd,
                                    0) != kCudaSuccess) {
    return -1;
  }
  return fd;
}

std::string gpuMemoryPath() {
  const Driver& d = driver();
  if (!d.loaded())
    return "no CUDA driver: host memory only";
  struct stat st {};
  const bool peermem = stat("/sys/module/nvidia_peermem", &st) == 0;
  if (d.memGetHandleForAddressRange != nullptr)
    return peermem ? "GPUDirect via DMA-BUF (nvidia-peermem as fallback)" : "GPUDirect via DMA-BUF";
  return peermem ? "GPUDirect via nvidia-peermem" : "CUDA driver without DMA-BUF or peermem";
}

}  // namespace gs::transport::verbs
