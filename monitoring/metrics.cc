#include "monitoring/metrics.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "common/log.h"
#include "monitoring/exporter.h"
#include "monitoring/metrics_state.h"

namespace gs::monitoring {

const char* collectiveOpName(CollectiveOp op) noexcept {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "allreduce";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllGather:
      return "allgather";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kReduce:
      return "reduce";
    case CollectiveOp::kAllToAll:
      return "alltoall";
    case CollectiveOp::kSendRecv:
      return "sendrecv";
  }
  return "unknown";
}

const char* errorKindName(Errc code) noexcept {
  switch (code) {
    case Errc::kInvalidArgument:
      return "invalid_argument";
    case Errc::kUnsupported:
      return "unsupported";
    case Errc::kNoMemory:
      return "no_memory";
    case Errc::kSystem:
      return "system";
    case Errc::kRemote:
      return "remote";
    case Errc::kTimeout:
      return "timeout";
    case Errc::kAborted:
      return "aborted";
    case Errc::kInternal:
      return "internal";
    case Errc::kOk:
    case Errc::kInProgress:
      break;
  }
  return nullptr;
}

// ---- address -------------------------------------------------------------------------------

std::string MetricsAddress::bindString() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

MetricsAddress parseMetricsAddress(const std::string& text, int localRank) {
  auto bad = [&](const char* why) {
    throwError(Errc::kInvalidArgument, __FILE__, __LINE__,
               formatString("GS_METRICS_ADDR '%s': %s (expected host:port, [v6]:port or port, "
                            "host a numeric address such as 127.0.0.1)",
                            text.c_str(), why));
  };
  MetricsAddress addr;
  std::string portText;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      bad("unterminated [IPv6] or missing :port");
    addr.host = text.substr(1, close - 1);
    portText = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      addr.host = "127.0.0.1";
      portText = text;
    } else {
      if (text.find(':') != colon)
        bad("IPv6 addresses need brackets");
      addr.host = text.substr(0, colon);
      portText = text.substr(colon + 1);
    }
  }
  if (addr.host.empty())
    bad("empty host");
  unsigned char buf[sizeof(in6_addr)];
  bool v6 = addr.host.find(':') != std::string::npos;
  if (inet_pton(v6 ? AF_INET6 : AF_INET, addr.host.c_str(), buf) != 1)
    bad("host is not a numeric IP address");
  if (portText.empty() || portText.size() > 5 ||
      portText.find_first_not_of("0123456789") != std::string::npos)
    bad("port is not a number");
  long port = std::strtol(portText.c_str(), nullptr, 10);
  if (port > 65535)
    bad("port out of range");
  if (localRank < 0)
    bad("negative local rank");
  if (port != 0) {
    port += localRank;
    if (port > 65535) {
      throwError(Errc::kInvalidArgument, __FILE__, __LINE__,
                 formatString("GS_METRICS_ADDR '%s': port + local rank %d exceeds 65535",
                              text.c_str(), localRank));
    }
  }
  addr.port = static_cast<int>(port);
  return addr;
}

// ---- snapshot helpers ----------------------------------------------------------------------

uint64_t LinkSnapshot::latencyCount() const {
  uint64_t n = 0;
  for (uint64_t c : latencyBuckets)
    n += c;
  return n;
}

double LinkSnapshot::latencyQuantileSeconds(double q) const {
  uint64_t n = latencyCount();
  if (n == 0)
    return 0;
  q = std::fmin(std::fmax(q, 0.0), 1.0);
  auto rankNeeded = static_cast<uint64_t>(std::ceil(q * static_cast<double>(n)));
  if (rankNeeded == 0)
    rankNeeded = 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < latencyBuckets.size(); ++i) {
    seen += latencyBuckets[i];
    if (seen >= rankNeeded) {
      return i < kChunkLatencyBoundsNs.size() ? static_cast<double>(kChunkLatencyBoundsNs[i]) * 1e-9
                                              : std::numeric_limits<double>::infinity();
    }
  }
  return std::numeric_limits<double>::infinity();
}

double LinkSnapshot::compressionRatio() const {
  return bytesWire == 0 ? 1.0 : static_cast<double>(bytesLogical) / static_cast<double>(bytesWire);
}

double Snapshot::compressionRatio() const {
  return bytesWire == 0 ? 1.0 : static_cast<double>(bytesLogical) / static_cast<double>(bytesWire);
}

const LinkSnapshot* Snapshot::link(int peer) const {
  for (const auto& l : links) {
    if (l.peer == peer)
      return &l;
  }
  return nullptr;
}

