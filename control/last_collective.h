// The figures of the last finished collective (gs_comm_stats' last_* fields), written once per
// call without a lock: a sequence lock, since calls on one communicator are serialized (one
// writer at a time) and readers are rare. A mutex here cost two lock operations on every
// call's path, where a small allreduce takes well under a microsecond.
#pragma once

#include <atomic>
#include <cstdint>

namespace gs::control {

class LastCollective {
 public:
  struct Value {
    double seconds = 0, algbw = 0, busbw = 0;
    const char* algorithm = nullptr;  // a static name; null before the first collective
  };

  // One writer at a time (the caller serializes collectives).
  void store(const Value& v) noexcept {
    const uint64_t s = sequence_.load(std::memory_order_relaxed);
    sequence_.store(s + 1, std::memory_order_relaxed);  // odd: a write is under way
    std::atomic_thread_fence(std::memory_order_release);
    seconds_.store(v.seconds, std::memory_order_relaxed);
    algbw_.store(v.algbw, std::memory_order_relaxed);
    busbw_.store(v.busbw, std::memory_order_relaxed);
    algorithm_.store(v.algorithm, std::memory_order_relaxed);
    sequence_.store(s + 2, std::memory_order_release);
  }

  // Any thread: the fields of one store, never a mix of two.
  Value load() const noexcept {
    for (;;) {
      const uint64_t before = sequence_.load(std::memory_order_acquire);
      Value v;
      v.seconds = seconds_.load(std::memory_order_relaxed);
      v.algbw = algbw_.load(std::memory_order_relaxed);
      v.busbw = busbw_.load(std::memory_order_relaxed);
      v.algorithm = algorithm_.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if ((before & 1) == 0 && sequence_.load(std::memory_order_relaxed) == before)
        return v;
    }
  }

 private:
  std::atomic<uint64_t> sequence_{0};
  std::atomic<double> seconds_{0}, algbw_{0}, busbw_{0};
  std::atomic<const char*> algorithm_{nullptr};
};

}  // namespace gs::control
