#pragma once

// Metrics of one communicator: the hot-path counters (monitoring/counters.h), an in-process
// snapshot for control/ and gs_comm_stats(), and the Prometheus exporter (pull, /metrics) when
// the build has prometheus-cpp and Config::metricsAddress is set. No prometheus-cpp header is
// included here; the exporter reads the same atomics at scrape time.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/error.h"
#include "monitoring/counters.h"

namespace gs::monitoring {

/// Collective kinds, in the order of stream::CollectiveKind (a static_cast maps one to the other).
/// The values of stream::CollectiveKind (the communicator casts one to the other).
enum class CollectiveOp : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv,  // point-to-point: one batch of messages run together
};
inline constexpr int kCollectiveOps = 7;
/// "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall", "sendrecv".
const char* collectiveOpName(CollectiveOp op) noexcept;

/// Error kinds counted by recordError: Errc::kInvalidArgument .. Errc::kInternal.
inline constexpr int kErrorKinds = 8;
/// Label value of an error kind: "invalid_argument", "unsupported", "no_memory", "system",
/// "remote", "timeout", "aborted", "internal"; nullptr for kOk / kInProgress.
const char* errorKindName(Errc code) noexcept;

/// Per-link figures of a snapshot (see LinkCounters for the meaning of each field).
struct LinkSnapshot {
  int peer = -1;
  std::string transport;  // what carries the link (Metrics::addLink)
  // A plain copy of each atomic of LinkCounters but the histogram (monitoring/link_counters.inc).
#define GS_LINK_COUNTER(type, field, metric, kind, scale, help) type field = 0;
#define GS_LINK_CODEC_COUNTERS(type, field, metric, kind, help) \
  std::array<type, kMaxCodecs> field{};
#define GS_LINK_INTERNAL(type, field) type field = 0;
#define GS_LINK_INTERNAL_CODECS(type, field) std::array<type, kMaxCodecs> field{};
#include "monitoring/link_counters.inc"
  /// Non-cumulative counts per bucket of kChunkLatencyBoundsNs, the last one being +Inf.
  std::array<uint64_t, ChunkLatencyHistogram::kBuckets> latencyBuckets{};
  uint64_t latencySumNs = 0;

  uint64_t latencyCount() const;
  /// Upper bound (seconds) of the bucket holding quantile q in [0, 1]; 0 without samples,
  /// +inf when it falls in the overflow bucket.
  double latencyQuantileSeconds(double q) const;
  /// bytesLogical / bytesWire (1 when nothing was sent).
  double compressionRatio() const;
};

/// Per-collective-kind figures of a snapshot (summed over algorithms).
struct OpSnapshot {
  uint64_t count = 0;
  uint64_t bytes = 0;
  double secondsTotal = 0;
  double lastAlgbw = 0;  // bytes/s of the last collective of this kind
  double lastBusbw = 0;
};

/// A consistent-enough copy of every figure of one communicator (each value is read once with
/// relaxed order; values of different counters may come from slightly different instants).
struct Snapshot {
  uint64_t takenUnixNs = 0;
  int rank = 0;
  int nranks = 0;
  // Totals over links.
  uint64_t bytesLogical = 0;
  uint64_t bytesWire = 0;
  uint64_t chunksSent = 0;
  uint64_t chunksReceived = 0;
  uint64_t bytesReceived = 0;
  uint64_t singleCopyBytes = 0;
  uint64_t creditWaitNs = 0;
  std::array<uint64_t, kMaxCodecs> chunksByCodec{};
  // Collectives and errors.
  uint64_t collectives = 0;
  bool collectiveInProgress = false;
  std::array<OpSnapshot, kCollectiveOps> ops{};
  std::array<uint64_t, kErrorKinds> errors{};  // index: -static_cast<int>(Errc) - 1
  uint64_t errorsTotal = 0;
  // Collectives on CUDA device buffers, all through pinned host staging in this version, and
  // the bytes copied device -> host (inputs) and host -> device (results).
  uint64_t stagedCollectives = 0;
  uint64_t stagedToHostBytes = 0;
  uint64_t stagedToDeviceBytes = 0;
  uint64_t bufferRegistrations = 0;  // see setBufferRegistrations
  uint64_t bufferRegisteredBytes = 0;
  std::vector<LinkSnapshot> links;  // in addLink order

  double compressionRatio() const;           // bytesLogical / bytesWire (1 when nothing was sent)
  const LinkSnapshot* link(int peer) const;  // nullptr when there is no link to peer
};

/// The exporter-neutral form of the metrics (what a scrape shows), built by Metrics::collect().
/// The Prometheus exporter converts it one to one; tests inspect it without HTTP.
struct Sample {
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;  // counter / gauge
  // Histogram: cumulative counts per upper bound (seconds), the last bound being +inf.
  std::vector<double> bounds;
  std::vector<uint64_t> cumulative;
  uint64_t count = 0;
  double sum = 0;
};
struct Family {
  enum class Type { kCounter, kGauge, kHistogram };
  std::string name;
  std::string help;
  Type type = Type::kCounter;
  std::vector<Sample> samples;
};

