#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stream/failure_notice.h"
#include "stream/posted_receive.h"
#include "transport/device.h"

namespace gs::stream {

/// Layout of the receive slots every rank keeps for each peer that sends to it.
struct SlotLayout {
  size_t slots = 8;  // chunks in flight per direction
  size_t chunkBytes = 1 << 20;
  /// Bytes per slot: chunk header plus chunk plus room for a codec's metadata (at most 4 KiB,
  /// codecs/codec.h), rounded up to a page.
  size_t slotBytes() const { return (64 + chunkBytes + 4096 + 4095) / 4096 * 4096; }
  /// After the slots, one page for a failure notice (stream/failure_notice.h): where an abort
  /// message's cause lands, so it never overwrites a chunk being reduced.
  static constexpr size_t kNoticeBytes = 4096;
  size_t noticeOffset() const { return slots * slotBytes(); }
  size_t regionBytes() const { return noticeOffset() + kNoticeBytes; }
};

/// Imm encoding of the messages of the chunk protocol (32 bits): the top 2 bits say what it is.
///   kData:    low bits = receive slot index the chunk landed in
///   kCredit:  low 30 bits = cumulative number of chunks the receiver has released (mod 2^30)
///   kAbort:   low bits = rank at fault (the collective is abandoned); a write of non-zero
///             length carries a failure notice (cause, detecting rank) at the notice offset
///   kControl: low bits = a ControlCode
enum class ImmTag : uint32_t { kData = 0, kCredit = 1, kAbort = 2, kControl = 3 };
///   kBye:  the sender has finished all its collectives and is closing the communicator
///   kPing: "are you alive?" from a rank whose collective stopped progressing; any rank running
///          a collective answers kPong at once, so a rank that does not is the one stopped
enum class ControlCode : uint32_t { kBye = 0, kPing = 1, kPong = 2 };
inline constexpr uint32_t kImmPayloadMask = (1u << 30) - 1;
/// kControl with this bit set: a read acknowledgement. The low 29 bits are the cumulative number
/// of chunks left in the sender's memory (format::kChunkFlagPeerMemory) that the receiver has
/// copied out (mod 2^29); the sender's buffer is free up to there.
inline constexpr uint32_t kReadAckBit = 1u << 29;
inline constexpr uint32_t kReadAckMask = kReadAckBit - 1;
/// kControl with this bit set (and kReadAckBit clear): a receive posted for one of the peer's
/// messages, its low 28 bits a PostedReceive (stream/posted_receive.h).
inline constexpr uint32_t kPostedReceiveBit = 1u << 28;
inline constexpr uint32_t kPostedReceiveMask = kPostedReceiveBit - 1;
inline uint32_t makeImm(ImmTag tag, uint32_t payload) {
  return (static_cast<uint32_t>(tag) << 30) | (payload & kImmPayloadMask);
}
inline ImmTag immTag(uint32_t imm) {
  return static_cast<ImmTag>(imm >> 30);
}
inline uint32_t makeControl(ControlCode code) {
  return makeImm(ImmTag::kControl, static_cast<uint32_t>(code));
}
inline bool isControl(uint32_t imm, ControlCode code) {
  return imm == makeControl(code);
}

/// State of the chunk protocol with one peer, both directions, kept for the communicator's
/// lifetime: receive slots (registered, written by the peer), staging for outgoing chunk
/// headers, sequence numbers and credits. Sequence numbers run on across collectives, so a
/// peer may start the next collective while this rank finishes the current one.
/// Owned by the communicator; used by one thread at a time (the one running a collective).
class Link {
 public:
  Link(int peer, transport::Device& device, const SlotLayout& layout);

  int peer() const { return peer_; }
  /// The device serving this peer (its connection, slots and staging belong to it).
  transport::Device& device() const { return *device_; }
  const SlotLayout& layout() const { return layout_; }

  /// Key of this rank's receive slots for the peer (travels through the rendezvous).
  transport::RemoteKey recvSlotsKey() const { return recvSlotsMr_->remoteKey(); }
  void attach(std::unique_ptr<transport::Connection> connection,
              const transport::RemoteKey& peerSlots);

  transport::Connection& connection() { return *connection_; }
  bool connected() const { return connection_ != nullptr; }

  // Receive side.
  uint8_t* slot(size_t index) {
    return static_cast<uint8_t*>(recvSlotsMr_->data()) + index * layout_.slotBytes();
  }
  const transport::MemoryRegion& recvSlotsRegion() const { return *recvSlotsMr_; }
  size_t slotOf(uint64_t sequence) const { return sequence % layout_.slots; }
  std::vector<uint32_t> arrivedBytes;  // per slot; kNotArrived when empty
  std::vector<uint8_t> slotInUse;      // per slot: arrived and not yet released (credited)
  std::vector<uint8_t> landedInPlace;  // per slot: its payload is at its receive's dst (tcp)
  static constexpr uint32_t kNotArrived = 0xffffffffu;
  uint64_t recvSequence = 0;  // next chunk sequence expected from the peer
  uint64_t released = 0;      // chunks released back to the peer (cumulative)
  uint64_t creditAdvertised = 0;

