#pragma once

#include <poll.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/completion.h"
#include "transport/memory.h"

namespace gs::transport {

/// A reliable, connected channel to one peer with RDMA-like semantics (NCCL net plugin
/// contract). Non-blocking: post*() queue work and return at once, poll() reports completions.
/// The data path never throws and never allocates.
///
/// Ordering: writes and sends posted on one connection may land at the peer in any order
/// (several sockets or queue pairs carry them); each lands whole. A completion of kind
/// kRemoteWrite means the whole payload is visible in the target region.
///
/// Thread safety: not thread-safe; one thread (the communicator's progress thread at a time)
/// posts and polls. Owned by the caller; must be destroyed before its Device.
/// The transport's own measurements of a link (what the control plane reads besides its
/// own counters). Fields a transport cannot measure stay 0.
struct LinkInfo {
  double rttSeconds = 0;     // smoothed round-trip time (tcp: the largest over its sockets)
  double rttVarSeconds = 0;  // its variation
  uint64_t retransmits = 0;  // cumulative retransmitted segments / packets
  uint64_t cwndBytes = 0;    // congestion window, summed over sockets / queue pairs
  uint64_t ecnMarked = 0;    // verbs: RoCE ECN-marked packets (hw counters in sysfs)
  uint64_t cnpReceived = 0;  // verbs: congestion notification packets handled
};

/// What pollSmall() found in the peer's mailbox for the exchange asked about.
enum class SmallPoll {
  kPending,     // not there yet
  kArrived,     // *out describes it (its tag and length are the peer's: compare them)
  kPeerFailed,  // the peer failed in this exchange (postSmallFailure); *out describes its part if
                // that came first (data non-null): a mismatch found there is the cause
  kFailed,      // the connection failed (errorMessage() says why)
};
struct SmallArrival {
  uint64_t tag = 0;
  uint32_t bytes = 0;             // at most smallExchangeBytes()
  const uint8_t* data = nullptr;  // in the mailbox, valid until the exchange two after this one
};

/// A point-to-point message found in the peer's box (Connection::pollBox), as the peer
/// described it (untrusted beyond `bytes`, which is checked against messageBoxBytes()).
struct BoxArrival {
  uint32_t ordinal = 0;
  uint32_t dtype = 0;
  uint64_t count = 0;
  uint32_t bytes = 0;
  const uint8_t* data = nullptr;  // in the box, valid until takeBox()
};
enum class BoxPoll {
  kPending,  // not there yet
  kArrived,  // *out describes it
  kFailed,   // the connection failed (errorMessage() says why)
};

class Connection {
 public:
  static constexpr size_t kMaxSegments = 4;

  virtual ~Connection() = default;

  virtual int peer() const = 0;

  /// One-sided write with immediate: the concatenated segments (at most kMaxSegments, total may
  /// be zero) land in the peer's region named by dst, at dstOffset; the peer then gets a
  /// kRemoteWrite completion carrying imm and the byte count. The segments must stay untouched
  /// until our kWrite completion with this id.
  virtual PostResult postWrite(std::span<const LocalSegment> segments,
                               const RemoteKey& dst,
                               uint64_t dstOffset,
                               uint32_t imm,
                               WorkId id) = 0;

  /// Two-sided send into the next buffer the peer posted with postRecv (FIFO). A send longer
  /// than that buffer fails the connection.
  virtual PostResult postSend(const LocalSegment& segment, WorkId id) = 0;
  virtual PostResult postRecv(const LocalSegment& segment, WorkId id) = 0;