Snapshot Metrics::State::snapshot() const {
  constexpr auto r = std::memory_order_relaxed;
  Snapshot s;
  s.takenUnixNs = unixNowNsCoarse();
  s.rank = rank;
  s.nranks = nranks;
  {
    std::lock_guard<std::mutex> lock(mu);
    s.links.reserve(links.size());
    for (size_t i = 0; i < links.size(); ++i) {
      const auto& lc = links[i];
      LinkSnapshot l;
      l.peer = lc->peer;
      l.transport = linkTransports[i];
#define GS_LINK_COUNTER(type, field, metric, kind, scale, help) l.field = lc->field.load(r);
#define GS_LINK_CODEC_COUNTERS(type, field, metric, kind, help) \
  for (int c = 0; c < kMaxCodecs; ++c)                          \
    l.field[c] = lc->field[c].load(r);
#define GS_LINK_INTERNAL(type, field) GS_LINK_COUNTER(type, field, , , , )
#define GS_LINK_INTERNAL_CODECS(type, field) GS_LINK_CODEC_COUNTERS(type, field, , , )
#include "monitoring/link_counters.inc"
      for (size_t b = 0; b < l.latencyBuckets.size(); ++b)
        l.latencyBuckets[b] = lc->chunkLatency.counts[b].load(r);
      l.latencySumNs = lc->chunkLatency.sumNs.load(r);
      s.links.push_back(l);
    }
  }
  for (const auto& l : s.links) {
    s.bytesLogical += l.bytesLogical;
    s.bytesWire += l.bytesWire;
    s.chunksSent += l.chunksSent;
    s.chunksReceived += l.chunksReceived;
    s.bytesReceived += l.bytesReceived;
    s.singleCopyBytes += l.singleCopyBytes;
    s.creditWaitNs += l.creditWaitNs;
    for (int c = 0; c < kMaxCodecs; ++c)
      s.chunksByCodec[c] += l.chunksByCodec[c];
  }
  for (int o = 0; o < kCollectiveOps; ++o) {
    const OpState& op = ops[o];
    OpSnapshot& out = s.ops[o];
    for (const AlgoSlot& slot : op.algos) {
      if (slot.state.load(std::memory_order_acquire) != 2)
        continue;
      for (const auto& c : slot.duration.counts)
        out.count += c.load(r);
      out.secondsTotal += static_cast<double>(slot.duration.sumNs.load(r)) * 1e-9;
      out.bytes += slot.bytes.load(r);
    }
    out.lastAlgbw = op.lastAlgbw.load(r);
    out.lastBusbw = op.lastBusbw.load(r);
    s.collectives += out.count;
  }
  s.collectiveInProgress = inProgress.load(r) != 0;
  for (int e = 0; e < kErrorKinds; ++e) {
    s.errors[e] = errors[e].load(r);
    s.errorsTotal += s.errors[e];
  }
  s.stagedCollectives = stagedCollectives.load(r);
  s.stagedToHostBytes = stagedToHostBytes.load(r);
  s.stagedToDeviceBytes = stagedToDeviceBytes.load(r);
  s.bufferRegistrations = bufferRegistrations.load(r);
  s.bufferRegisteredBytes = bufferRegisteredBytes.load(r);
  return s;
}

// ---- Metrics -------------------------------------------------------------------------------

struct Metrics::ExporterRegistration {
  std::shared_ptr<detail::Exporter> exporter;
  uint64_t handle = 0;
  ~ExporterRegistration() {
    if (exporter)
      exporter->remove(handle);
  }
};

namespace {
std::atomic<uint64_t> gNextComm{0};
}  // namespace

Metrics::Metrics(const Config& config, int rank, int nranks, int localRank, std::string transport)
    : state_(std::make_shared<State>()) {
  state_->rank = rank;
  state_->nranks = nranks;
  state_->localRank = localRank;
  state_->transport = std::move(transport);
  state_->comm = std::to_string(gNextComm.fetch_add(1));
  for (auto& e : state_->compressionError)
    e.store(std::numeric_limits<double>::quiet_NaN(), std::memory_order_relaxed);
  for (OpState& op : state_->ops) {
    AlgoSlot& other = op.algos[kAlgoSlots];
    std::strncpy(other.name, "other", sizeof(other.name) - 1);
    other.state.store(2, std::memory_order_release);
  }
  if (config.metricsAddress.empty())
    return;
  MetricsAddress addr = parseMetricsAddress(config.metricsAddress, localRank);
  if (!detail::exporterAvailable()) {
    GS_LOG_WARN(
        "GS_METRICS_ADDR=%s ignored: this build has no Prometheus exporter "
        "(configure with prometheus-cpp); in-process statistics still work",
        config.metricsAddress.c_str());
    return;
  }
  exporter_ = std::make_unique<ExporterRegistration>();
  exporter_->exporter = detail::acquireExporter(addr);
  std::shared_ptr<const State> state = state_;
  exporter_->handle = exporter_->exporter->add([state] { return state->collect(); });
  GS_LOG_INFO("rank %d: metrics served on http://%s/metrics (comm %s)", rank,
              exporter_->exporter->address().c_str(), state_->comm.c_str());
}

Metrics::~Metrics() = default;

