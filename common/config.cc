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

const std::vector<Entry>& table() {
  static const std::vector<Entry> entries = {
      {{"GS_TRANSPORT", "auto", "auto | tcp | loopback (auto: tcp where no RDMA device exists)"},
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
        "options ,sr (stochastic rounding) ,block=N"},
       [](Config& c, const std::string& v) { c.codec = v; }},
      {{"GS_METRICS_ADDR", "", "Prometheus exporter address (reserved)"},
       [](Config& c, const std::string& v) { c.metricsAddress = v; }},
      {{"GS_SOCKET_IFNAME", "", "network interface for rendezvous and tcp; unset: loopback only"},
       [](Config& c, const std::string& v) { c.socketIfname = v; }},
      {{"GS_SECRET", "", "communicator secret for gs_comm_init_from_env (shared by the launcher)"},
       [](Config& c, const std::string& v) { c.secret = v; }},
      {{"GS_DEBUG", "warn", "log level: none | error | warn | info | debug | trace"},
       [](Config& c, const std::string& v) { c.logLevel = parseLogLevel(v); }},
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
      Errc::kInvalidArgument, "transport '%s' is unknown (auto, tcp, loopback)", transport.c_str());
  GS_CHECK(timeoutMs >= 1, Errc::kInvalidArgument, "timeout_ms %lld must be >= 1",
           static_cast<long long>(timeoutMs));
  GS_CHECK(chunkBytes >= 4096 && chunkBytes <= (64 << 20), Errc::kInvalidArgument,
           "chunk_bytes %lld is out of range [4096, 64M]", static_cast<long long>(chunkBytes));
  GS_CHECK(slotsPerPeer >= 2 && slotsPerPeer <= 64, Errc::kInvalidArgument,
           "slots_per_peer %lld is out of range [2, 64]", static_cast<long long>(slotsPerPeer));
  GS_CHECK(socketsPerPeer >= 1 && socketsPerPeer <= 16, Errc::kInvalidArgument,
           "sockets_per_peer %lld is out of range [1, 16]", static_cast<long long>(socketsPerPeer));
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
