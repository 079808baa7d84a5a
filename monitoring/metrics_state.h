#pragma once

// Private to monitoring/: the state behind a Metrics object, shared (shared_ptr) with the
// exporter so that a scrape in flight never reads freed counters.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "monitoring/metrics.h"

namespace gs::monitoring {

/// Durations of one (op, algo) pair. `state`: 0 free, 1 being claimed, 2 ready (name set).
struct AlgoSlot {
  std::atomic<int> state{0};
  char name[24] = {};
  CollectiveHistogram duration;
  std::atomic<uint64_t> bytes{0};
};

inline constexpr int kAlgoSlots = 8;  // named slots per op; one more collects "other"

struct OpState {
  std::array<AlgoSlot, kAlgoSlots + 1> algos;
  std::atomic<double> lastAlgbw{0.0};
  std::atomic<double> lastBusbw{0.0};
};

struct Metrics::State {
  int rank = 0;
  int nranks = 0;
  int localRank = 0;
  std::string transport;
  std::string comm;

  mutable std::mutex mu;  // guards links (the vector, not the counters), linkTransports, info
  std::vector<std::unique_ptr<LinkCounters>> links;
  std::vector<std::string> linkTransports;  // parallel to links: each one's transport label
  std::map<std::string, std::string> info;

  std::array<OpState, kCollectiveOps> ops;
  std::array<std::atomic<uint64_t>, kErrorKinds> errors{};
  std::array<std::atomic<double>, kMaxCodecs> compressionError;  // NaN: never set
  std::atomic<int> inProgress{0};
  // Collectives on device buffers (pinned host staging) and the bytes staged each way.
  std::atomic<uint64_t> stagedCollectives{0};
  std::atomic<uint64_t> stagedToHostBytes{0};
  std::atomic<uint64_t> stagedToDeviceBytes{0};
  std::atomic<uint64_t> bufferRegistrations{0};
  std::atomic<uint64_t> bufferRegisteredBytes{0};

  std::vector<Family> collect() const;
  Snapshot snapshot() const;
};

}  // namespace gs::monitoring
