#include "control/link_transports.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
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

std::vector<ShmShortfall> dropShmWhereSlotsDoNotFit(
    std::vector<TransportEndpoint>& ranks,
    const std::vector<int64_t>& freeBytes,
    const std::function<std::set<int>(int)>& peersOf,
    int64_t bytesPerLink) {
  struct Host {
    ShmShortfall figures;
    std::vector<size_t> ranks;  // its ranks with an shm address
  };
  std::map<std::string, Host> hosts;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].shmAddress.empty())
      continue;
    Host& h = hosts.try_emplace(ranks[r].hostname).first->second;
    h.figures.hostname = ranks[r].hostname;
    h.ranks.push_back(r);
    int64_t& room = h.figures.freeBytes;
    if (freeBytes[r] > 0 && (room == 0 || freeBytes[r] < room))
      room = freeBytes[r];
  }
  std::vector<ShmShortfall> tooSmall;
  for (auto& [name, h] : hosts) {
    // Where every pair of the host's ranks would fit (or the room is unknown), the schedules'
    // peers need not be built: at thousands of ranks that costs every rank 0.1 s and more.
    const auto k = static_cast<int64_t>(h.ranks.size());
    if (h.figures.freeBytes == 0 || k * (k - 1) * bytesPerLink <= h.figures.freeBytes)
      continue;
    for (size_t r : h.ranks) {
      for (int p : peersOf(static_cast<int>(r))) {
        if (p >= 0 && static_cast<size_t>(p) < ranks.size() && static_cast<size_t>(p) != r &&
            shmBetween(ranks[r], ranks[p]))
          h.figures.needBytes += bytesPerLink;
      }
    }
    if (h.figures.needBytes > h.figures.freeBytes)
      tooSmall.push_back(h.figures);
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
