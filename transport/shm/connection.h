#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "transport/connection.h"
#include "transport/ring.h"
#include "transport/shm/segment.h"
#include "transport/shm/wire.h"

namespace gs::transport::shm {

class Device;

/// What Device::connect() hands a new connection: the mapped segments and who the peer is.
struct ConnectionSetup {
  int rank = -1;
  int peer = -1;
  int side = 0;                      // 0: we are the lower rank (acceptor), 1: the higher (dialer)
  std::unique_ptr<Segment> segment;  // the connection's ConnectionBlock
  std::unique_ptr<Segment> peerControl;  // the peer device's ControlBlock (its doorbell)
  std::string peerPrefix;                // names of the peer's regions start so
  uint64_t peerToken = 0;
  int32_t peerPid = 0;
  AuthTag expectedPeerProof{};  // the hello the peer must write (dialers check it in poll)
  bool peerReadsUs = false;     // acceptors: the dialer's hello says it reads our memory
};

/// One rank's end of a shared-memory connection. A write copies the segments straight into
/// the peer's region (mapped on first use, bounds checked against the mapping) and queues a
/// notice; its kWrite completion is immediate. Sends copy into a message slot of the shared
/// queue, which the peer matches with its posted receives in order.
///
/// A peer is gone when its half says closed (its Connection was destroyed), its device says
/// closed, or its process exited (pidfd, checked every few milliseconds while polling).
/// Bounded queues give kWouldBlock when full. Used by one thread at a time.
enum class NoticeRoom { kRoom, kFull, kCorrupt };

class Connection final : public transport::Connection {
 public:
  Connection(Device& device, ConnectionSetup setup);
  ~Connection() override;

  int peer() const override { return peer_; }
  PostResult postWrite(std::span<const LocalSegment> segments,
                       const RemoteKey& dst,
                       uint64_t dstOffset,
                       uint32_t imm,
                       WorkId id) override;
  PostResult postSend(const LocalSegment& segment, WorkId id) override;
  PostResult postRecv(const LocalSegment& segment, WorkId id) override;
  size_t poll(std::span<Completion> out) override;
  std::string errorMessage() const override;
  bool peerReadsOurMemory() const override { return peerReadsUs_ && !failed_; }
  bool readPeerMemory(uint64_t address, void* dst, size_t bytes, std::string* why) override;

  size_t smallExchangeBytes() const override { return failed_ ? 0 : kSmallBytes; }
  void postSmall(uint64_t sequence, uint64_t tag, const void* data, uint32_t bytes) override;
  SmallPoll pollSmall(uint64_t sequence, SmallArrival* out) override;
  uint64_t peerSmallSequence() const override;
  void postSmallFailure(uint64_t completedThrough) override;

  size_t messageBoxBytes() const override { return failed_ ? 0 : kMessageBoxBytes; }
  bool postBox(uint64_t sequence,
               uint32_t ordinal,
               uint32_t dtype,
               uint64_t count,
               const void* data,
               uint32_t bytes) override;
  BoxPoll pollBox(uint64_t sequence, BoxArrival* out) override;
  void takeBox(uint64_t sequence) override;
  bool boxTaken(uint64_t sequence) const override;
  bool expectBox(uint64_t sequence, uint32_t ordinal, uint32_t dtype, uint64_t count) override;
  bool boxAccepted(uint64_t sequence,
                   uint32_t ordinal,
                   uint32_t dtype,
                   uint64_t count) const override;
  bool boxHolds(uint64_t firstSequence, uint32_t ordinal, BoxArrival* out) override;

  /// Whether poll() may have something to report (the device's wait checks this before it
  /// sleeps). Reads shared words only; never fails the connection.
  bool hasNews() const;

 private:
  struct PendingRecv {
    LocalSegment segment;
    WorkId id = 0;
  };
  struct MappedRegion {
    uint32_t id = 0;
    std::unique_ptr<Segment> segment;
  };

  Half& outgoing() const { return block_->halves[side_]; }
  Half& incoming() const { return block_->halves[1 - side_]; }
  void fail(std::string message);
  // Tells the peer we refuse what it did, then fails this end.
  void reject(RejectReason reason, uint32_t length, uint64_t detail, std::string message);
  // Whether the outgoing notice queue has a free slot (kCorrupt: the peer's head is
  // impossible; the connection failed).
  NoticeRoom noticeRoom();
  bool pushNotice(const Notice& notice);
  // Whether the next incoming notice is there (its slot carries its sequence).
  bool noticeArrived() const;
  // The peer's writable region named by key, mapped; null with *why set when there is none.
  Segment* targetRegion(const RemoteKey& key, std::string* why);
  bool peerHelloChecked();
  size_t takeNotices(std::span<Completion> out);
  size_t takeMessages(std::span<Completion> out);
  void checkPeerAlive();

  Device& device_;
  int rank_;
  int peer_;
  int side_;
  std::unique_ptr<Segment> segment_;
  ConnectionBlock* block_;
  std::unique_ptr<Segment> peerControlSegment_;
  ControlBlock* peerControl_;
  std::string peerPrefix_;
  uint64_t peerToken_;
  int32_t peerPid_;
  AuthTag expectedPeerProof_;
  bool peerReady_;
  bool peerReadsUs_;  // its hello's readsPeerMemory (known once peerReady_)
  int pidfd_ = -1;
  Clock::time_point nextLivenessCheck_{};
  uint32_t pollsSinceClock_ = 0;  // polls since the clock was last read (checkPeerAlive)
  uint64_t smallTaken_ = 0;       // the latest small exchange read from the peer
  // What hasNews() reported of the peer's small exchanges and failure flag (each once).
  mutable uint64_t smallNewsReported_ = 0;
  mutable bool smallFailureReported_ = false;
  mutable uint64_t boxNewsReported_ = 0;  // hasNews(): the box words' sum it last reported
  // Reads a box's description once (the peer may scribble on it): false, and the connection
  // failed, when its length is impossible.
  bool readBox(MessageBox& box, BoxArrival* out);

  Ring<Completion> completions_;
  Ring<PendingRecv> recvs_;
  std::vector<MappedRegion> mapped_;
  // Queue positions, kept here: the shared copies are what the peer reads (and could spoil).
  uint64_t noticeTail_ = 0;      // next outgoing notice
  uint64_t noticeRoomHead_ = 0;  // the peer's notice head as last read (noticeRoom)
  uint64_t messageTail_ = 0;     // next outgoing message
  uint64_t noticeHead_ = 0;      // next incoming notice
  uint64_t messageHead_ = 0;     // next incoming message
  bool failed_ = false;
  bool errorReported_ = false;
  std::string error_;
};

}  // namespace gs::transport::shm
