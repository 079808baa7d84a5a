#include "control/link_transports.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/device.h"

namespace gs::control {

const char* shmStateName(ShmState state) {
  switch (state) {
    case ShmState::kOff:
      return "off";
    case ShmState::kUnavailable:
      return "unavailable";
    case ShmState::kUnused:
      return "unused";
    case ShmState::kInUse:
      return "in_use";
  }
  return "off";
}

std::unique_ptr<transport::Device> openShmDevice(const std::string& networkTransport,
                                                 const transport::DeviceOptions& options,
                                                 ShmState& state) {
  state = ShmState::kOff;
  const bool network = networkTransport == "tcp" || networkTransport == "verbs";
  if (!options.config.shm || !network || options.nranks < 2)
    return nullptr;
  try {
    auto device = transport::createDevice("shm", options);
    state = ShmState::kUnused;
    return device;
  } catch (const std::exception& e) {
    // Every rank of a process (threads as ranks) would say the same: warn once.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      GS_LOG_WARN(
          "rank %d: shared-memory transport unavailable (%s): ranks of this host use %s "
          "(GS_SHM=0 silences this)",
          options.rank, e.what(), networkTransport.c_str());
    } else {
      GS_LOG_INFO("rank %d: shared-memory transport unavailable (%s): using %s", options.rank,
                  e.what(), networkTransport.c_str());
    }
    state = ShmState::kUnavailable;
    return nullptr;
  }
}

bool shmBetween(const TransportEndpoint& a, const TransportEndpoint& b) {
  if (a.shmAddress.empty() || b.shmAddress.empty() || a.hostname != b.hostname)
    return false;
  return transport::sameHostReachable("shm", a.shmAddress, b.shmAddress);
}

bool shmWithinHosts(const std::vector<TransportEndpoint>& ranks) {
  std::map<std::string, size_t> firstOfHost;  // host name -> index of its first rank
  bool sharedHost = false;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto [it, inserted] = firstOfHost.emplace(ranks[r].hostname, r);
    if (inserted)
      continue;
    sharedHost = true;
    if (!shmBetween(ranks[it->second], ranks[r]))
      return false;
  }
  return sharedHost;
}

int64_t sharedMemoryFreeBytes() {
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0)
    return 0;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

std::vector<ShmShortfall> dropShmWhereSlotsDoNotFit(std::vector<TransportEndpoint>& ranks,
                                                    const std::vector<int64_t>& freeBytes,
                                                    const std::vector<std::set<int>>& peersOf,
                                                    int64_t bytesPerLink) {
  std::map<std::string, ShmShortfall> hosts;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].shmAddress.empty())
      continue;
    ShmShortfall& h = hosts.try_emplace(ranks[r].hostname).first->second;
    h.hostname = ranks[r].hostname;
    if (freeBytes[r] > 0 && (h.freeBytes == 0 || freeBytes[r] < h.freeBytes))
      h.freeBytes = freeBytes[r];
    for (int p : peersOf[r]) {
      if (p >= 0 && static_cast<size_t>(p) < ranks.size() && static_cast<size_t>(p) != r &&
          shmBetween(ranks[r], ranks[p]))
        h.needBytes += bytesPerLink;
    }
  }
  std::vector<ShmShortfall> tooSmall;
  for (const auto& [name, h] : hosts) {
    if (h.freeBytes > 0 && h.needBytes > h.freeBytes)
      tooSmall.push_back(h);
  }
  for (const ShmShortfall& h : tooSmall) {
    for (TransportEndpoint& e : ranks) {
      if (e.hostname == h.hostname)
        e.shmAddress.clear();
    }
  }
  return tooSmall;
}

int64_t pipelineChunkBytes(const std::string& networkTransport,
                           const std::vector<TransportEndpoint>& ranks,
                           int64_t configured) {
  if (networkTransport != "tcp" || configured != Config{}.chunkBytes || ranks.size() < 2)
    return configured;
  const bool oneHost = std::all_of(ranks.begin(), ranks.end(), [&](const TransportEndpoint& r) {
    return r.hostname == ranks.front().hostname;
  });
  return oneHost && shmWithinHosts(ranks) ? configured : kTcpChunkBytes;
}

std::string linkTransportsName(const std::string& networkTransport,
                               int shmLinks,
                               int networkLinks) {
  if (shmLinks == 0)
    return networkTransport;
  return networkLinks == 0 ? std::string("shm") : "shm+" + networkTransport;
}

}  // namespace gs::control