  /// Drives the connection and returns up to out.size() completions. Never blocks.
  virtual size_t poll(std::span<Completion> out) = 0;
  /// Between beginPostBatch() and endPostBatch() a transport may hold what is posted and send
  /// it together at the end (tcp: the frames of a progress round leave in one writev on one
  /// socket instead of a system call each, which a small message's latency is made of). Posts
  /// outside a batch leave at once; poll() and endPostBatch() send what a batch held. Default:
  /// nothing held.
  virtual void beginPostBatch() {}
  virtual void endPostBatch() {}
  /// Between beginGather() and endGather() the caller posts writes back to back, with no
  /// other work in between: a transport may hold them, large ones too, and send them together
  /// at endGather() (tcp: one writev per socket; over loopback 4 chunks of 256 KiB written as
  /// one 1 MiB writev took 144 us of the sender's time against 4 x 58 us one at a time).
  /// poll() and endGather() send what a gather held. Default: nothing held.
  virtual void beginGather() {}
  virtual void endGather() {}

  /// Why the connection failed; empty while it is healthy.
  virtual std::string errorMessage() const = 0;

  /// Readiness for the next poll(), asked of the kernel for many connections at once. A
  /// transport whose poll() costs a system call per socket (tcp: a read that mostly finds
  /// nothing) appends its sockets (events POLLIN); the caller runs one poll(2) over a round's
  /// sockets and hands each connection its entries back, revents filled, and the next poll()
  /// reads only the sockets that have something. A poll() without them reads every socket, as
  /// before. Defaults: nothing to ask (shared memory and verbs poll memory).
  virtual void appendReadinessFds(std::vector<pollfd>& fds) const { (void)fds; }
  virtual void takeReadiness(std::span<const pollfd> fds) { (void)fds; }

  /// Landing in place (tcp): the payload of the peer's next write to `slot` (an address in a
  /// region this end registered) may be read from the socket straight to where its receiver
  /// would copy it. The write's first expect.size() bytes (at most kMaxLandingPrefix: a chunk
  /// header) go to `slot` as usual; when they equal `expect` and the write is exactly that
  /// plus `bytes` long, the next `bytes` go to `dst`, and its kRemoteWrite completion carries
  /// kLandedInPlace as its id. Any other write lands in `slot` whole: nothing reaches `dst`
  /// that its receiver would not have copied there. A landing is used once; a later one for
  /// the same slot replaces it. clearLandings() forgets them all and sends the rest of a
  /// payload being received into its slot: `dst` is the caller's again. Transports whose writes
  /// land in memory the peer writes itself (shm, verbs) have no such path (landsInPlace()
  /// false) and ignore both.
  static constexpr WorkId kLandedInPlace = 1;
  static constexpr size_t kMaxLandingPrefix = 64;
  virtual bool landsInPlace() const { return false; }
  virtual void landAt(uint8_t* slot,
                      std::span<const uint8_t> expect,
                      uint8_t* dst,
                      uint32_t bytes) {
    (void)slot;
    (void)expect;
    (void)dst;
    (void)bytes;
  }
  virtual void clearLandings() {}

  /// Single copy between processes of one host (shm with cross-memory attach): whether the peer
  /// has shown it can read this process's memory, so a sender may hand it where a payload is
  /// instead of copying the payload (format::kChunkFlagPeerMemory). False where unsupported.
  virtual bool peerReadsOurMemory() const { return false; }

  /// Copies `bytes` at `address` in the peer's process into dst, synchronously. False with
  /// *why set when it cannot (the peer exited, the range is not mapped there, the kernel forbids
  /// it, or the transport has no such path). The address comes from the peer: untrusted, but it
  /// can only name the peer's own memory, and dst's length is the caller's.
  virtual bool readPeerMemory(uint64_t address, void* dst, size_t bytes, std::string* why) {
    (void)address;
    (void)dst;
    (void)bytes;
    *why = "this transport cannot read a peer's memory";
    return false;
  }

