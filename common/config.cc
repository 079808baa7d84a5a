#include "common/config.h"

#include <strings.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "common/error.h"

namespace gs {
namespace {

// The table: name, default, help, and how the value lands in Config.
struct Entry {
  ConfigVariable doc;
  std::function<void(Config&, const std::string&)> apply;
};

int64_t parseInt(const char* name, const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  // Base 10 always: a leading zero is not octal here.
  long long v = strtoll(text.c_str(), &end, 10);
  // Accept a K/M/G suffix (binary units) for byte sizes.
  int64_t mult = 1;
  if (end && *end) {
    if ((*end == 'k' || *end == 'K') && end[1] == '\0')
      mult = 1 << 10;
    else if ((*end == 'm' || *end == 'M') && end[1] == '\0')
      mult = 1 << 20;
    else if ((*end == 'g' || *end == 'G') && end[1] == '\0')
      mult = int64_t{1} << 30;
    else
      mult = 0;
  }
  GS_CHECK(errno == 0 && end != text.c_str() && mult != 0, Errc::kInvalidArgument,
           "%s='%s' is not an integer", name, text.c_str());
  const bool fits = v >= INT64_MIN / mult && v <= INT64_MAX / mult;
  GS_CHECK(fits && v * mult >= lo && v * mult <= hi, Errc::kInvalidArgument,
           "%s=%s is out of range [%lld, %lld]", name, text.c_str(), static_cast<long long>(lo),
           static_cast<long long>(hi));
  return v * mult;
}

double parseDouble(const char* name, const std::string& text, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  const double v = strtod(text.c_str(), &end);
  GS_CHECK(errno == 0 && end != text.c_str() && *end == '\0', Errc::kInvalidArgument,
           "%s='%s' is not a number", name, text.c_str());
  GS_CHECK(v >= lo && v <= hi, Errc::kInvalidArgument, "%s=%s is out of range [%g, %g]", name,
           text.c_str(), lo, hi);
  return v;
}

const std::vector<Entry>& table() {
  static const std::vector<Entry> entries = {
      {{"GS_TRANSPORT", "auto",
        "auto | tcp | verbs | loopback (auto: verbs where an active RDMA port exists, else tcp)"},
       [](Config& c, const std::string& v) { c.transport = v; }},
      {{"GS_TIMEOUT_MS", "60000", "deadline in ms for every wait (connect, chunk, collective)"},
       [](Config& c, const std::string& v) {
         c.timeoutMs = parseInt("GS_TIMEOUT_MS", v, 1, int64_t{1} << 40);
       }},
      {{"GS_CHUNK_BYTES", "1M", "pipeline chunk size in bytes (4K..64M; K/M suffixes)"},
       [](Config& c, const std::string& v) {
         c.chunkBytes = parseInt("GS_CHUNK_BYTES", v, 4096, 64 << 20);
       }},
      {{"GS_SLOTS_PER_PEER", "8", "receive slots (chunks in flight) per peer, 2..64"},
       [](Config& c, const std::string& v) {
         c.slotsPerPeer = parseInt("GS_SLOTS_PER_PEER", v, 2, 64);
       }},
      {{"GS_TCP_SOCKETS", "2", "tcp sockets per peer, 1..16"},
       [](Config& c, const std::string& v) {
         c.socketsPerPeer = parseInt("GS_TCP_SOCKETS", v, 1, 16);
       }},
      {{"GS_CODEC", "raw",
        "wire codec: raw, fp16, bf16, fp8e4m3, fp8e5m2, int8, int4, topk:<fraction>; "
        "options ,sr (stochastic rounding) ,block=N; auto: per link from GS_CODEC_LADDER"},
       [](Config& c, const std::string& v) { c.codec = v; }},
      {{"GS_METRICS_ADDR", "",
        "Prometheus exporter host:port; each local rank adds its local rank to the port"},
       [](Config& c, const std::string& v) { c.metricsAddress = v; }},
      {{"GS_SOCKET_IFNAME", "", "network interface for rendezvous and tcp; unset: loopback only"},
       [](Config& c, const std::string& v) { c.socketIfname = v; }},
      {{"GS_SECRET", "", "communicator secret for gs_comm_init_from_env (shared by the launcher)"},
       [](Config& c, const std::string& v) { c.secret = v; }},
      {{"GS_DEBUG", "warn", "log level: none | error | warn | info | debug | trace"},
       [](Config& c, const std::string& v) { c.logLevel = parseLogLevel(v); }},
      {{"GS_IB_HCA", "", "verbs devices allowed, name[:port] comma-separated; unset: any active"},
       [](Config& c, const std::string& v) { c.ibHca = v; }},
      {{"GS_IB_GID_INDEX", "-1", "verbs GID index; -1: auto (IPv4-mapped RoCEv2 GID)"},
       [](Config& c, const std::string& v) {
         c.ibGidIndex = parseInt("GS_IB_GID_INDEX", v, -1, 1023);
       }},
      {{"GS_IB_TC", "0", "verbs traffic class (RoCE DSCP << 2), 0..255"},
       [](Config& c, const std::string& v) { c.ibTrafficClass = parseInt("GS_IB_TC", v, 0, 255); }},
      {{"GS_IB_SL", "0", "verbs service level, 0..15"},
       [](Config& c, const std::string& v) { c.ibServiceLevel = parseInt("GS_IB_SL", v, 0, 15); }},
      {{"GS_IB_QPS_PER_PEER", "2", "RC queue pairs per peer, 1..16"},
       [](Config& c, const std::string& v) {
         c.ibQpsPerPeer = parseInt("GS_IB_QPS_PER_PEER", v, 1, 16);
       }},
      {{"GS_IB_TIMEOUT", "18", "verbs local ACK timeout exponent (4.096 us * 2^t), 1..31"},
       [](Config& c, const std::string& v) { c.ibTimeout = parseInt("GS_IB_TIMEOUT", v, 1, 31); }},
      {{"GS_IB_RETRY_CNT", "7", "verbs transport retry count, 0..7"},
       [](Config& c, const std::string& v) {
         c.ibRetryCount = parseInt("GS_IB_RETRY_CNT", v, 0, 7);
       }},
      {{"GS_CODEC_LADDER", "raw,bf16,fp8e4m3,int8,int4",
        "codec=auto: rungs from most to least precise"},
       [](Config& c, const std::string& v) { c.codecLadder = v; }},
      {{"GS_CODEC_FLOOR", "int4", "codec=auto: the least precise rung allowed"},
       [](Config& c, const std::string& v) { c.codecFloor = v; }},
      {{"GS_CHUNK_MIN_BYTES", "256K", "codec=auto: smallest chunk the controller picks"},
       [](Config& c, const std::string& v) {
         c.chunkMinBytes = parseInt("GS_CHUNK_MIN_BYTES", v, 4096, 64 << 20);
       }},
      {{"GS_CHUNK_MAX_BYTES", "2M", "codec=auto: largest chunk the controller picks"},
       [](Config& c, const std::string& v) {
         c.chunkMaxBytes = parseInt("GS_CHUNK_MAX_BYTES", v, 4096, 64 << 20);
       }},
      {{"GS_ERROR_BUDGET", "0.05", "codec=auto: relative L2 error allowed on sampled chunks"},
       [](Config& c, const std::string& v) {
         c.errorBudget = parseDouble("GS_ERROR_BUDGET", v, 0, 1);
       }},
      {{"GS_ALGO", "auto",
        "auto | ring | tree | halving_doubling | hierarchical | recursive_doubling"},
       [](Config& c, const std::string& v) { c.algo = v; }},
      {{"GS_ALGO_TUNE", "crowded",
        "GS_ALGO=auto: crowded | always | off: time the schedules the cost model prices close "
        "on the first calls of each size and keep the fastest (crowded: only where a host's "
        "ranks outnumber its cores)"},
       [](Config& c, const std::string& v) {
         GS_CHECK(v == "crowded" || v == "always" || v == "off", Errc::kInvalidArgument,
                  "GS_ALGO_TUNE='%s' is unknown (crowded, always, off)", v.c_str());
         c.algoTune = v;
       }},
      {{"GS_REDUCE_ALGO", "auto", "reduce schedule: auto | chain | tree | linear"},
       [](Config& c, const std::string& v) {
         GS_CHECK(v == "auto" || v == "chain" || v == "tree" || v == "linear",
                  Errc::kInvalidArgument,
                  "GS_REDUCE_ALGO='%s' is unknown (auto, chain, tree, linear)", v.c_str());
         c.reduceAlgo = v;
       }},
      {{"GS_HOSTNAME", "", "host name used to group ranks into hosts; unset: gethostname()"},
       [](Config& c, const std::string& v) { c.hostname = v; }},
      {{"GS_SHM", "1", "1: shared-memory transport between ranks of one host; 0: off"},
       [](Config& c, const std::string& v) { c.shm = parseInt("GS_SHM", v, 0, 1) != 0; }},
      {{"GS_SHM_SINGLE_COPY", "1",
        "1: over shm, large chunks are copied once, straight from the sender's memory "
        "(cross-memory attach, where the kernel allows it); 0: through the shared segment"},
       [](Config& c, const std::string& v) {
         c.shmSingleCopy = parseInt("GS_SHM_SINGLE_COPY", v, 0, 1) != 0;
       }},
      {{"GS_SHM_SMALL_BYTES", "16384",
        "over shm, 2-rank allreduce, reduce, reduce-scatter, allgather and all-to-all with blocks "
        "of "
        "at most this many bytes (no codec) swap them through mailboxes instead of chunks "
        "(0..16384; 0: off)"},
       [](Config& c, const std::string& v) {
         c.shmSmallBytes = parseInt("GS_SHM_SMALL_BYTES", v, 0, 16384);
       }},
      {{"GS_STAGING_BYTES", "32M",
        "CUDA device buffers: each of the two pinned host staging slots (64K..1G; K/M/G)"},
       [](Config& c, const std::string& v) {
         c.stagingBytes = parseInt("GS_STAGING_BYTES", v, 64 << 10, int64_t{1} << 30);
       }},
  };
  return entries;
}

}  // namespace

LogLevel parseLogLevel(const std::string& text) {
  static const char* names[] = {"none", "error", "warn", "info", "debug", "trace"};
  for (int i = 0; i <= 5; ++i) {
    if (strcasecmp(text.c_str(), names[i]) == 0)
      return static_cast<LogLevel>(i);
  }
  if (strcasecmp(text.c_str(), "warning") == 0)
    return LogLevel::kWarn;
  return static_cast<LogLevel>(parseInt("GS_DEBUG", text, 0, 5));
}

void Config::applyEnvironment() {
  for (const Entry& e : table()) {
    const char* value = getenv(e.doc.name);
    if (value != nullptr && *value != '\0')
      e.apply(*this, value);
  }
}

void Config::validate() const {
  GS_CHECK(
      transport == "auto" || transport == "tcp" || transport == "loopback" || transport == "verbs",
      Errc::kInvalidArgument, "transport '%s' is unknown (auto, tcp, verbs, loopback)",
      transport.c_str());
  GS_CHECK(timeoutMs >= 1, Errc::kInvalidArgument, "timeout_ms %lld must be >= 1",
           static_cast<long long>(timeoutMs));
  GS_CHECK(chunkBytes >= 4096 && chunkBytes <= (64 << 20), Errc::kInvalidArgument,
           "chunk_bytes %lld is out of range [4096, 64M]", static_cast<long long>(chunkBytes));
  GS_CHECK(slotsPerPeer >= 2 && slotsPerPeer <= 64, Errc::kInvalidArgument,
           "slots_per_peer %lld is out of range [2, 64]", static_cast<long long>(slotsPerPeer));
  GS_CHECK(socketsPerPeer >= 1 && socketsPerPeer <= 16, Errc::kInvalidArgument,
           "sockets_per_peer %lld is out of range [1, 16]", static_cast<long long>(socketsPerPeer));
  GS_CHECK(chunkMinBytes <= chunkMaxBytes, Errc::kInvalidArgument,
           "chunk_min_bytes %lld exceeds chunk_max_bytes %lld",
           static_cast<long long>(chunkMinBytes), static_cast<long long>(chunkMaxBytes));
  GS_CHECK(chunkMinBytes >= 4096 && chunkMaxBytes <= (64 << 20), Errc::kInvalidArgument,
           "chunk bounds [%lld, %lld] leave [4096, 64M]", static_cast<long long>(chunkMinBytes),
           static_cast<long long>(chunkMaxBytes));
  GS_CHECK(errorBudget >= 0 && errorBudget <= 1, Errc::kInvalidArgument,
           "error_budget %g is out of range [0, 1]", errorBudget);
  GS_CHECK(
      algo == "auto" || algo == "ring" || algo == "tree" || algo == "halving_doubling" ||
          algo == "hierarchical" || algo == "recursive_doubling",
      Errc::kInvalidArgument,
      "algo '%s' is unknown (auto, ring, tree, halving_doubling, hierarchical, recursive_doubling)",
      algo.c_str());
  GS_CHECK(stagingBytes >= (64 << 10) && stagingBytes <= (int64_t{1} << 30), Errc::kInvalidArgument,
           "staging_bytes %lld is out of range [64K, 1G]", static_cast<long long>(stagingBytes));
  // codec is validated where codecs are known (codecs::CodecSpec::parse, at communicator set-up).
}

const std::vector<ConfigVariable>& configVariables() {
  static const std::vector<ConfigVariable> docs = [] {
    std::vector<ConfigVariable> out;
    for (const Entry& e : table())
      out.push_back(e.doc);
    return out;
  }();
  return docs;
}

}  // namespace gs
