// The cycle clock that times a lone rank's calls (common/cycle_clock.h): its readings convert
// to the steady clock's nanoseconds, and it trusts the time-stamp counter only where the
// kernel's clocksource is the counter.
#include "common/cycle_clock.h"

#include <chrono>
#include <thread>

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

}  // namespace
}  // namespace gs
