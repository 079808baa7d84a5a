#pragma once

#include <cstdint>
#include <memory>

#include "transport/memory.h"
#include "transport/region_table.h"

namespace gs::transport::tcp {

/// A region registered with a tcp device: an entry in the device's RegionTable, which the
/// receive path looks up by the id in each frame header and reads payloads straight into.
/// Deregistering a region while a peer may still write into it is the caller's error (as with
/// RDMA); the table keeps ids unique so a late frame is rejected, not misdirected.
/// Thread-safe to read.
class MemoryRegion final : public transport::MemoryRegion {
 public:
  MemoryRegion(void* data, size_t size, std::shared_ptr<RegionTable> table);
  ~MemoryRegion() override;

  RemoteKey remoteKey() const override { return RegionTable::keyFor(id_); }

 private:
  std::shared_ptr<RegionTable> table_;
  uint32_t id_;
};

}  // namespace gs::transport::tcp
