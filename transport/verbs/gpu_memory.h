#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gs::transport::verbs {

/// What the CUDA driver says about a pointer. The driver (libcuda.so.1) is loaded at run time
/// when present, so the verbs transport registers GPU memory without a build-time dependency
/// on CUDA; on a host without the driver every pointer is host memory.
struct PointerInfo {
  bool device = false;  // CUDA device memory
  uintptr_t base = 0;   // the allocation holding the pointer (device memory only)
  size_t size = 0;
};
PointerInfo classifyPointer(const void* pointer);

/// Exports [base, base + size) of device memory as a DMA-BUF file descriptor (the caller closes
/// it), or returns -1 when the driver cannot (no DMA-BUF support: use nvidia-peermem).
int exportDmaBuf(uintptr_t base, size_t size);

/// One line for the log: how GPU buffers would reach the NIC on this host ("GPUDirect via
/// DMA-BUF", "GPUDirect via nvidia-peermem", "no CUDA driver: host memory only", ...).
std::string gpuMemoryPath();

}  // namespace gs::transport::verbs
