#pragma once

// Private to monitoring/: the HTTP exporter behind Metrics. No prometheus-cpp header here; the
// implementation lives in exporter_prometheus.cc (or exporter_none.cc without prometheus-cpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "monitoring/metrics.h"

namespace gs::monitoring::detail {

using CollectFn = std::function<std::vector<Family>()>;

/// One HTTP server answering GET /metrics with the families of every registered source.
/// Thread-safe; sources are called on the server's threads.
class Exporter {
 public:
  virtual ~Exporter() = default;
  /// "host:port" with the port actually bound.
  virtual std::string address() const = 0;
  /// Registers a source; returns a handle for remove().
  virtual uint64_t add(CollectFn fn) = 0;
  /// Unregisters; after return the source is not called again (a scrape in flight keeps its
  /// own reference to the function object until it ends).
  virtual void remove(uint64_t handle) = 0;
};

/// True when this build has an exporter (GS_HAVE_PROMETHEUS).
bool exporterAvailable() noexcept;

/// The exporter serving `addr`: a running one of this process when the port is non-zero and
/// already served, else a new one. Throws gs::Error kSystem naming the address when it cannot
/// bind. Returns nullptr when the build has no exporter.
std::shared_ptr<Exporter> acquireExporter(const MetricsAddress& addr);

}  // namespace gs::monitoring::detail
