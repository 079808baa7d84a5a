#pragma once

// FakeDeviceMemory: a host-memory stand-in for the CUDA runtime behind codecs::DeviceMemory, for
// the staging tests on machines without a GPU (the real one runs in tests/gpu on a GPU machine).
//
// "Device" buffers are host allocations this fake calls device memory. Each stream is a worker
// thread running its copies in order, each after a short random delay, so a host that reads a
// staging slot before waiting for its copy sees the poison the slot was filled with, and a copy
// the host overwrote too early delivers wrong values. Copies are bounds-checked against the
// fake's allocations; violations are collected in errors().

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codecs/device_memory.h"
#include "common/error.h"

namespace gs::testing {

class FakeDeviceMemory final : public codecs::DeviceMemory {
 public:
  FakeDeviceMemory() { defaultStream_ = std::make_unique<Worker>(0); }
  ~FakeDeviceMemory() override {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.clear();  // joins the workers
  }

  const char* name() const override { return "fake"; }

  // ---- test side -------------------------------------------------------------------------
  /// Host memory this fake reports as device `device`'s (filled with 0xAB).
  void* allocDevice(size_t bytes, int device = 0) {
    auto* p = new uint8_t[bytes];
    memset(p, 0xAB, bytes);
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(p)] = {bytes, device, false};
    return p;
  }
  void freeDevice(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    allocations_.erase(reinterpret_cast<uintptr_t>(p));
    delete[] static_cast<uint8_t*>(p);
  }
  /// Runs fn on the stream's worker in order (a "kernel" writing a buffer, a blocked stream).
  void enqueue(Stream stream, std::function<void()> fn) { worker(stream).push(std::move(fn)); }
  /// Every later op of the stream waits this long before it runs (instead of up to 300 us).
  void setStreamDelay(Stream stream, std::chrono::microseconds delay) {
    worker(stream).setDelay(delay);
  }
  /// Waits until the stream ran everything enqueued so far.
  void synchronize(Stream stream) {
    auto flag = std::make_shared<std::atomic<bool>>(false);
    worker(stream).push([flag] { flag->store(true); });
    while (!flag->load())
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::vector<std::string> errors() const {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  /// Streams made by createStream() (tests' and the library's) and destroyed by destroyStream().
  int streamsCreated() const { return streamsCreated_.load(); }
  int streamsDestroyed() const { return streamsDestroyed_.load(); }
  size_t maxPinnedBytes() const { return maxPinned_.load(); }
  size_t pinnedBytes() const { return pinned_.load(); }

  // ---- DeviceMemory ----------------------------------------------------------------------
  int deviceOf(const void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Allocation* a = find(p, 1);
    return a != nullptr && !a->pinned ? a->device : -1;
  }
  int streamDevice(Stream) override { return 0; }
  int setDevice(int device) override { return current_.exchange(device); }

  /// A stream of its own worker. Its thread lives until the fake goes (destroyStream counts).
  Stream createStream() override {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(std::make_unique<Worker>(static_cast<int>(streams_.size()) + 1));
    ++streamsCreated_;
    return reinterpret_cast<Stream>(streams_.back().get());
  }
  void destroyStream(Stream stream) noexcept override {
    if (stream != nullptr)
      ++streamsDestroyed_;
  }

  void* allocPinned(size_t bytes) override {
    auto* p = new uint8_t[bytes];
    memset(p, 0xFF, bytes);  // NaN for floating point: a slot read before its copy shows
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(p)] = {bytes, -1, true};
    const size_t now = pinned_ += bytes;
    if (now > maxPinned_)
      maxPinned_ = now;
    return p;
  }
  void freePinned(void* p) noexcept override {
    if (p == nullptr)
      return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations_.end() || !it->second.pinned) {
      errors_.push_back("freePinned of memory that allocPinned did not return");
      return;
    }
    pinned_ -= it->second.bytes;
    allocations_.erase(it);
    delete[] static_cast<uint8_t*>(p);
  }

