// Engine with its links on several devices, as a communicator with shared memory to the ranks of
// its host and the network to the others has them: every collective still completes, correct,
// whether the primary device (the one user buffers are registered with first) serves links or
// none. Loopback devices on separate fabrics stand in for shm and tcp, so this runs anywhere.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"
#include "stream/engine.h"
#include "stream/link.h"
#include "tests/unit/stream/ring_cluster.h"
#include "transport/device.h"

namespace gs::stream {
namespace {

constexpr int kFabrics = 3;  // links alternate between fabrics 0 and 1; 2 serves no link

// The link between r and r+1 is on fabric r % 2 (with 2 ranks both are each other's next).
int alternatingFabric(int a, int b, int n) {
  const int lower = n == 2 ? std::min(a, b) : (b == (a + 1) % n ? a : b);
  return lower % 2;
}

float inputOf(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 100 + static_cast<int>(i % 89));
}

void runEveryCollective(int n, int primaryFabric) {
  RingCluster ring(n, testConfig(), kFabrics, alternatingFabric, primaryFabric);
  const size_t count = 30011;  // many 4 KiB chunks per step
  std::vector<std::vector<float>> reduced(n, std::vector<float>(count)),
      gathered(n, std::vector<float>(count * n)), bcast(n, std::vector<float>(count));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::vector<float> in(count);
        for (size_t i = 0; i < count; ++i)
          in[i] = inputOf(r, i);
        CollectiveArgs a;
        a.send = in.data();
        a.recv = reduced[r].data();
        a.count = count;
        ring.ranks[r].engine->run(a);
        a.kind = CollectiveKind::kAllGather;
        a.recv = gathered[r].data();
        ring.ranks[r].engine->run(a);
        a.kind = CollectiveKind::kBroadcast;
        a.root = n - 1;
        a.recv = bcast[r].data();
        ring.ranks[r].engine->run(a);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[r], "") << "N=" << n << " rank " << r;
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q)
        want += inputOf(q, i);  // small integers: exact
      ASSERT_EQ(reduced[r][i], want) << "allreduce, N=" << n << " rank " << r << " i=" << i;
      ASSERT_EQ(bcast[r][i], inputOf(n - 1, i)) << "broadcast, rank " << r << " i=" << i;
      for (int q = 0; q < n; ++q)
        ASSERT_EQ(gathered[r][q * count + i], inputOf(q, i)) << "allgather, rank " << r;
    }
  }
}

TEST(EngineDevices, CollectivesWithLinksOnTwoDevices) {
  for (int n : {2, 3, 4})
    runEveryCollective(n, 0);
}

// The primary device serves no link (only registration goes through it): waits must go to the
// devices that do.
TEST(EngineDevices, CollectivesWhenThePrimaryDeviceServesNoLink) {
  for (int n : {3, 4})
    runEveryCollective(n, 2);
}

}  // namespace
}  // namespace gs::stream