  // Send side.
  transport::RemoteKey peerSlots;
  uint64_t sendSequence = 0;  // next chunk sequence to send
  uint64_t peerReleased = 0;  // credits: chunks the peer has released
  /// Staging of each slot's outgoing header, and after it the PeerMemoryRef of a chunk left in
  /// our memory (format::kChunkFlagPeerMemory).
  static constexpr size_t kHeaderStride = 128;
  uint8_t* headerStaging(size_t index) { return headers_.get() + index * kHeaderStride; }
  /// A failure notice being sent (SlotLayout::kNoticeBytes, in headerRegion() after the
  /// headers).
  uint8_t* noticeStaging() { return headers_.get() + noticeStagingOffset(); }
  size_t noticeStagingOffset() const { return layout_.slots * kHeaderStride; }
  /// The failure notice the peer wrote (valid once a kAbort write of non-zero length arrived).
  const uint8_t* notice() {
    return static_cast<const uint8_t*>(recvSlotsMr_->data()) + layout_.noticeOffset();
  }
  const transport::MemoryRegion& headerRegion() const { return *headersMr_; }
  std::vector<uint8_t> headerBusy;  // per slot: a posted write still reads its header
  // Outgoing encoded chunks (header + metadata + payload), one slot-sized buffer per slot;
  // allocated and registered on the first compressed collective (raw sends need none: the
  // payload goes straight from the user's buffer).
  void ensureEncodeStaging();
  uint8_t* encodeStaging(size_t index) { return encode_.get() + index * layout_.slotBytes(); }
  const transport::MemoryRegion& encodeRegion() const { return *encodeMr_; }

  /// Applies a credit message's 30-bit cumulative count. Credit messages may overtake each
  /// other (several sockets or QPs carry them), so an older count is ignored.
  void applyCredit(uint32_t payload) { advance(peerReleased, payload, kImmPayloadMask); }
  /// Single copy (shm): chunks this rank left in its memory for the peer to copy out, and how
  /// many of them the peer has acknowledged (a send completes only then); chunks this rank
  /// copied out of the peer's memory, and how many of them it has acknowledged.
  uint64_t peerReadsPosted = 0;
  uint64_t peerReadsDone = 0;
  uint64_t readsFromPeer = 0;
  uint64_t readsAcknowledged = 0;
  void applyReadAck(uint32_t payload) { advance(peerReadsDone, payload, kReadAckMask); }

  /// Point-to-point messages to and from the peer completed so far (each direction numbers its
  /// messages from 0, as Engine::messagesSent_ / messagesReceived_), and the notices of
  /// receives the peer posted for ours (stream/posted_receive.h).
  uint32_t messagesSentDone = 0;
  uint32_t messagesReceivedDone = 0;
  PostedReceives postedReceives;
  /// Of those, the ones that travel in the connection's message boxes (MessageRun): box uses
  /// assigned so far to sends to the peer and to receives from it (each direction 1, 2, ...).
  uint64_t boxesPosted = 0;
  uint64_t boxesReceived = 0;

  /// The latest small exchange posted on this link (transport::Connection::postSmall).
  uint64_t smallSequence = 0;
  // The last of them whose call completed here (Engine::countSmall): a failure after it
  // leaves the peer those (transport::Connection::postSmallFailure).
  uint64_t smallSequenceDone = 0;

  bool byeReceived = false;
  bool abortReceived = false;  // the peer sent an abort message (Engine::notifyPeers waits for it)
  /// What that abort message said (valid once abortReceived): a run that still completes with
  /// what arrived before it keeps it for the communicator's next call (Engine::deferredAbort_).
  FailureNotice abortNotice;
  /// Completions that arrived on the connection while it was being set up (a peer that is
  /// ready first may already send chunks or credits while this rank still waits for the end of
  /// the slot-key exchange); the engine handles them before polling the connection.
  std::vector<transport::Completion> earlyCompletions;

  // Goodput accounting (bytes sent while collectives ran / that busy time), published about
  // every 100 ms so one tiny collective does not overwrite what a large one measured.
  uint64_t goodputBytes = 0;
  uint64_t goodputBusyNs = 0;
  uint64_t goodputPublishedNs = 0;

  bool hasCredit() const { return sendSequence - peerReleased < layout_.slots; }

 private:
  // A cumulative count carried modulo mask + 1: moves `count` forward to it; an older value
  // (messages may overtake each other) is ignored.
  static void advance(uint64_t& count, uint32_t payload, uint32_t mask) {
    const uint32_t delta = (payload - static_cast<uint32_t>(count)) & mask;
    if (delta < (mask >> 1))
      count += delta;
  }

  struct FreeDeleter {
    void operator()(uint8_t* p) const noexcept;
  };

  int peer_;
  transport::Device* device_;
  SlotLayout layout_;
  std::unique_ptr<uint8_t, FreeDeleter> headers_;
  std::unique_ptr<transport::MemoryRegion> recvSlotsMr_;  // owns the slots (Device::allocateRegion)
  std::unique_ptr<transport::MemoryRegion> headersMr_;
  std::unique_ptr<uint8_t, FreeDeleter> encode_;
  std::unique_ptr<transport::MemoryRegion> encodeMr_;
  std::unique_ptr<transport::Connection> connection_;
};

}  // namespace gs::stream
