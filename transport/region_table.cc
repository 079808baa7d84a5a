#include "transport/region_table.h"

#include <mutex>

#include "common/error.h"

namespace gs::transport {

uint32_t RegionTable::add(void* data, size_t size) {
  GS_CHECK(data != nullptr || size == 0, Errc::kInvalidArgument,
           "registerMemory: null pointer with %zu bytes", size);
  std::unique_lock lock(mutex_);
  GS_CHECK(nextId_ != 0, Errc::kNoMemory, "registerMemory: region ids exhausted");
  uint32_t id = nextId_++;
  regions_.emplace(id, Entry{static_cast<uint8_t*>(data), size});
  return id;
}

void RegionTable::remove(uint32_t id) noexcept {
  std::unique_lock lock(mutex_);
  regions_.erase(id);
}

bool RegionTable::find(uint32_t id, Entry* out) const noexcept {
  std::shared_lock lock(mutex_);
  auto it = regions_.find(id);
  if (it == regions_.end())
    return false;
  *out = it->second;
  return true;
}

}  // namespace gs::transport
