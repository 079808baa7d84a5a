#include "transport/tcp/memory.h"

#include <utility>

namespace gs::transport::tcp {

MemoryRegion::MemoryRegion(void* data, size_t size, std::shared_ptr<RegionTable> table)
    : transport::MemoryRegion(data, size), table_(std::move(table)), id_(table_->add(data, size)) {}

MemoryRegion::~MemoryRegion() { table_->remove(id_); }

}  // namespace gs::transport::tcp