LinkCounters& Metrics::addLink(int peer, const std::string& transport) {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto& l : state_->links) {
    if (l->peer == peer)
      return *l;
  }
  state_->links.push_back(std::make_unique<LinkCounters>(peer));
  state_->linkTransports.push_back(transport.empty() ? state_->transport : transport);
  return *state_->links.back();
}

LinkCounters* Metrics::link(int peer) {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto& l : state_->links) {
    if (l->peer == peer)
      return l.get();
  }
  return nullptr;
}

void Metrics::beginCollective() noexcept {
  state_->inProgress.store(1, std::memory_order_relaxed);
}

namespace {

// Finds or claims the slot named `algo` without locks: slots are claimed once (0 -> 1 -> 2)
// and never released, so a reader that sees state 2 may read the name without a lock.
AlgoSlot& findAlgoSlot(OpState& op, const char* algo) noexcept {
  if (algo == nullptr || *algo == '\0')
    algo = "default";
  for (int i = 0; i < kAlgoSlots; ++i) {
    AlgoSlot& slot = op.algos[i];
    int st = slot.state.load(std::memory_order_acquire);
    if (st == 0) {
      int expected = 0;
      if (slot.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        std::strncpy(slot.name, algo, sizeof(slot.name) - 1);
        slot.state.store(2, std::memory_order_release);
        return slot;
      }
      st = expected;
    }
    while (st == 1) {  // another thread is writing the name: a few instructions away
      std::this_thread::yield();
      st = slot.state.load(std::memory_order_acquire);
    }
    if (std::strncmp(slot.name, algo, sizeof(slot.name) - 1) == 0)
      return slot;
  }
  return op.algos[kAlgoSlots];
}

}  // namespace

void Metrics::recordCollective(CollectiveOp op,
                               const char* algo,
                               double seconds,
                               uint64_t bytes,
                               double algbw,
                               double busbw) noexcept {
  auto idx = static_cast<unsigned>(op);
  if (idx >= kCollectiveOps)
    return;
  OpState& o = state_->ops[idx];
  AlgoSlot& slot = findAlgoSlot(o, algo);
  double ns = seconds > 0 ? seconds * 1e9 : 0.0;
  slot.duration.observe(kCollectiveBoundsNs,
                        ns >= 1.8e19 ? UINT64_MAX / 2 : static_cast<uint64_t>(ns));
  slot.bytes.fetch_add(bytes, std::memory_order_relaxed);
  o.lastAlgbw.store(algbw, std::memory_order_relaxed);
  o.lastBusbw.store(busbw, std::memory_order_relaxed);
  state_->inProgress.store(0, std::memory_order_relaxed);
}

void Metrics::recordError(Errc kind) noexcept {
  int idx = -static_cast<int>(kind) - 1;
  if (idx < 0 || idx >= kErrorKinds)
    return;
  state_->errors[idx].fetch_add(1, std::memory_order_relaxed);
  state_->inProgress.store(0, std::memory_order_relaxed);
}

void Metrics::setBufferRegistrations(uint64_t count, uint64_t bytes) noexcept {
  state_->bufferRegistrations.store(count, std::memory_order_relaxed);
  state_->bufferRegisteredBytes.store(bytes, std::memory_order_relaxed);
}

void Metrics::recordStaged(uint64_t toHostBytes, uint64_t toDeviceBytes) noexcept {
  state_->stagedCollectives.fetch_add(1, std::memory_order_relaxed);
  state_->stagedToHostBytes.fetch_add(toHostBytes, std::memory_order_relaxed);
  state_->stagedToDeviceBytes.fetch_add(toDeviceBytes, std::memory_order_relaxed);
}

void Metrics::setCompressionError(int codecId, double relativeError) noexcept {
  if (codecId < 0 || codecId >= kMaxCodecs)
    return;
  state_->compressionError[codecId].store(relativeError, std::memory_order_relaxed);
}

void Metrics::setTransportInfo(const std::map<std::string, std::string>& info) {
  std::map<std::string, std::string> clean;
  for (const auto& [key, value] : info) {
    std::string k = key;
    for (char& ch : k) {
      bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
      if (!ok)
        ch = '_';
    }
    if (k.empty() || (k[0] >= '0' && k[0] <= '9'))
      k = "_" + k;
    if (k == "rank" || k == "comm" || k == "transport" || k.rfind("__", 0) == 0)
      k = "info_" + k;
    clean[k] = value;
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->info = std::move(clean);
}

Snapshot Metrics::snapshot() const {
  return state_->snapshot();
}

std::vector<Family> Metrics::collect() const {
  return state_->collect();
}

std::string Metrics::exporterAddress() const {
  return exporter_ ? exporter_->exporter->address() : std::string();
}

int Metrics::rank() const {
  return state_->rank;
}

const std::string& Metrics::commLabel() const {
  return state_->comm;
}

}  // namespace gs::monitoring
