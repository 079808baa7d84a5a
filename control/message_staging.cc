#include "control/message_staging.h"

#include <algorithm>

#include "common/error.h"

namespace gs::control {

MessageStaging::MessageStaging(std::shared_ptr<codecs::DeviceMemory> memory,
                               int64_t poolBytes,
                               int64_t timeoutMs,
                               const std::atomic<bool>& abortFlag)
    : memory_(std::move(memory)),
      poolBytes_(static_cast<size_t>(std::max<int64_t>(poolBytes, 0))),
      timeoutMs_(timeoutMs),
      abortFlag_(abortFlag) {}

MessageStaging::~MessageStaging() {
  // A copy that failed its wait (a stream that never got there) may still write a buffer: give
  // it the timeout, then free regardless (freeing pinned memory waits for the device itself).
  releaseDevice();
  for (const Buffer& b : inUse_)
    memory_->freePinned(b.p);
  for (const Buffer& b : pool_)
    memory_->freePinned(b.p);
}

void MessageStaging::releaseDevice() noexcept {
  if (device_ < 0)
    return;
  try {
    CurrentDevice current(*memory_, device_);
    waitFor(copied_, "the last message copy", "the last message copy");
  } catch (const Error&) {
    // Broken or aborted: the buffers are freed regardless.
  }
  memory_->destroyEvent(copied_);
  memory_->destroyStream(stream_);
  copied_ = nullptr;
  stream_ = nullptr;
  device_ = -1;
}

void MessageStaging::useDevice(int device) {
  if (device_ == device)
    return;
  releaseDevice();
  // Made on `device` (the caller made it current).
  codecs::DeviceMemory::Event* event = memory_->createEvent();
  try {
    stream_ = memory_->createStream();
  } catch (...) {
    memory_->destroyEvent(event);
    throw;
  }
  copied_ = event;
  device_ = device;
}

void* MessageStaging::acquire(size_t bytes) {
  // The smallest pooled buffer that fits, unless it is more than 4x too large.
  size_t best = pool_.size();
  for (size_t i = 0; i < pool_.size(); ++i) {
    if (pool_[i].bytes >= bytes && pool_[i].bytes / 4 <= bytes &&
        (best == pool_.size() || pool_[i].bytes < pool_[best].bytes)) {
      best = i;
    }
  }
  if (best < pool_.size()) {
    const Buffer b = pool_[best];
    pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(best));
    pooledBytes_ -= b.bytes;
    inUse_.push_back(b);
    return b.p;
  }
  // Powers of two from 4 KiB: messages of similar sizes share buffers.
  size_t rounded = 4096;
  while (rounded < bytes)
    rounded *= 2;
  void* p = memory_->allocPinned(rounded);
  inUse_.push_back({p, rounded});
  heldBytes_ += rounded;
  return p;
}

void MessageStaging::release(void* p) {
  auto it = std::find_if(inUse_.begin(), inUse_.end(), [&](const Buffer& b) { return b.p == p; });
  GS_CHECK(it != inUse_.end(), Errc::kInternal, "a staging buffer released twice");
  pool_.push_back(*it);
  pooledBytes_ += it->bytes;
  inUse_.erase(it);
}

void MessageStaging::trim() {
  // The least recently released first (the pool's front): the buffers the last messages used
  // are what the next ones of the same sizes need.
  size_t drop = 0;
  while (pooledBytes_ > poolBytes_ && drop < pool_.size()) {
    memory_->freePinned(pool_[drop].p);
    pooledBytes_ -= pool_[drop].bytes;
    heldBytes_ -= pool_[drop].bytes;
    ++drop;
  }
  pool_.erase(pool_.begin(), pool_.begin() + static_cast<std::ptrdiff_t>(drop));
}

void MessageStaging::copy(
    void* dst, const void* src, size_t bytes, const StreamMark& issued, const char* what) {
  CurrentDevice current(*memory_, issued.device());
  useDevice(issued.device());
  memory_->streamWait(stream_, issued.event());
  memory_->copy2D(dst, bytes, src, bytes, bytes, 1, stream_);
  memory_->record(copied_, stream_);
  waitFor(copied_, what, "its copy between device and pinned host memory");
}

void MessageStaging::waitFor(const StreamMark& issued, const char* what) {
  waitFor(issued.event(), what, "the work enqueued on its stream before it");
}

void MessageStaging::waitFor(codecs::DeviceMemory::Event* event,
                             const char* what,
                             const char* waitingFor) {
  if (memory_->done(event))
    return;  // the usual case: no description to build
  waitForEvent(*memory_, event, timeoutMs_, abortFlag_,
               formatString("%s (%s)", waitingFor, what).c_str());
}

}  // namespace gs::control
