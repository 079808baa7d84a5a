#pragma once

#include <poll.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "transport/connection.h"
#include "transport/region_table.h"
#include "transport/ring.h"
#include "transport/sockets/handshake.h"
#include "transport/tcp/wire.h"

namespace gs::transport::tcp {

class Device;

/// One rank's end of a tcp connection: several non-blocking sockets to the same peer. Each
/// message (frame header + payload) goes whole on one socket, the least loaded; the header and
/// the payload segments leave in one writev, and the receiver reads payloads straight into the
/// registered target region. Bounded rings (ops per socket, posted receives, completions) are
/// sized at construction, so posting and polling never allocate or throw.
///
/// Owned by the caller; used by one thread at a time, except appendPollFds(), which the
/// device's waitForActivity() may call from another thread. Must be destroyed before its
/// Device; destroying it closes the sockets, which the peer sees as "closed by peer".
class Connection final : public transport::Connection {
 public:
  static constexpr size_t kOpsPerSocket = 64;
  static constexpr size_t kMaxPostedRecvs = 256;

  Connection(Device& device,
             int peer,
             std::string peerAddress,
             std::vector<sockets::Socket> established,
             std::shared_ptr<RegionTable> regions);
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
  void beginPostBatch() override { batching_ = true; }
  void endPostBatch() override;
  void beginGather() override { gathering_ = true; }
  void endGather() override;
  std::string errorMessage() const override;

  void appendReadinessFds(std::vector<pollfd>& fds) const override;
  void takeReadiness(std::span<const pollfd> fds) override;
  bool landsInPlace() const override { return true; }
  void landAt(uint8_t* slot,
              std::span<const uint8_t> expect,
              uint8_t* dst,
              uint32_t bytes) override;
  void clearLandings() override;

  /// TCP_INFO of every live socket: the largest rtt, summed retransmits and cwnd.
  bool linkInfo(transport::LinkInfo* out) const override;

  /// Appends each live socket with the events it waits for. Thread-safe (reads atomics only).
  void appendPollFds(std::vector<pollfd>& fds) const;

 private:
  struct SendOp {
    WorkId id = 0;
    CompletionKind kind = CompletionKind::kWrite;
    uint8_t segments = 0;
    FrameHeader header{};
    const uint8_t* segData[kMaxSegments] = {};
    size_t segLen[kMaxSegments] = {};
    size_t total = 0;  // header + payload bytes
    size_t written = 0;
  };
  struct PostedRecv {
    uint8_t* data = nullptr;
    size_t length = 0;
    WorkId id = 0;
  };
  enum class RecvState : uint8_t { kHeader, kPayload, kWaitRecv };
  // Bytes a socket reads ahead of the frame it is in (see receive()).
  static constexpr size_t kReadAheadBytes = 8 << 10;
  // One socket with its send queue and receive state machine.
  struct Channel {
    explicit Channel(sockets::Socket s)
        : socket(std::move(s)), ops(kOpsPerSocket), ahead(new uint8_t[kReadAheadBytes]) {}
    sockets::Socket socket;
    std::atomic<int> fd{-1};       // -1 once closed; read by appendPollFds
    std::atomic<short> events{0};  // what waitForActivity should wait for
    Ring<SendOp> ops;
    size_t unwritten = 0;  // index in ops of the first op not yet fully written
    size_t queuedBytes = 0;
    RecvState state = RecvState::kHeader;
    FrameHeader header{};  // the frame being received
    // Read ahead: what arrived past the frame in hand (headers, small payloads, the start of a
    // large one), [aheadBegin, aheadEnd) of ahead, consumed before the socket is read again.
    std::unique_ptr<uint8_t[]> ahead;
    size_t aheadBegin = 0, aheadEnd = 0;
    uint32_t sendLength = 0;  // a send frame waiting for a posted receive
    uint8_t* payloadAt = nullptr;
    size_t payloadLeft = 0;
    // A write that may land in place (landAt): after [payloadAt, payloadLeft) (its first bytes,
    // to the slot) come nextLeft more, to nextAt (the landing's dst) if those first bytes are
    // `expect`, else to slotNext (after them in the slot).
    std::array<uint8_t, kMaxLandingPrefix> expect{};
    uint32_t keep = 0;
    uint8_t* nextAt = nullptr;
    size_t nextLeft = 0;
    uint8_t* slotNext = nullptr;
    uint8_t* landedFrom = nullptr;  // dst while the payload goes there, else null
    Completion landing{};           // reported when the payload is complete
    bool closedByPeer = false;      // end of file seen between frames
    bool gathered = false;          // holds frames of a gather (endGather writes them)
    // Whether a read may find bytes: false once a read came back short (the socket is
    // drained) or a readiness check said nothing is there; true again after each poll().
    bool mayHaveData = true;
  };

  struct Landing {
    uint8_t* slot;
    uint32_t keep;
    std::array<uint8_t, kMaxLandingPrefix> expect;
    uint8_t* dst;
    uint32_t bytes;
  };
  std::vector<Landing> landings_;  // at most one per slot (a run's next chunks)

  PostResult enqueue(const SendOp& op);
  // Where op goes: in a batch, behind the small frames already waiting on a socket; otherwise
  // the least-loaded socket with room. Null when every socket is full or closed.
  Channel* chooseChannel(const SendOp& op);
  // Writes as much queued data as the kernel takes (bounded) and retires finished ops.
  void flush(Channel& ch);
  // flush() and updateEvents() for every socket with unwritten frames (all: endPostBatch;
  // those holding a gather's frames: endGather).
  void flushHeld(bool gatheredOnly);
  void retire(Channel& ch);
  // Reads and dispatches incoming frames (bounded).
  void receive(Channel& ch);
  // Advances ch's frames as far as the bytes read ahead go; false when it cannot go on now
  // (completion queue full, a send frame without a posted receive, a bad frame).
  bool consumeAhead(Channel& ch);
  bool startFrame(Channel& ch);
  bool startSend(Channel& ch);
  void updateEvents(Channel& ch);
  void failIo(const boost::system::error_code& ec);
  // The peer closed this socket cleanly. Its other sockets may still hold frames it sent
  // before (an abort notice saying which rank failed first): the connection fails only once
  // every socket is closed.
  void closeChannel(Channel& ch);
  void fail(Errc status, std::string message);

  Device& device_;
  const int peer_;
  const std::string peerAddress_;
  std::shared_ptr<RegionTable> regions_;
  std::vector<std::unique_ptr<Channel>> channels_;
  Ring<Completion> completions_;
  Ring<PostedRecv> recvs_;
  size_t nextChannel_ = 0;  // round-robin start for choosing among equally loaded sockets
  bool batching_ = false;   // between beginPostBatch and endPostBatch: posts wait to be flushed
  bool gathering_ = false;  // between beginGather and endGather: every post waits
  bool failed_ = false;
  bool errorReported_ = false;
  Errc failStatus_ = Errc::kOk;
  std::string error_;
};

}  // namespace gs::transport::tcp
