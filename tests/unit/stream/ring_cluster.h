#pragma once

// Engines of n ranks (threads) linked to their ring neighbours over the real loopback
// transport, shared by the engine tests.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"
#include "stream/engine.h"
#include "stream/link.h"
#include "transport/device.h"

namespace gs::stream {

/// A loopback fabric id no other cluster in this process uses.
inline uint64_t freshFabric() {
  static std::atomic<uint64_t> next{0xe61e0000};
  return next++;
}

/// Loopback, 4 KiB chunks (many per step even for small buffers), 4 slots per peer.
inline Config testConfig(int64_t timeoutMs = 5000) {
  Config c;
  c.transport = "loopback";
  c.chunkBytes = 4096;
  c.slotsPerPeer = 4;
  c.timeoutMs = timeoutMs;
  return c;
}

/// Each rank has `fabrics` loopback devices on separate fabrics (as a communicator has shm next
/// to tcp); the link between neighbours a and b is on fabric linkFabric(a, b, n) of both, and
/// the engine's primary device (user buffers are registered with it first) is on fabric
/// `primary`. With the defaults every link is on one device. everyPair: a link between every
/// two ranks (all-to-all, trees), not only between neighbours. Members in acquisition order:
/// engines and links (holding connections and regions) go before the devices.
struct RingCluster {
  struct Rank {
    std::vector<std::unique_ptr<transport::Device>> devices;  // one per fabric
    std::vector<std::unique_ptr<Link>> links;                 // by peer
    std::unique_ptr<Engine> engine;
    transport::Device& device() { return *devices.front(); }
  };
  Config config;
  std::atomic<bool> abortFlag{false};
  std::vector<Rank> ranks;

  RingCluster(int n,
              const Config& c,
              int fabrics = 1,
              const std::function<int(int, int, int)>& linkFabric = nullptr,
              int primary = 0,
              bool everyPair = false)
      : config(c), ranks(static_cast<size_t>(n)) {
    auto fabricOf = [&](int a, int b) { return linkFabric ? linkFabric(a, b, n) : 0; };
    std::vector<uint64_t> ids(static_cast<size_t>(fabrics));
    for (uint64_t& id : ids)
      id = freshFabric();
    Secret secret{};
    for (size_t i = 0; i < secret.size(); ++i)
      secret[i] = static_cast<uint8_t>(3 * i + 1);
    SlotLayout layout;
    layout.slots = static_cast<size_t>(c.slotsPerPeer);
    layout.chunkBytes = static_cast<size_t>(c.chunkBytes);
    for (int r = 0; r < n; ++r) {
      for (uint64_t id : ids) {
        transport::DeviceOptions o;
        o.rank = r;
        o.nranks = n;
        o.secret = secret;
        o.fabricId = id;
        o.config = c;
        ranks[r].devices.push_back(transport::createDevice("loopback", o));
      }
      ranks[r].links.resize(static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) {
        const bool neighbour = p == (r + 1) % n || p == (r + n - 1) % n;
        if (p != r && (neighbour || everyPair) && !ranks[r].links[p])
          ranks[r].links[p] = std::make_unique<Link>(p, *ranks[r].devices[fabricOf(r, p)], layout);
      }
    }
    // Connect every neighbour pair, each rank on its own thread.
    std::vector<std::thread> threads;
    std::vector<std::string> errors(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          for (int p = 0; p < n; ++p) {
            if (!ranks[r].links[p])
              continue;
            const int f = fabricOf(r, p);
            auto conn = ranks[r].devices[f]->connect(p, ranks[p].devices[f]->address(),
                                                     Deadline::afterMs(5000));
            ranks[r].links[p]->attach(std::move(conn), ranks[p].links[r]->recvSlotsKey());
          }
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads)
      t.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(errors[r], "") << "rank " << r;
      std::vector<Link*> raw;
      for (auto& l : ranks[r].links)
        raw.push_back(l.get());
      ranks[r].engine =
          std::make_unique<Engine>(r, n, *ranks[r].devices[primary], raw, config, abortFlag);
    }
  }
  ~RingCluster() {
    for (auto& r : ranks)
      r.engine.reset();
    for (auto& r : ranks)
      r.links.clear();
  }
};

}  // namespace gs::stream
