#pragma once

// Layouts of what the shm backend shares between processes: the address blob (through the
// rendezvous), a device's control segment and a connection's segment. Everything a peer
// wrote is untrusted: readers copy a field once and validate it before use. Shared words are
// plain integers accessed through std::atomic_ref (lock-free, address-free on Linux), so a
// zero-filled segment is a valid initial state.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/auth.h"

namespace gs::transport::shm {

inline constexpr uint16_t kWireVersion = 6;

/// What Device::address() publishes. Native byte order: it never leaves the host.
struct AddressBlob {
  static constexpr uint32_t kMagic = 0x4d535347;  // "GSSM"
  uint32_t magic = kMagic;
  uint16_t version = kWireVersion;
  uint16_t reserved = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  uint64_t token = 0;  // the device's random token (also in its control segment)
  // The shared-memory domain: ranks connect over shm only when all three match.
  uint8_t bootId[16] = {};    // /proc/sys/kernel/random/boot_id
  uint64_t pidNamespace = 0;  // inode of /proc/self/ns/pid (peers' pids must mean the same)
  uint64_t shmDevice = 0;     // st_dev of /dev/shm (the mount the segments live in)
  char prefix[40] = {};       // NUL-terminated name prefix of the device's segments
  // Where `token` lies in the owner's memory: a peer that reads it there with
  // process_vm_readv may read the owner's payloads the same way (single copy).
  uint64_t probeAddress = 0;
};
static_assert(sizeof(AddressBlob) == 104);

/// A device's control segment ("<prefix>-ctl"): identity, a proof that its owner holds the
/// communicator secret, and the doorbell peers ring after queueing work for it.
struct ControlBlock {
  static constexpr uint32_t kMagic = 0x4c435347;  // "GSCL"
  uint32_t magic;
  uint32_t version;
  uint64_t token;
  AuthTag proof;  // authTag(secret, "gs-shm-device", token)
  int32_t rank;
  int32_t pid;
  alignas(64) uint32_t doorbell;  // futex word: bumped by whoever has news for the owner
  uint32_t waiters;               // owner threads about to sleep on the doorbell
  uint32_t closed;                // 1 once the owner's device is gone
};

/// A one-sided write landed (kWrite), or the sender of this notice refuses what its peer did
/// (kReject: the connection fails on both sides). Its sender writes the fields, then stores
/// `sequence` (release): the queue position plus one. A receiver polls the next slot's
/// sequence, so a notice costs it one cache line from the sender's core, not two (a tail word
/// and the slot): where ranks outnumber cores every poll after a switch pays such misses.
enum class NoticeKind : uint32_t { kWrite = 1, kReject = 2 };
enum class RejectReason : uint32_t { kSendTooLong = 1, kBadWrite = 2 };
struct Notice {
  uint32_t kind;
  uint32_t imm;
  uint32_t length;
  uint32_t reason;    // kReject: a RejectReason
  uint64_t detail;    // kReject: the receive buffer's length, or the refused write's offset
  uint64_t sequence;  // position in the queue + 1 (0: the slot was never written)
};
static_assert(sizeof(Notice) == 32);

inline constexpr size_t kNotices = 1024;       // notices in flight per direction
inline constexpr size_t kMessages = 16;        // two-sided sends in flight per direction
inline constexpr size_t kMessageBytes = 4096;  // the largest two-sided send

struct Message {
  uint32_t length;
  uint32_t reserved[15];
  uint8_t data[kMessageBytes];
};

/// A mailbox of the small-exchange path (transport::Connection::postSmall): its sender writes
/// the payload, tag and length, then stores `sequence` (release); the receiver acquires
/// `sequence`, then reads and validates the rest. Two per direction, used alternately.
inline constexpr size_t kSmallBytes = 16384;
struct SmallBox {
  alignas(64) uint64_t sequence;  // the exchange this box holds; 0: none yet
  uint64_t tag;                   // the sender's call (kind, dtype, op, count): must match ours
  uint32_t bytes;
  alignas(64) uint8_t data[kSmallBytes];
};

/// A message box of the point-to-point path (transport::Connection::postBox): small messages
/// between a pair outside the chunk protocol. Its sender writes the message's number on the
/// pair, dtype, count and payload, then stores `sequence` (release); the receiver acquires
/// `sequence`, copies the payload out, validated, and stores `sequence` into the box's `taken`
/// word (release), which frees the box: the sender reuses box b for sequence s + kMessageBoxes
/// only once taken[b] == s.
inline constexpr size_t kMessageBoxes = 4;
inline constexpr size_t kMessageBoxBytes = 4096;
struct MessageBox {
  alignas(64) uint64_t sequence;  // the box's use on this direction (1, 2, ...); 0: none yet
  uint32_t ordinal;               // the message's number among the pair's messages (mod 2^32)
  uint32_t dtype;
  uint64_t count;
  uint32_t bytes;
  alignas(64) uint8_t data[kMessageBoxBytes];
};

/// The receiver's words on one of its sender's boxes, in the sender's half. `taken`: the last
/// use it took (the box is free again). `expected`: the use its next receive from this box
/// waits for, described by ordinal, dtype and count (0: none): a sender whose message agrees
/// completes its send at once, without waiting for the take, and a sendrecv's exchange costs
/// one crossing of the pair instead of two. The receiver writes a use's expectation only once
/// the box's previous use is taken, as a seqlock (`expected` 0, the description, then the
/// use: release), and the sender reads it back to front (Connection::boxAccepted).
struct BoxReceipt {
  uint64_t taken;
  uint64_t expected;
  uint32_t ordinal;
  uint32_t dtype;
  uint64_t count;
};
static_assert(sizeof(BoxReceipt) == 32);

/// Who a connection's side is: written once by its owner, then `state` set to 1 (release).
struct Hello {
  uint32_t state;  // 0 nothing yet, 1 valid
  int32_t rank;
  int32_t pid;
  uint32_t readsPeerMemory;  // 1: this side read its peer's probe (AddressBlob::probeAddress)
  uint64_t token;
  AuthTag proof;  // authTag(secret, "gs-shm-hello", dialer token, acceptor token, ranks)
};

/// One direction of a connection, written by its sender except for the two heads, which the
/// receiver advances as it consumes. Indices are free-running counters.
struct Half {
  Hello hello;
  uint32_t closed;  // 1 once the sender's end of the connection is gone
  alignas(64) uint64_t noticeHead;
  alignas(64) uint64_t messageTail;
  alignas(64) uint64_t messageHead;
  alignas(64) Notice notices[kNotices];
  Message messages[kMessages];
  // 0, or the sender failed (postSmallFailure; sticky) having completed the exchanges before
  // this sequence: those stand, the others fail.
  alignas(64) uint64_t smallFailed;
  SmallBox small[2];                // exchange s in small[s % 2]
  MessageBox boxes[kMessageBoxes];  // box use s in boxes[(s - 1) % kMessageBoxes]
  // Written by the receiver, per box: what it took and what its posted receive expects.
  alignas(64) BoxReceipt receipts[kMessageBoxes];
};

/// A connection's segment ("<dialer prefix>-c<acceptor rank>", created by the dialer, the
/// higher rank). halves[0] carries what the lower rank sends, halves[1] the higher rank's.
struct ConnectionBlock {
  static constexpr uint32_t kMagic = 0x4e435347;  // "GSCN"
  uint32_t magic;
  uint32_t version;
  alignas(64) Half halves[2];
};

/// The key of a region peers may write into (Device::allocateRegion): its id and the token of
/// the device that made it. Regions from registerMemory have an empty key.
struct RegionKey {
  static constexpr uint32_t kMagic = 0x4b525347;  // "GSRK"
  uint32_t magic = kMagic;
  uint32_t id = 0;
  uint64_t token = 0;
};
static_assert(sizeof(RegionKey) == 16);

// Words of a segment the peer writes too, read and written whole (the order names the fence).
template <class T>
T loadWord(T& word, std::memory_order order) {
  return std::atomic_ref<T>(word).load(order);
}
template <class T>
void storeWord(T& word, T value, std::memory_order order) {
  std::atomic_ref<T>(word).store(value, order);
}
template <class T>
T loadAcquire(T& word) {
  return loadWord(word, std::memory_order_acquire);
}
template <class T>
void storeRelease(T& word, T value) {
  storeWord(word, value, std::memory_order_release);
}
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

}  // namespace gs::transport::shm
