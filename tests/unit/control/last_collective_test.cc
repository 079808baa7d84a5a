// LastCollective: gs_comm_stats reads the last call's figures while the next call writes them.
#include "control/last_collective.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace gs::control {
namespace {

TEST(LastCollective, EmptyUntilTheFirstStore) {
  LastCollective last;
  const LastCollective::Value v = last.load();
  EXPECT_EQ(v.algorithm, nullptr);
  EXPECT_EQ(v.seconds, 0);
  last.store({1.5, 2.0, 3.0, "ring"});
  const LastCollective::Value w = last.load();
  EXPECT_STREQ(w.algorithm, "ring");
  EXPECT_EQ(w.seconds, 1.5);
  EXPECT_EQ(w.algbw, 2.0);
  EXPECT_EQ(w.busbw, 3.0);
}

TEST(LastCollective, AReaderNeverSeesTwoStoresMixed) {
  // Each store's fields are tied (algbw = 2 seconds, busbw = 3 seconds, the name by parity):
  // a reader that saw half of one store and half of the next would break the tie.
  static const char* const kNames[] = {"even", "odd"};
  LastCollective last;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t i = 1; i <= 2'000'000 && !stop.load(std::memory_order_relaxed); ++i) {
      const double s = static_cast<double>(i);
      last.store({s, 2 * s, 3 * s, kNames[i % 2]});
    }
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  uint64_t reads = 0, mixed = 0;
  while (std::chrono::steady_clock::now() < until) {
    const LastCollective::Value v = last.load();
    ++reads;
    if (v.algorithm == nullptr)
      continue;
    const auto i = static_cast<uint64_t>(v.seconds);
    if (v.algbw != 2 * v.seconds || v.busbw != 3 * v.seconds || v.algorithm != kNames[i % 2])
      ++mixed;
  }
  stop = true;
  writer.join();
  EXPECT_GT(reads, 0u);
  EXPECT_EQ(mixed, 0u) << "of " << reads << " reads";
}

}  // namespace
}  // namespace gs::control
