// Builds without prometheus-cpp: no HTTP exporter (Metrics logs a warning when an address is
// configured); snapshots and collect() still work.

#include "monitoring/exporter.h"

namespace gs::monitoring::detail {

bool exporterAvailable() noexcept {
  return false;
}

std::shared_ptr<Exporter> acquireExporter(const MetricsAddress&) {
  return nullptr;
}

}  // namespace gs::monitoring::detail
