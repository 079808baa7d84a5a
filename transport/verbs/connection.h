#pragma once

#include <poll.h>

#include <string>
#include <vector>

#include <infiniband/verbs.h>

#include "transport/connection.h"
#include "transport/ring.h"
#include "transport/sockets/handshake.h"
#include "transport/verbs/handles.h"
#include "transport/verbs/hw_counters.h"
#include "transport/verbs/wire.h"

namespace gs::transport::verbs {

class Device;

/// One rank's end of a verbs connection: RC queue pairs to one peer on a completion queue of
/// its own, plus the authenticated tcp socket they were set up over, kept open as a liveness
/// channel (a peer that exits closes it, which we notice at once instead of after the RC retry
/// timeout; a connection that fails closes it, so the peer learns too).
///
/// QP 0 carries two-sided messages (postSend/postRecv, FIFO); QPs 1..n carry one-sided RDMA
/// WRITE WITH IMM, spread round-robin (ECMP entropy on RoCE), each with zero-length receives
/// posted for the immediates. Selective signaling: a write whose source must stay untouched
/// (not inline, not empty) is signaled; inline and empty writes complete at once for the caller
/// and only every kSignalEvery-th of them is signaled, to retire send-queue entries. Send
/// queues, receive queues and the completion ring are bounded and sized at construction: the
/// data path never allocates and never throws.
///
/// Owned by the caller; used by one thread at a time (the device's waitForActivity() runs on
/// that same thread). Must be destroyed before its Device.
class Connection final : public transport::Connection {
 public:
  static constexpr uint32_t kSendDepth = 128;    // per data QP
  static constexpr uint32_t kRecvDepth = 256;    // per data QP
  static constexpr uint32_t kMessageDepth = 64;  // QP 0, both queues
  static constexpr uint32_t kSignalEvery = 32;
  static constexpr uint32_t kInlineBytes = 128;

  /// Creates the completion queue and the queue pairs (INIT state, receives posted).
  Connection(Device& device, int peer, std::string peerAddress, sockets::Socket side);
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
  /// The port's congestion counters (ECN marks, CNPs, retransmissions) from sysfs.
  bool linkInfo(LinkInfo* out) const override { return counters_.read(out); }

  // Set-up, driven by Device::connect().
  sockets::Socket& side() { return side_; }
  QpExchange localInfo(int rank) const;
  /// Validates the peer's exchange (untrusted bytes) and moves every QP to RTS.
  void activate(const QpExchange& remote);
  std::string describe() const;

  // Used by the device's waitForActivity() and async-event handling (same thread).
  /// Moves completed work from the CQ to the completion ring; true when completions wait.
  bool drain();
  void armCompletionEvents();
  void appendPollFds(std::vector<pollfd>& fds) const;
  /// Checks the side channel after poll() reported activity on it.
  void checkSide();
  bool ownsQp(const ibv_qp* qp) const;
  ibv_cq* cq() const { return cq_.get(); }
  void countCqEvent() { ++cqEvents_; }
  void fail(Errc status, const std::string& why) noexcept;

 private:
  struct Pending {
    WorkId id = 0;
    CompletionKind kind = CompletionKind::kWrite;
    bool reported = false;  // its completion was handed out at post time
    uint64_t seq = 0;
  };
  struct Qp {
    VerbsPtr<ibv_qp> qp;
    Ring<Pending> sent;  // posted, not yet retired by a signaled completion
    uint64_t nextSeq = 0;
    uint32_t sinceSignal = 0;
    uint32_t toRepost = 0;  // receives consumed, to be posted again
  };

  void createQps();
  PostResult postOnQp(
      size_t index, ibv_send_wr& wr, WorkId id, CompletionKind kind, size_t bytes, bool mustSignal);
  void handle(const ibv_wc& wc);
  void retire(Qp& q, uint64_t seq);
  void repostReceives(size_t index);
  bool push(const Completion& c);
  std::string qpName(size_t index) const;

  Device& device_;
  int peer_;
  std::string peerAddress_;
  sockets::Socket side_;
  VerbsPtr<ibv_cq> cq_;
  std::vector<Qp> qps_;  // [0] two-sided messages, [1..] data; destroyed before cq_
  size_t nextDataQp_ = 1;
  uint32_t psn_ = 0;
  uint32_t maxInline_ = 0;
  unsigned cqEvents_ = 0;
  Ring<WorkId> recvIds_;  // user receives posted on QP 0, FIFO
  Ring<Completion> completions_;
  size_t reserve_ = 0;  // completions that in-flight work may still produce
  uint32_t pollCount_ = 0;
  bool failed_ = false;
  bool errorReported_ = false;
  int flushedQp_ = -1;  // a QP whose work was flushed before any error explained it
  Errc status_ = Errc::kOk;
  std::string message_;
  std::string remoteDescription_;
  ibv_mtu mtu_ = IBV_MTU_1024;
  mutable PortCounters counters_;
};

}  // namespace gs::transport::verbs
