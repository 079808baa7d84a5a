#include "transport/verbs/registration.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/verbs/gpu_memory.h"

namespace gs::transport::verbs {
namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kRemoteKeyBytes = 20;

}  // namespace

const char* memoryPathName(MemoryPath path) {
  switch (path) {
    case MemoryPath::kHost:
      return "host";
    case MemoryPath::kGpuDmaBuf:
      return "GPUDirect via DMA-BUF";
    case MemoryPath::kGpuPeerMem:
      return "GPUDirect via nvidia-peermem";
  }
  return "?";
}

RegistrationCache::RegistrationCache(ibv_pd* pd, std::string deviceName)
    : pd_(pd), deviceName_(std::move(deviceName)) {}

// Regions hold the cache alive, so every entry has been released by now; any left deregister
// with the entries.
RegistrationCache::~RegistrationCache() = default;

size_t RegistrationCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::unique_ptr<MemoryRegion> RegistrationCache::registerMemory(void* data, size_t bytes) {
  GS_CHECK(data != nullptr || bytes == 0, Errc::kInvalidArgument,
           "verbs: cannot register a null buffer of %zu bytes", bytes);
  // ibv_reg_mr refuses zero-length ranges; a region of zero bytes still needs a key.
  Entry* entry = registerRange(data, std::max<size_t>(bytes, 1));
  return std::make_unique<Region>(data, bytes, entry, shared_from_this());
}

RegistrationCache::Entry* RegistrationCache::registerRange(void* data, size_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = start + bytes;
  std::lock_guard lock(mutex_);
  for (auto& e : entries_) {
    if (e->start <= start && end <= e->end) {
      ++e->refs;
      return e.get();
    }
  }
  auto entry = std::make_unique<Entry>();
  const PointerInfo gpu = classifyPointer(data);
  if (gpu.device) {
    // Whole allocations: one registration serves every buffer carved out of it.
    entry->start = gpu.base;
    entry->end = gpu.base + gpu.size;
    const int fd = exportDmaBuf(gpu.base, gpu.size);
    if (fd >= 0) {
      entry->mr.reset(ibv_reg_dmabuf_mr(pd_, 0, gpu.size, gpu.base, fd, kAccess));
      const int err = errno;
      close(fd);
      if (entry->mr != nullptr)
        entry->path = MemoryPath::kGpuDmaBuf;
      else
        GS_LOG_INFO("verbs %s: DMA-BUF registration failed (%s); trying nvidia-peermem",
                    deviceName_.c_str(), strerror(err));
    }
    if (entry->mr == nullptr) {
      entry->mr.reset(ibv_reg_mr(pd_, reinterpret_cast<void*>(gpu.base), gpu.size, kAccess));
      entry->path = MemoryPath::kGpuPeerMem;
    }
    GS_CHECK(entry->mr != nullptr, Errc::kSystem,
             "verbs %s: cannot register %zu bytes of GPU memory at %p (neither DMA-BUF nor "
             "nvidia-peermem works): %s",
             deviceName_.c_str(), gpu.size, data, strerror(errno));
  } else {
    entry->start = start;
    entry->end = end;
    entry->mr.reset(ibv_reg_mr(pd_, data, bytes, kAccess));
    GS_CHECK(entry->mr != nullptr, Errc::kSystem,
             "verbs %s: ibv_reg_mr of %zu bytes at %p failed: %s (is the locked-memory limit, "
             "ulimit -l, too low?)",
             deviceName_.c_str(), bytes, data, strerror(errno));
  }
  entry->refs = 1;
  entries_.push_back(std::move(entry));
  return entries_.back().get();
}

void RegistrationCache::release(Entry* entry) noexcept {
  std::lock_guard lock(mutex_);
  if (--entry->refs > 0)
    return;
  entry->mr.reset();  // ibv_dereg_mr, reported by the deleter
  entries_.erase(std::find_if(entries_.begin(), entries_.end(),
                              [&](const auto& e) { return e.get() == entry; }));
}

Region::Region(void* data,
               size_t size,
               RegistrationCache::Entry* entry,
               std::shared_ptr<RegistrationCache> cache)
    : MemoryRegion(data, size), entry_(entry), cache_(std::move(cache)) {}

Region::~Region() {
  cache_->release(entry_);
}

RemoteKey Region::remoteKey() const {
  RemoteKey key;
  const uint64_t address = reinterpret_cast<uintptr_t>(data());
  const uint64_t length = size();
  const uint32_t rkey = entry_->mr->rkey;
  std::memcpy(key.bytes, &address, 8);
  std::memcpy(key.bytes + 8, &length, 8);
  std::memcpy(key.bytes + 16, &rkey, 4);
  key.length = kRemoteKeyBytes;
  return key;
}

bool parseRemoteKey(const RemoteKey& key, RemoteTarget* out) noexcept {
  if (key.length != kRemoteKeyBytes)
    return false;
  std::memcpy(&out->address, key.bytes, 8);
  std::memcpy(&out->length, key.bytes + 8, 8);
  std::memcpy(&out->rkey, key.bytes + 16, 4);
  return true;
}

}  // namespace gs::transport::verbs
