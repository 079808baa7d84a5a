#pragma once

#include "transport/region_table.h"

namespace gs::transport::tcp {

/// tcp registers memory as an entry of the device's RegionTable (see TableRegion).
using MemoryRegion = TableRegion;

}  // namespace gs::transport::tcp