  void copy2D(void* dst,
              size_t dstPitch,
              const void* src,
              size_t srcPitch,
              size_t width,
              size_t rows,
              Stream stream) override {
    if (width == 0 || rows == 0)
      return;
    checkRange(dst, (rows - 1) * dstPitch + width, "copy destination");
    checkRange(src, (rows - 1) * srcPitch + width, "copy source");
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    worker(stream).push([=] {
      for (size_t r = 0; r < rows; ++r)
        memcpy(d + r * dstPitch, s + r * srcPitch, width);
    });
  }

  struct FakeEvent {
    std::shared_ptr<std::atomic<bool>> passed = std::make_shared<std::atomic<bool>>(true);
  };
  Event* createEvent() override { return reinterpret_cast<Event*>(new FakeEvent); }
  void destroyEvent(Event* e) noexcept override { delete reinterpret_cast<FakeEvent*>(e); }
  void record(Event* e, Stream stream) override {
    auto flag = std::make_shared<std::atomic<bool>>(false);
    reinterpret_cast<FakeEvent*>(e)->passed = flag;
    worker(stream).push([flag] { flag->store(true); });
  }
  bool done(Event* e) override { return reinterpret_cast<FakeEvent*>(e)->passed->load(); }
  void streamWait(Stream stream, Event* e) override {
    auto flag = reinterpret_cast<FakeEvent*>(e)->passed;
    worker(stream).push([flag] {
      while (!flag->load())
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    });
  }

 private:
  struct Allocation {
    size_t bytes;
    int device;
    bool pinned;
  };

  // A stream: ops run in order on one thread, each after a random delay of up to 300 us.
  class Worker {
   public:
    explicit Worker(int seed) : rng_(seed), thread_([this] { loop(); }) {}
    ~Worker() {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    void setDelay(std::chrono::microseconds d) { delayUs_ = d.count(); }
    void push(std::function<void()> fn) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ops_.push_back(std::move(fn));
      }
      cv_.notify_all();
    }

   private:
    void loop() {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        cv_.wait(lock, [&] { return stop_ || !ops_.empty(); });
        if (ops_.empty())
          return;
        auto fn = std::move(ops_.front());
        ops_.pop_front();
        lock.unlock();
        const int64_t fixed = delayUs_.load();
        std::this_thread::sleep_for(std::chrono::microseconds(fixed > 0 ? fixed : rng_() % 300));
        fn();
        lock.lock();
      }
    }
    std::mt19937 rng_;
    std::atomic<int64_t> delayUs_{0};
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> ops_;
    bool stop_ = false;
    std::thread thread_;
  };

  Worker& worker(Stream stream) {
    return stream == nullptr ? *defaultStream_ : *reinterpret_cast<Worker*>(stream);
  }

  // The allocation holding [p, p + bytes), or null (mu_ held).
  const Allocation* find(const void* p, size_t bytes) const {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    auto it = allocations_.upper_bound(addr);
    if (it == allocations_.begin())
      return nullptr;
    --it;
    return addr + bytes <= it->first + it->second.bytes ? &it->second : nullptr;
  }
  // Device and pinned memory must hold the whole range (plain host buffers are not tracked).
  void checkRange(const void* p, size_t bytes, const char* what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (find(p, 1) != nullptr && find(p, bytes) == nullptr)
      errors_.push_back(std::string(what) + " runs past the end of its allocation");
  }

  mutable std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;
  std::vector<std::unique_ptr<Worker>> streams_;
  std::unique_ptr<Worker> defaultStream_;
  std::vector<std::string> errors_;
  std::atomic<size_t> pinned_{0}, maxPinned_{0};
  std::atomic<int> current_{0};
  std::atomic<int> streamsCreated_{0}, streamsDestroyed_{0};
};

}  // namespace gs::testing
