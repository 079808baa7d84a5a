#pragma once

#include <chrono>
#include <string>

#include "common/clock.h"
#include "transport/connection.h"

namespace gs::transport::verbs {

/// The congestion-related hardware counters of one RDMA port, read from sysfs
/// (<root>/class/infiniband/<device>/ports/<port>/hw_counters/): RoCE ECN-marked packets and
/// CNPs handled (mlx5 names), and retransmission counters (mlx5 and rxe names). They count the
/// whole port, not one connection; a device that exposes none of them yields nothing. Reads at
/// most every refresh interval and otherwise returns the last values. Not thread-safe.
class PortCounters {
 public:
  PortCounters(const std::string& device,
               int port,
               std::string sysfsRoot = "/sys",
               std::chrono::milliseconds refresh = std::chrono::milliseconds(100));

  /// Fills ecnMarked, cnpReceived and retransmits; false when the port exposes none of them.
  bool read(LinkInfo* out);

 private:
  std::string dir_;
  std::chrono::milliseconds refresh_;
  Clock::time_point last_{};
  bool any_ = false;
  LinkInfo cached_;
};

}  // namespace gs::transport::verbs