/// Parsed GS_METRICS_ADDR: "host:port", "[v6]:port" or a bare port (host 127.0.0.1).
struct MetricsAddress {
  std::string host;  // numeric IPv4 or IPv6 (without brackets)
  int port = 0;      // 0: ephemeral
  /// civetweb listening-port syntax: "127.0.0.1:9400" or "[::1]:9400".
  std::string bindString() const;
};
/// Parses `text` and adds localRank to a non-zero port. Throws gs::Error kInvalidArgument
/// naming GS_METRICS_ADDR when the text does not parse or the port leaves 1..65535.
MetricsAddress parseMetricsAddress(const std::string& text, int localRank);

/// All metrics of one communicator.
///
/// Lifecycle: construct at communicator setup, call addLink() / setTransportInfo() during
/// setup, then the engine updates the LinkCounters and calls beginCollective() /
/// recordCollective() / recordError(); destroy after the engine stopped.
///
/// Exporter: when Config::metricsAddress is non-empty and the build has prometheus-cpp, the
/// constructor serves GET /metrics on that address with the port offset by localRank (so the
/// ranks of one host do not collide; port 0 picks an ephemeral port). Communicators of one
/// process that resolve to the same address share one HTTP server; every series carries the
/// constant labels rank and comm (a per-process communicator index) to tell them apart.
/// Without prometheus-cpp a configured address only logs a warning; snapshots still work.
///
/// Thread safety: every method may be called from any thread. addLink() and
/// setTransportInfo() take a mutex (setup only); recordCollective(), beginCollective(),
/// recordError(), setCompressionError() and the LinkCounters methods are wait-free and never
/// allocate. snapshot()/collect() take the setup mutex briefly and allocate.
class Metrics {
 public:
  /// Throws gs::Error kInvalidArgument for a malformed Config::metricsAddress and kSystem
  /// naming the address when the exporter cannot bind it.
  Metrics(const Config& config, int rank, int nranks, int localRank, std::string transport);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  /// Counters of the link to `peer` (setup only). Idempotent: a second call for the same peer
  /// returns the same object. The reference stays valid until the Metrics object is destroyed.
  /// `transport` names what carries this link ("shm", "tcp", ...): its series carry it as their
  /// transport label instead of the communicator's (empty: the communicator's).
  LinkCounters& addLink(int peer, const std::string& transport = {});
  /// The counters of `peer`, or nullptr when addLink(peer) was not called.
  LinkCounters* link(int peer);

  /// Marks a collective as running (gs_collective_in_progress = 1); stalled-peer alerts use it.
  void beginCollective() noexcept;
  /// One finished collective: duration histogram by (op, algo), bytes, last algbw/busbw (bytes/s)
  /// and clears the in-progress mark. `algo` is a short name such as "ring" or "exchange";
  /// up to 8 distinct names per op are kept, further ones count as "other".
  void recordCollective(CollectiveOp op,
                        const char* algo,
                        double seconds,
                        uint64_t bytes,
                        double algbw,
                        double busbw) noexcept;
  /// One failed operation of the given kind; also clears the in-progress mark. kOk and
  /// kInProgress are ignored.
  void recordError(Errc kind) noexcept;
  /// One collective on device buffers run through pinned host staging, with the bytes it
  /// copied device -> host and host -> device (gs_device_collectives_total{path},
  /// gs_device_staged_bytes_total{direction}).
  void recordStaged(uint64_t toHostBytes, uint64_t toDeviceBytes) noexcept;
  /// Registrations of the caller's buffers with a transport device so far, and their bytes
  /// (gs_buffer_registrations_total, gs_buffer_registered_bytes_total): verbs pins pages at
  /// each, so this shows whether calls re-register (see gs_comm_register).
  void setBufferRegistrations(uint64_t count, uint64_t bytes) noexcept;
  /// Sampled relative error of lossy chunks of a codec (gs_compression_error{codec}).
  void setCompressionError(int codecId, double relativeError) noexcept;
  /// Transport details exported as gs_transport_info{transport, <key>=<value>...} 1. Keys are
  /// label names (e.g. device, port, gid_index, memory_path); invalid characters become '_'.
  void setTransportInfo(const std::map<std::string, std::string>& info);

  Snapshot snapshot() const;
  /// The metric families a scrape would show now.
  std::vector<Family> collect() const;
  /// "host:port" the exporter listens on (actual port), or "" when it is off.
  std::string exporterAddress() const;
  int rank() const;
  /// Value of the comm label of this communicator's series.
  const std::string& commLabel() const;

  struct State;  // shared with the exporter, which may outlive a scrape in flight

 private:
  std::shared_ptr<State> state_;
  struct ExporterRegistration;
  std::unique_ptr<ExporterRegistration> exporter_;
};

}  // namespace gs::monitoring
