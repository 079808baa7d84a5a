#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "transport/connection.h"
#include "transport/region_table.h"
#include "transport/ring.h"

namespace gs::transport::loopback {

/// Wakes a device's waitForActivity(). A flag rather than a counter: one wake-up covers any
/// number of events, and an event between the caller's last poll and its wait is not lost.
/// Thread-safe; shared by a device and every connection that may have to wake it.
class Activity {
 public:
  void notify() {
    std::lock_guard lock(mutex_);
    pending_ = true;
    cv_.notify_all();
  }
  template <class Duration>
  void wait(Duration maxWait) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, maxWait, [this] { return pending_; });
    pending_ = false;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool pending_ = false;
};

/// Queue capacities of one side of a link; fixed at connect so the data path never allocates.
inline constexpr size_t kCompletionCapacity = 1024;
inline constexpr size_t kRecvCapacity = 256;
inline constexpr size_t kSendCapacity = 256;

struct PendingOp {
  LocalSegment segment;
  WorkId id = 0;
};

/// One endpoint's state inside a Link. Guarded by Link::mutex.
struct Side {
  Side() : completions(kCompletionCapacity), recvs(kRecvCapacity), incomingSends(kSendCapacity) {}

  int rank = -1;
  std::shared_ptr<RegionTable> regions;  // where the peer's writes land
  std::shared_ptr<Activity> activity;    // this side's device wake-up
  Ring<Completion> completions;
  Ring<PendingOp> recvs;          // buffers this side posted, FIFO
  Ring<PendingOp> incomingSends;  // the peer's sends waiting for one of our recvs
  bool failed = false;
  bool errorReported = false;
  std::string error;
};

/// The shared state of one connected pair: both sides under one mutex (the peer's queues are
/// written by our posts). Side 0 is the lower rank. Owned jointly by the two Connections.
struct Link {
  std::mutex mutex;
  Side sides[2];
};

/// One rank's end of an in-process connection. Posts copy straight into the peer's memory
/// under the link mutex, so a completion means the data is already there. Owned by the caller,
/// used by one thread at a time (see transport::Connection); destroying it fails the peer's end.
class Connection final : public transport::Connection {
 public:
  Connection(std::shared_ptr<Link> link, int side);
  ~Connection() override;

  int peer() const override;
  PostResult postWrite(std::span<const LocalSegment> segments,
                       const RemoteKey& dst,
                       uint64_t dstOffset,
                       uint32_t imm,
                       WorkId id) override;
  PostResult postSend(const LocalSegment& segment, WorkId id) override;
  PostResult postRecv(const LocalSegment& segment, WorkId id) override;
  size_t poll(std::span<Completion> out) override;
  std::string errorMessage() const override;

 private:
  Side& me() { return link_->sides[side_]; }
  Side& other() { return link_->sides[1 - side_]; }
  // Matches a pending send with a posted recv; fails the link if the send does not fit.
  // Both sides' completion queues must have room. Caller holds the mutex.
  void deliverSend(const PendingOp& send, const PendingOp& recv, Side& sender, Side& receiver);

  std::shared_ptr<Link> link_;
  int side_;
};

/// Marks a side failed with message (the first failure wins) and wakes its device.
void failSide(Side& side, std::string message);

}  // namespace gs::transport::loopback
