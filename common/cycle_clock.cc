#include "common/cycle_clock.h"

#include <chrono>
#include <fstream>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace gs::cycle {

namespace {

struct Rate {
  bool tsc = false;
  double nsPerTick = 1.0;
};

uint64_t steadyNs() noexcept {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

#if defined(__x86_64__)
// The counter against the steady clock over ~1 ms: each end's pair of reads is ~25 ns apart,
// so the rate is good to a few parts in 100 000.
Rate measure() {
  Rate r;
  std::string source;
  std::ifstream("/sys/devices/system/clocksource/clocksource0/current_clocksource") >> source;
  if (!clocksourceTrustsTsc(source))
    return r;
  const uint64_t ns0 = steadyNs();
  const uint64_t t0 = __rdtsc();
  uint64_t ns1 = ns0, t1 = t0;
  while (ns1 - ns0 < 1'000'000) {
    ns1 = steadyNs();
    t1 = __rdtsc();
  }
  if (t1 <= t0)
    return r;
  r.tsc = true;
  r.nsPerTick = static_cast<double>(ns1 - ns0) / static_cast<double>(t1 - t0);
  return r;
}
#else
Rate measure() {
  return Rate{};
}
#endif

const Rate& rate() noexcept {
  static const Rate r = [] {
    try {
      return measure();
    } catch (...) {
      return Rate{};  // the steady clock
    }
  }();
  return r;
}

}  // namespace

bool clocksourceTrustsTsc(const std::string& name) noexcept {
  return name == "tsc" || name == "tsc\n";
}

void calibrate() noexcept {
  (void)rate();
}

bool usesTimeStampCounter() noexcept {
  return rate().tsc;
}

uint64_t now() noexcept {
#if defined(__x86_64__)
  if (rate().tsc)
    return __rdtsc();
#endif
  return steadyNs();
}

uint64_t ticksToNs(uint64_t ticks) noexcept {
  const Rate& r = rate();
  return r.tsc ? static_cast<uint64_t>(static_cast<double>(ticks) * r.nsPerTick) : ticks;
}

}  // namespace gs::cycle
