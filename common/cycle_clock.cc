#include "common/cycle_clock.h"

#include <atomic>
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
  uint64_t baseTicks = 0;      // the counter at calibration: converted spans stay short
  uint64_t reanchorTicks = 0;  // about a millisecond of the counter (steadyNow)
};

// steadyNow()'s last steady reading, as an offset from the counter's nanoseconds since
// baseTicks. Each of the two words is any reanchoring's: every offset written is a good one,
// and `ticks` only says when to read the steady clock again, so a reader needs no lock.
struct alignas(64) Anchor {
  std::atomic<uint64_t> ticks{0};  // the counter when offsetNs was taken (0: never)
  std::atomic<int64_t> offsetNs{0};
};
Anchor anchor;

uint64_t steadyNs() noexcept {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

#if defined(__x86_64__)
// A steady reading and the counter at the same moment: the counter read on both sides of the
// steady read (~25 ns apart), its midpoint taken. False when the two are far apart (the thread
// was preempted or interrupted between them): the pair would be off by that much.
constexpr uint64_t kTightPairTicks = 20'000;  // ~5-10 us at 2-4 GHz
bool pairedReading(uint64_t* ns, uint64_t* ticks) noexcept {
  const uint64_t before = __rdtsc();
  *ns = steadyNs();
  const uint64_t after = __rdtsc();
  *ticks = before + (after - before) / 2;
  return after >= before && after - before < kTightPairTicks;
}

// The counter against the steady clock over ~1 ms between two tight pairs: the rate is good to
// a few parts in 100 000, also on a loaded machine (a pair a preemption split is read again).
Rate measure() {
  Rate r;
  std::string source;
  std::ifstream("/sys/devices/system/clocksource/clocksource0/current_clocksource") >> source;
  if (!clocksourceTrustsTsc(source))
    return r;
  uint64_t ns0 = 0, t0 = 0, ns1 = 0, t1 = 0;
  bool tight = false;
  for (int tries = 0; tries < 1000 && !tight; ++tries)
    tight = pairedReading(&ns0, &t0);
  if (!tight)
    return r;
  const uint64_t giveUpNs = ns0 + 100'000'000;
  do {
    tight = pairedReading(&ns1, &t1);
  } while ((!tight || ns1 - ns0 < 1'000'000) && ns1 < giveUpNs);
  if (!tight || t1 <= t0)
    return r;
  r.tsc = true;
  r.nsPerTick = static_cast<double>(ns1 - ns0) / static_cast<double>(t1 - t0);
  r.baseTicks = t1;
  r.reanchorTicks = static_cast<uint64_t>(1e6 / r.nsPerTick);
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

std::chrono::steady_clock::time_point steadyNow() noexcept {
#if defined(__x86_64__)
  const Rate& r = rate();
  if (r.tsc) {
    const auto sinceBase = [&r](uint64_t t) {
      // Signed: another CPU's counter may read a few ticks behind the calibrating one's.
      return static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(t - r.baseTicks)) *
                                  r.nsPerTick);
    };
    const uint64_t t = __rdtsc();
    // A counter behind the anchor (another thread anchored meanwhile) wraps: read again.
    if (t - anchor.ticks.load(std::memory_order_acquire) < r.reanchorTicks) {
      return std::chrono::steady_clock::time_point(
          std::chrono::nanoseconds(anchor.offsetNs.load(std::memory_order_relaxed) + sinceBase(t)));
    }
    uint64_t ns = 0, at = 0;
    // A split pair is not kept (the next reading tries again); this one is still the steady
    // clock's own.
    if (pairedReading(&ns, &at)) {
      anchor.offsetNs.store(static_cast<int64_t>(ns) - sinceBase(at), std::memory_order_relaxed);
      anchor.ticks.store(at, std::memory_order_release);
    }
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
  }
#endif
  return std::chrono::steady_clock::now();
}

uint64_t ticksToNs(uint64_t ticks) noexcept {
  const Rate& r = rate();
  return r.tsc ? static_cast<uint64_t>(static_cast<double>(ticks) * r.nsPerTick) : ticks;
}

}  // namespace gs::cycle
