#pragma once

#include <chrono>
#include <cstdint>

#include "common/cycle_clock.h"

namespace gs {

using Clock = std::chrono::steady_clock;

/// A point in time after which a wait gives up. Every blocking wait in the library takes one.
/// Read off cycle::steadyNow(): a small call makes one and asks whether it expired in its
/// loops, and a deadline's few tens of nanoseconds do not matter.
class Deadline {
 public:
  static Deadline after(std::chrono::milliseconds d) { return Deadline(cycle::steadyNow() + d); }
  static Deadline afterMs(int64_t ms) { return after(std::chrono::milliseconds(ms)); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  bool expired() const { return cycle::steadyNow() >= at_; }
  Clock::time_point at() const { return at_; }
  /// Time left, never negative.
  std::chrono::nanoseconds remaining() const {
    auto left = at_ - cycle::steadyNow();
    return left.count() > 0 ? std::chrono::duration_cast<std::chrono::nanoseconds>(left)
                            : std::chrono::nanoseconds(0);
  }
  int remainingMs() const {
    return static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(remaining()).count());
  }
  Deadline earlier(const Deadline& other) const { return other.at_ < at_ ? other : *this; }

 private:
  Clock::time_point at_;
};

}  // namespace gs
