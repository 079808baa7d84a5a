#pragma once

// Helpers shared by the transport tests: ranks as threads, each with its own Device, and a
// bounded pump that drives connections and collects their completions.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/log.h"
#include "transport/device.h"

namespace gs::transport::testing {

inline Secret testSecret(uint8_t salt = 0) {
  Secret s{};
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = static_cast<uint8_t>(i * 7 + 1 + salt);
  return s;
}

/// A fabric id no other test in this process uses.
inline uint64_t freshFabricId() {
  static std::atomic<uint64_t> next{0x5eed0000};
  return next++;
}

struct RankSetup {
  int socketsPerPeer = 2;
  int64_t timeoutMs = 5000;
};

inline DeviceOptions makeOptions(int rank,
                                 int nranks,
                                 uint64_t fabric,
                                 const RankSetup& setup,
                                 const Secret& secret = testSecret()) {
  DeviceOptions o;
  o.rank = rank;
  o.nranks = nranks;
  o.secret = secret;
  o.bindAddress = "127.0.0.1";
  o.fabricId = fabric;
  o.config.socketsPerPeer = setup.socketsPerPeer;
  o.config.timeoutMs = setup.timeoutMs;
  return o;
}

/// One rank of a test: its device and its connections by peer rank.
struct Rank {
  std::unique_ptr<Device> device;
  std::vector<std::unique_ptr<Connection>> peers;
  std::vector<Completion> completions;  // everything polled so far, all peers
};

/// Creates n devices of backend and connects every pair, each rank on its own thread and each
/// in a different peer order (so acceptors must stash hellos of peers they are not waiting for).
inline std::vector<Rank> connectRanks(const std::string& backend,
                                      int n,
                                      const RankSetup& setup = {}) {
  std::vector<Rank> ranks(static_cast<size_t>(n));
  const uint64_t fabric = freshFabricId();
  std::vector<std::vector<uint8_t>> blobs;
  for (int r = 0; r < n; ++r) {
    ranks[r].device = createDevice(backend, makeOptions(r, n, fabric, setup));
    ranks[r].peers.resize(static_cast<size_t>(n));
    blobs.push_back(ranks[r].device->address());
  }
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      setLogRank(r);
      try {
        for (int k = 1; k < n; ++k) {
          // Rank r visits peers r-1, r-2, ... (wrapping): a different order on every rank.
          int peer = ((r - k) % n + n) % n;
          ranks[r].peers[peer] =
              ranks[r].device->connect(peer, blobs[peer], Deadline::afterMs(setup.timeoutMs));
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(errors[r], "") << "rank " << r;
  return ranks;
}

/// Two connected ranks and the ends of a small write from rank 0 to rank 1: `bytes` of `fill`
/// registered on rank 0 (seg) and a region of that size on rank 1 (rd).
struct OneWayPair {
  OneWayPair(const std::string& backend, size_t bytes, uint8_t fill)
      : ranks(connectRanks(backend, 2)),
        src(bytes, fill),
        rs(ranks[0].device->registerMemory(src.data(), src.size())),
        rd(ranks[1].device->allocateRegion(bytes)),
        seg{rs.get(), 0, bytes} {}
  PostResult write(uint32_t imm, WorkId id) {
    return ranks[0].peers[1]->postWrite({&seg, 1}, rd->remoteKey(), 0, imm, id);
  }
  std::vector<Rank> ranks;
  std::vector<uint8_t> src;
  std::unique_ptr<MemoryRegion> rs, rd;
  LocalSegment seg;
};

/// Polls every connection of every rank until done() or the time limit, collecting completions
/// into Rank::completions. Returns done().
inline bool pump(std::vector<Rank>& ranks,
                 const std::function<bool()>& done,
                 std::chrono::milliseconds limit = std::chrono::milliseconds(3000)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  Completion buf[32];
  while (!done()) {
    if (std::chrono::steady_clock::now() > until)
      return false;
    bool any = false;
    for (auto& rank : ranks) {
      for (auto& c : rank.peers) {
        if (!c)
          continue;
        size_t got = c->poll(buf);
        for (size_t i = 0; i < got; ++i)
          rank.completions.push_back(buf[i]);
        any |= got > 0;
      }
    }
    if (!any)
      std::this_thread::yield();
  }
  return true;
}

inline size_t countKind(const Rank& rank, CompletionKind kind) {
  size_t n = 0;
  for (const Completion& c : rank.completions)
    n += c.kind == kind ? 1 : 0;
  return n;
}

inline const Completion* findKind(const Rank& rank, CompletionKind kind) {
  for (const Completion& c : rank.completions) {
    if (c.kind == kind)
      return &c;
  }
  return nullptr;
}

}  // namespace gs::transport::testing
