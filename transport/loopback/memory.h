#pragma once

#include <cstdint>
#include <memory>

#include "transport/memory.h"
#include "transport/region_table.h"

namespace gs::transport::loopback {

/// A region registered with a loopback device: an entry in the device's RegionTable, which the
/// peer's connection copies into. Keeps the table alive (not the device), so it may be
/// destroyed in any order relative to peers. Thread-safe to read.
class MemoryRegion final : public transport::MemoryRegion {
 public:
  MemoryRegion(void* data, size_t size, std::shared_ptr<RegionTable> table);
  ~MemoryRegion() override;

  RemoteKey remoteKey() const override { return RegionTable::keyFor(id_); }

 private:
  std::shared_ptr<RegionTable> table_;
  uint32_t id_;
};

}  // namespace gs::transport::loopback
