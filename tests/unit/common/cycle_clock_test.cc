// The cycle clock that times a lone rank's calls (common/cycle_clock.h): its readings convert
// to the steady clock's nanoseconds, it trusts the time-stamp counter only where the kernel's
// clocksource is the counter, and steadyNow() (deadlines, request and call times) stays with
// the steady clock from any number of threads.
#include "common/cycle_clock.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace gs {
namespace {

uint64_t steadyNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

TEST(CycleClock, TrustsTheCounterOnlyWhereTheKernelKeepsTimeWithIt) {
  EXPECT_TRUE(cycle::clocksourceTrustsTsc("tsc"));
  EXPECT_TRUE(cycle::clocksourceTrustsTsc("tsc\n"));
  EXPECT_FALSE(cycle::clocksourceTrustsTsc("kvm-clock"));
  EXPECT_FALSE(cycle::clocksourceTrustsTsc("hpet"));
  EXPECT_FALSE(cycle::clocksourceTrustsTsc(""));
}

// Intervals nested both ways, so that a preemption between two reads (a loaded CI machine)
// only widens the outer interval: the cycle clock's measure of an interval that contains a
// steady one is at least that (less 1 % for the rate), and of one inside a steady one at most.
TEST(CycleClock, ItsDurationsAreTheSteadyClocksNanoseconds) {
  cycle::calibrate();
  const uint64_t c0 = cycle::now();
  const uint64_t s0 = steadyNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const uint64_t s1 = steadyNs();
  const uint64_t c1 = cycle::now();
  ASSERT_GT(c1, c0);
  EXPECT_GE(static_cast<double>(cycle::ticksToNs(c1 - c0)), 0.99 * static_cast<double>(s1 - s0));

  const uint64_t t0 = steadyNs();
  const uint64_t d0 = cycle::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const uint64_t d1 = cycle::now();
  const uint64_t t1 = steadyNs();
  ASSERT_GT(d1, d0);
  EXPECT_LE(static_cast<double>(cycle::ticksToNs(d1 - d0)), 1.01 * static_cast<double>(t1 - t0));
  EXPECT_GE(cycle::ticksToNs(d1 - d0), 19'000'000u) << "a 20 ms sleep";
  if (!cycle::usesTimeStampCounter()) {
    EXPECT_EQ(cycle::ticksToNs(12345), 12345u) << "the steady clock: a tick is a nanosecond";
  }
}

// Readings bracketed by steady ones, across many re-readings of the steady clock (one a
// millisecond) by several threads at once. The design's error is the rate's over a millisecond
// (tens of ns); an anchor torn between two threads' re-readings or a wrong offset would be off
// by up to a millisecond, far outside the 200 us allowed here.
TEST(CycleClock, SteadyNowStaysWithTheSteadyClockFromManyThreads) {
  cycle::calibrate();
  constexpr int64_t kAllowedNs = 200'000;
  std::atomic<int64_t> worst{0};
  std::atomic<int> readings{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      int64_t mine = 0;
      for (int i = 0; i < 3000; ++i) {
        const auto before = std::chrono::steady_clock::now();
        const auto reading = cycle::steadyNow();
        const auto after = std::chrono::steady_clock::now();
        const int64_t early = std::chrono::nanoseconds(before - reading).count();
        const int64_t late = std::chrono::nanoseconds(reading - after).count();
        mine = std::max({mine, early, late});
        if (i % 100 == t)  // cross the re-reading period now and then
          std::this_thread::sleep_for(std::chrono::microseconds(1100));
      }
      readings.fetch_add(3000);
      int64_t seen = worst.load();
      while (mine > seen && !worst.compare_exchange_weak(seen, mine)) {
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(readings.load(), 12000);
  EXPECT_LE(worst.load(), kAllowedNs) << "ns outside the steady readings around it";
}

TEST(CycleClock, SteadyNowMeasuresASleep) {
  const auto s0 = std::chrono::steady_clock::now();
  const auto c0 = cycle::steadyNow();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto c1 = cycle::steadyNow();
  const auto s1 = std::chrono::steady_clock::now();
  EXPECT_GE(c1 - c0, std::chrono::milliseconds(19));
  EXPECT_LE(c1 - c0, (s1 - s0) + std::chrono::microseconds(200));
}

}  // namespace
}  // namespace gs
