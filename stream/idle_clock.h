#pragma once

#include <chrono>
#include <cstdint>

#include "common/clock.h"
#include "common/cycle_clock.h"

namespace gs::stream {

// The waits' clock (the chunk protocol's idle rounds, the mailbox waits). Where ranks outnumber
// cores a waiting rank runs one idle round or poll per turn on its core, and a read of the
// steady clock per round (vDSO) was a tenth of its own time (4 ranks on 2 cores, 8 B sendrecv
// over shm, perf). Waits read the cycle counter (common/cycle_clock.h) and count from the last
// steady reading, taken again once the counter says a millisecond passed: a reading is off by the
// counter's rate error over at most that millisecond, and the timeouts, which are far longer, are
// dated by steady readings.
class IdleClock {
 public:
  explicit IdleClock(Clock::time_point start) : anchor_(start), anchorTicks_(cycle::now()) {}
  Clock::time_point now() {
    const auto since = std::chrono::nanoseconds(cycle::ticksToNs(cycle::now() - anchorTicks_));
    if (since < kReanchorAfter)
      return anchor_ + since;
    anchorTicks_ = cycle::now();
    anchor_ = Clock::now();
    return anchor_;
  }

 private:
  static constexpr std::chrono::milliseconds kReanchorAfter{1};
  Clock::time_point anchor_;
  uint64_t anchorTicks_;
};

}  // namespace gs::stream
