#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <infiniband/verbs.h>

#include "transport/memory.h"
#include "transport/verbs/handles.h"

namespace gs::transport::verbs {

/// How a registration reaches the NIC.
enum class MemoryPath : uint8_t { kHost, kGpuDmaBuf, kGpuPeerMem };
const char* memoryPathName(MemoryPath path);

/// Memory registrations of one protection domain, keyed by address range with reference
/// counts: registering a range that an existing registration covers shares it (a collective
/// whose send and receive buffers are the same memory pins it once). A registration is released
/// when its last region goes, so the cache never holds memory the application may free; callers
/// that reuse buffers across calls keep their regions (the engine's plan cache does).
///
/// Host memory is registered with ibv_reg_mr. CUDA device memory (detected through the driver
/// at run time) is registered whole-allocation through DMA-BUF (ibv_reg_dmabuf_mr), falling
/// back to ibv_reg_mr for nvidia-peermem. Thread-safe.
class RegistrationCache : public std::enable_shared_from_this<RegistrationCache> {
 public:
  RegistrationCache(ibv_pd* pd, std::string deviceName);
  ~RegistrationCache();

  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t bytes);
  /// Live registrations (distinct pinned ranges), for tests.
  size_t size() const;

  struct Entry {
    uintptr_t start = 0;
    uintptr_t end = 0;
    VerbsPtr<ibv_mr> mr;
    int refs = 0;
    MemoryPath path = MemoryPath::kHost;
  };
  void release(Entry* entry) noexcept;

 private:
  Entry* registerRange(void* data, size_t bytes);

  ibv_pd* pd_;
  std::string deviceName_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Entry>> entries_;
};

/// A region of a verbs device: a range inside a shared registration. Its RemoteKey carries the
/// rkey, the address and the length (20 bytes), which a peer's postWrite checks its writes
/// against before the NIC enforces them.
class Region final : public MemoryRegion {
 public:
  Region(void* data,
         size_t size,
         RegistrationCache::Entry* entry,
         std::shared_ptr<RegistrationCache> cache);
  ~Region() override;

  RemoteKey remoteKey() const override;
  uint32_t lkey() const { return entry_->mr->lkey; }
  MemoryPath path() const { return entry_->path; }

 private:
  RegistrationCache::Entry* entry_;
  std::shared_ptr<RegistrationCache> cache_;
};

/// The fields of a verbs RemoteKey; false when the key is not one (wrong length).
struct RemoteTarget {
  uint64_t address = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};
bool parseRemoteKey(const RemoteKey& key, RemoteTarget* out) noexcept;

}  // namespace gs::transport::verbs
