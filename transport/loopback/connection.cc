#include "transport/loopback/connection.h"

#include <cstring>
#include <utility>

#include "common/error.h"
#include "common/log.h"

namespace gs::transport::loopback {

void failSide(Side& side, std::string message) {
  if (side.failed)
    return;
  side.failed = true;
  side.error = std::move(message);
  // Queued recvs and sends reference memory that is about to be reused; drop them.
  side.recvs.clear();
  side.incomingSends.clear();
  if (side.activity)
    side.activity->notify();
}

Connection::Connection(std::shared_ptr<Link> link, int side)
    : link_(std::move(link)), side_(side) {}

Connection::~Connection() {
  std::lock_guard lock(link_->mutex);
  failSide(me(), "connection closed locally");
  failSide(other(), formatString("peer rank %d closed the connection", me().rank));
}

int Connection::peer() const {
  return link_->sides[1 - side_].rank;
}

PostResult Connection::postWrite(std::span<const LocalSegment> segments,
                                 const RemoteKey& dst,
                                 uint64_t dstOffset,
                                 uint32_t imm,
                                 WorkId id) {
  std::lock_guard lock(link_->mutex);
  Side& self = me();
  Side& peerSide = other();
  if (self.failed)
    return PostResult::kError;
  if (segments.size() > kMaxSegments) {
    failSide(self, formatString("postWrite with %zu segments (at most %zu)", segments.size(),
                                kMaxSegments));
    return PostResult::kError;
  }
  if (self.completions.full() || peerSide.completions.full())
    return PostResult::kWouldBlock;
  uint64_t total = 0;
  for (const LocalSegment& s : segments)
    total += s.length;
  const uint32_t regionId = RegionTable::idOf(dst);
  bool inBounds = false;
  bool known = peerSide.regions->withRegion(regionId, [&](const RegionTable::Entry& region) {
    if (total > UINT32_MAX || dstOffset > region.size || total > region.size - dstOffset)
      return;
    inBounds = true;
    uint8_t* at = region.data + dstOffset;
    for (const LocalSegment& s : segments) {
      if (s.length)
        std::memcpy(at, s.data(), s.length);
      at += s.length;
    }
  });
  if (!known || !inBounds) {
    // The peer would see this as a hostile frame: fail its end like the tcp receiver does.
    std::string why = known
                          ? formatString("write of %llu bytes at offset %llu is outside region %u",
                                         static_cast<unsigned long long>(total),
                                         static_cast<unsigned long long>(dstOffset), regionId)
                          : formatString("region id %u is not registered", regionId);
    failSide(peerSide,
             formatString("peer rank %d sent an invalid frame: %s", self.rank, why.c_str()));
    failSide(self, formatString("rank %d rejected our write: %s", peerSide.rank, why.c_str()));
    return PostResult::kError;
  }
  peerSide.completions.push(
      Completion{0, CompletionKind::kRemoteWrite, Errc::kOk, imm, static_cast<uint32_t>(total)});
  self.completions.push(
      Completion{id, CompletionKind::kWrite, Errc::kOk, 0, static_cast<uint32_t>(total)});
  peerSide.activity->notify();
  return PostResult::kOk;
}

void Connection::deliverSend(const PendingOp& send,
                             const PendingOp& recv,
                             Side& sender,
                             Side& receiver) {
  if (send.segment.length > recv.segment.length) {
    std::string why = formatString("send of %zu bytes exceeds the posted receive buffer of %zu",
                                   send.segment.length, recv.segment.length);
    failSide(receiver,
             formatString("peer rank %d sent an invalid frame: %s", sender.rank, why.c_str()));
    failSide(sender, formatString("rank %d rejected our send: %s", receiver.rank, why.c_str()));
    return;
  }
  if (send.segment.length) {
    std::memcpy(const_cast<uint8_t*>(recv.segment.data()), send.segment.data(),
                send.segment.length);
  }
  const auto length = static_cast<uint32_t>(send.segment.length);
  receiver.completions.push(Completion{recv.id, CompletionKind::kRecv, Errc::kOk, 0, length});
  sender.completions.push(Completion{send.id, CompletionKind::kSend, Errc::kOk, 0, length});
  receiver.activity->notify();
  sender.activity->notify();
}

PostResult Connection::postSend(const LocalSegment& segment, WorkId id) {
  std::lock_guard lock(link_->mutex);
  Side& self = me();
  Side& peerSide = other();
  if (self.failed)
    return PostResult::kError;
  if (segment.length > UINT32_MAX) {
    failSide(self, formatString("postSend of %zu bytes (at most 4 GiB - 1)", segment.length));
    return PostResult::kError;
  }
  if (peerSide.recvs.empty()) {
    return peerSide.incomingSends.push(PendingOp{segment, id}) ? PostResult::kOk
                                                               : PostResult::kWouldBlock;
  }
  if (self.completions.full() || peerSide.completions.full())
    return PostResult::kWouldBlock;
  PendingOp recv = peerSide.recvs.front();
  peerSide.recvs.pop();
  deliverSend(PendingOp{segment, id}, recv, self, peerSide);
  return self.failed ? PostResult::kError : PostResult::kOk;
}

PostResult Connection::postRecv(const LocalSegment& segment, WorkId id) {
  std::lock_guard lock(link_->mutex);
  Side& self = me();
  Side& peerSide = other();
  if (self.failed)
    return PostResult::kError;
  if (self.incomingSends.empty()) {
    return self.recvs.push(PendingOp{segment, id}) ? PostResult::kOk : PostResult::kWouldBlock;
  }
  if (self.completions.full() || peerSide.completions.full())
    return PostResult::kWouldBlock;
  PendingOp send = self.incomingSends.front();
  self.incomingSends.pop();
  deliverSend(send, PendingOp{segment, id}, peerSide, self);
  return self.failed ? PostResult::kError : PostResult::kOk;
}

size_t Connection::poll(std::span<Completion> out) {
  std::lock_guard lock(link_->mutex);
  Side& self = me();
  size_t n = 0;
  while (n < out.size() && !self.completions.empty()) {
    out[n++] = self.completions.front();
    self.completions.pop();
  }
  if (self.failed && !self.errorReported && n < out.size()) {
    self.errorReported = true;
    out[n++] = Completion{0, CompletionKind::kError, Errc::kRemote, 0, 0};
  }
  return n;
}

std::string Connection::errorMessage() const {
  std::lock_guard lock(link_->mutex);
  const Side& self = link_->sides[side_];
  return self.failed ? self.error : std::string();
}

}  // namespace gs::transport::loopback