  /// Small exchanges outside the chunk protocol (shm: two mailboxes per direction in the shared
  /// segment): a latency path for calls of at most smallExchangeBytes() (0: none, the default)
  /// in which both ends post exchange s once, in the same order (s = 1, 2, ...), and each reads
  /// the other's. An end posts s + 2 only after it read the peer's s + 1, which the peer posts
  /// after reading our s, so two mailboxes never hold a payload still being read.
  virtual size_t smallExchangeBytes() const { return 0; }
  virtual void postSmall(uint64_t sequence, uint64_t tag, const void* data, uint32_t bytes) {
    (void)sequence;
    (void)tag;
    (void)data;
    (void)bytes;
  }
  virtual SmallPoll pollSmall(uint64_t sequence, SmallArrival* out) {
    (void)sequence;
    (void)out;
    return SmallPoll::kFailed;
  }
  /// The latest exchange the peer posted (0: none): ahead of ours, it runs a small exchange
  /// while we run something else.
  virtual uint64_t peerSmallSequence() const { return 0; }
  /// Tells a peer waiting in (or about to enter) an exchange that this end failed, having
  /// completed the calls of exchanges up to `completedThrough` (0: none): the peer may still
  /// take those (kArrived), all later ones fail (kPeerFailed). A rank that finished a call and
  /// failed in a later one did not fail the first: its peer may not have read its part yet (3
  /// ranks: the folded rank reads its partner's result last).
  virtual void postSmallFailure(uint64_t completedThrough) { (void)completedThrough; }

  /// Point-to-point messages outside the chunk protocol (shm: kMessageBoxes boxes per direction
  /// in the shared segment): messages of at most messageBoxBytes() (0: none, the default).
  /// Each direction numbers its box uses 1, 2, ... in posting order; the receiver polls use s,
  /// copies the payload out and takes it, which frees the box for use s + boxes().
  virtual size_t messageBoxBytes() const { return 0; }
  /// Posts use `sequence`; false while its box still holds an earlier use the peer has not
  /// taken (nothing written).
  virtual bool postBox(uint64_t sequence,
                       uint32_t ordinal,
                       uint32_t dtype,
                       uint64_t count,
                       const void* data,
                       uint32_t bytes) {
    (void)sequence;
    (void)ordinal;
    (void)dtype;
    (void)count;
    (void)data;
    (void)bytes;
    return false;
  }
  virtual BoxPoll pollBox(uint64_t sequence, BoxArrival* out) {
    (void)sequence;
    (void)out;
    return BoxPoll::kFailed;
  }
  /// The receiver is done with use `sequence` (its payload copied out).
  virtual void takeBox(uint64_t sequence) { (void)sequence; }
  /// Whether the peer took our use `sequence`.
  virtual bool boxTaken(uint64_t sequence) const {
    (void)sequence;
    return false;
  }
  /// The receive of use `sequence` is posted, expecting message `ordinal` of `count` elements
  /// of `dtype`: its sender may complete that message before the take (boxAccepted). False
  /// when the box's previous use is not taken yet (nothing written: ask again later).
  virtual bool expectBox(uint64_t sequence, uint32_t ordinal, uint32_t dtype, uint64_t count) {
    (void)sequence;
    (void)ordinal;
    (void)dtype;
    (void)count;
    return false;
  }
  /// Whether the peer took our use `sequence` or expects exactly this message in it (its
  /// receive agrees and the payload is in the box: the send is complete).
  virtual bool boxAccepted(uint64_t sequence,
                           uint32_t ordinal,
                           uint32_t dtype,
                           uint64_t count) const {
    (void)ordinal;
    (void)dtype;
    (void)count;
    return boxTaken(sequence);
  }
  /// A use from `firstSequence` on that the peer posted for message `ordinal`, if any: a
  /// receiver that expects that message in chunks finds out it came in a box (counts differ).
  virtual bool boxHolds(uint64_t firstSequence, uint32_t ordinal, BoxArrival* out) {
    (void)firstSequence;
    (void)ordinal;
    (void)out;
    return false;
  }

  /// Fills *out with the transport's view of the link; false when it has none (the default).
  /// Not on the data path: may make system calls.
  virtual bool linkInfo(LinkInfo* out) const {
    (void)out;
    return false;
  }
};

}  // namespace gs::transport
