#pragma once

// "Receive posted" notices of point-to-point messages: a rank that posts a small receive tells
// the sender at once which of its messages it matches (its number among the sender's messages
// to this rank) and with what count and dtype, in one kControl imm. A small send then
// completes once its bytes have left the buffer and that notice agrees with it, instead of
// once the receiver has taken the message and its credits came back: where both ends post
// their halves together (sendrecv, pipeline stages), the notice travels while the data does,
// and a send costs one crossing instead of a round trip. A notice that disagrees fails the
// send naming both counts, as the receiver does: a mismatch still fails on both ranks.
//
// Notices are an optimisation only: a receive not announced (a full queue, a large receive, too
// far ahead) leaves its send to complete on its credits, which the receiver then returns at
// once; a late notice for a send completed already is dropped. A notice that was sent is never
// dropped while its send is incomplete (PostedReceives), so the credits the receiver holds for
// an announced message never strand its sender.
#include <cstdint>
#include <optional>
#include <vector>

#include "common/types.h"

namespace gs::stream {

/// Messages up to this size may complete on a notice: the latency-bound ones, whose count fits
/// the notice's 15 bits for every dtype. (A send's writes complete only once its bytes are out
/// of its buffer, single-copy chunks included, so the bound is not what makes it safe.)
inline constexpr uint64_t kEagerMessageBytes = 32 << 10;

/// What a notice says about one receive.
struct PostedReceive {
  uint32_t ordinal = 0;  // the receive's number among this pair's messages (mod 2^10 on the wire)
  uint32_t count = 0;    // elements, < kMaxCount
  DataType dtype = DataType::kFloat32;

  static constexpr uint32_t kOrdinalBits = 10, kDtypeBits = 3, kCountBits = 15;
  static constexpr uint32_t kMaxCount = 1u << kCountBits;

  /// Whether a receive (or a send) of this shape takes part: small enough to be announced.
  static bool eligible(uint64_t count, DataType dtype) {
    return count < kMaxCount && count * elementSize(dtype) <= kEagerMessageBytes;
  }
  /// The 28 low bits of the kControl payload (Link's kPostedReceiveBit set by the caller).
  uint32_t pack() const {
    return ((ordinal & ((1u << kOrdinalBits) - 1)) << (kDtypeBits + kCountBits)) |
           (static_cast<uint32_t>(dtype) << kCountBits) | count;
  }
  static PostedReceive unpack(uint32_t bits) {
    PostedReceive p;
    p.count = bits & (kMaxCount - 1);
    p.dtype = static_cast<DataType>((bits >> kCountBits) & ((1u << kDtypeBits) - 1));
    p.ordinal = (bits >> (kDtypeBits + kCountBits)) & ((1u << kOrdinalBits) - 1);
    return p;
  }
};

/// The notices a sender holds for its messages to one peer, by message number. A receiver
/// announces only receives fewer than kWindow ahead of the last one it completed, and a sender
/// keeps a notice only for its messages fewer than kAccept ahead of its oldest incomplete one:
/// a 10-bit ordinal then names one message, and a late notice for a message already completed
/// on its credits is dropped (tcp spreads a connection over sockets, so notices may overtake
/// each other and credits). The receiver of an announced message holds its credits until its
/// next batch or idle round, so a notice must not be dropped for being too far ahead: a sender
/// completes its sends to each peer in order as their notices and credits come, whatever its
/// messages to other peers wait for (MessageRun::completeSends), and the receiver completes a
/// receive only after its chunks arrived, which the sender posted with credits for all but the
/// last slots (at most 64): the receiver is never more than 64 + 64 messages ahead of the
/// sender's oldest incomplete one, well inside kAccept.
class PostedReceives {
 public:
  static constexpr uint32_t kWindow = 64;
  static constexpr uint32_t kAccept = 512;
  static constexpr uint32_t kSlots = 1u << PostedReceive::kOrdinalBits;

  /// Keeps a notice (unpacked) if it names a message at or after `oldestIncomplete`.
  void note(const PostedReceive& p, uint32_t oldestIncomplete) {
    if (!isValid(p.dtype))
      return;  // from the network: a notice that cannot be one is ignored, as a lost one
    const uint32_t ahead = (p.ordinal - oldestIncomplete) & (kSlots - 1);
    if (ahead >= kAccept)
      return;  // for a message completed already
    if (slots_.empty())
      slots_.assign(kSlots, Entry{});
    slots_[p.ordinal & (kSlots - 1)] = Entry{true, p.count, p.dtype};
  }
  /// The notice for message `ordinal`, if one came; it is forgotten (the message is done).
  std::optional<PostedReceive> take(uint32_t ordinal) {
    if (slots_.empty())
      return std::nullopt;
    Entry& e = slots_[ordinal & (kSlots - 1)];
    if (!e.present)
      return std::nullopt;
    PostedReceive p{ordinal, e.count, e.dtype};
    e = Entry{};
    return p;
  }
  /// Forgets message `ordinal`'s notice, if any (it completed on its credits).
  void drop(uint32_t ordinal) {
    if (!slots_.empty())
      slots_[ordinal & (kSlots - 1)] = Entry{};
  }

 private:
  struct Entry {
    bool present = false;
    uint32_t count = 0;
    DataType dtype = DataType::kFloat32;
  };
  std::vector<Entry> slots_;  // allocated at the first notice
};

}  // namespace gs::stream
